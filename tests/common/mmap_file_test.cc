// MmapFile: a file mapped or copied into the process gives the same bytes and the same errors.
#include "common/mmap_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "tests/common/test_util.h"

namespace pw {
namespace {

using ::testing::HasSubstr;
using pw::testing::TempDir;
using pw::testing::WriteFile;

TEST(MmapFileTest, MappedAndCopiedGiveTheSameBytes) {
  TempDir tmp;
  std::string bytes(3 * 1000 * 1000 + 17, '\0');  // over one 2 MiB page, not a multiple of it
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>((i * 131 + 7) & 0xff);
  const std::string path = tmp.File("blob");
  WriteFile(path, bytes);
  for (FileLoad load : {FileLoad::kMap, FileLoad::kCopy}) {
    auto f = MmapFile::Open(path, load);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    ASSERT_EQ((*f)->size(), bytes.size());
    EXPECT_EQ(std::memcmp((*f)->data(), bytes.data(), bytes.size()), 0);
    EXPECT_EQ((*f)->path(), path);
  }
  auto copy = MmapFile::Open(path, FileLoad::kCopy);
  ASSERT_TRUE(copy.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*copy)->data()) % (2u << 20), 0u) << "copy is 2 MiB aligned";
}

TEST(MmapFileTest, EmptyMissingAndDirectoryAreTheSameEitherWay) {
  TempDir tmp;
  WriteFile(tmp.File("empty"), "");
  for (FileLoad load : {FileLoad::kMap, FileLoad::kCopy}) {
    auto e = MmapFile::Open(tmp.File("empty"), load);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    EXPECT_EQ((*e)->data(), nullptr);
    EXPECT_EQ((*e)->size(), 0u);
    auto missing = MmapFile::Open(tmp.File("none"), load);
    ASSERT_FALSE(missing.ok());
    EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
    EXPECT_THAT(missing.status().message(), HasSubstr("none"));
    auto dir = MmapFile::Open(tmp.path(), load);
    ASSERT_FALSE(dir.ok());
    EXPECT_EQ(dir.status().code(), StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace pw
