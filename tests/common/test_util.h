// Helpers shared by the common/ tests: a per-test temporary directory and file writers.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace pw::testing {

// A fresh directory under TMPDIR, removed with its contents when the object dies.
class TempDir {
 public:
  TempDir() {
    const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string base = std::filesystem::temp_directory_path().string() + "/pw_" +
                       (info ? std::string(info->test_suite_name()) + "_" + info->name() : "t") +
                       "_" + std::to_string(::getpid()) + "_XXXXXX";
    path_ = mkdtemp(base.data()) ? base : std::string();
    EXPECT_FALSE(path_.empty()) << "mkdtemp failed";
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << path;
}

}  // namespace pw::testing
