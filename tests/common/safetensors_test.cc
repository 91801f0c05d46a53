#include "common/formats/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "tests/common/test_util.h"

namespace pw {
namespace {

using pw::testing::TempDir;
using pw::testing::WriteFile;
using ::testing::HasSubstr;

// A safetensors image from a raw JSON header and `data_bytes` bytes of data (values 0,1,2...).
std::string Image(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  out += header;
  for (size_t i = 0; i < data_bytes; ++i) out.push_back(static_cast<char>(i & 0xff));
  return out;
}

Result<SafetensorsHeader> Parse(const std::string& image) {
  return ParseSafetensorsHeader(reinterpret_cast<const uint8_t*>(image.data()), image.size(),
                                "x.safetensors");
}

// Expects `image` to be refused with `code` and a message containing each of `parts`.
void ExpectRejected(const std::string& image, StatusCode code,
                    std::initializer_list<std::string> parts) {
  auto r = Parse(image);
  ASSERT_FALSE(r.ok()) << "accepted a bad header";
  EXPECT_EQ(r.status().code(), code) << r.status().ToString();
  EXPECT_THAT(r.status().message(), HasSubstr("x.safetensors"));
  for (const auto& p : parts) EXPECT_THAT(r.status().message(), HasSubstr(p));
}

TEST(SafetensorsTest, WriterReaderRoundTrip) {
  TempDir tmp;
  SafetensorsWriter w;
  std::vector<uint16_t> bf(6);
  for (size_t i = 0; i < bf.size(); ++i) bf[i] = F32ToBf16(static_cast<float>(i) * 0.5f);
  std::vector<float> f32 = {1.5f, -2.0f, 3.25f};
  int64_t scalar = 42;
  ASSERT_TRUE(w.Add("b.weight", DType::kBF16, {2, 3}, bf.data(), bf.size() * 2).ok());
  ASSERT_TRUE(w.Add("a.bias", DType::kF32, {3}, f32.data(), f32.size() * 4).ok());
  ASSERT_TRUE(w.Add("step", DType::kI64, {}, &scalar, 8).ok());
  ASSERT_TRUE(w.Add("empty", DType::kF32, {0, 4}, nullptr, 0).ok());
  ASSERT_TRUE(w.AddLazy("lazy", DType::kU8, {5}, [](uint8_t* d, size_t n) {
                 for (size_t i = 0; i < n; ++i) d[i] = static_cast<uint8_t>(10 + i);
               }).ok());
  w.SetMetadata("format", "pt");
  const std::string path = tmp.File("m.safetensors");
  ASSERT_TRUE(w.Write(path).ok());

  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->TensorNames(),
            (std::vector<std::string>{"a.bias", "b.weight", "empty", "lazy", "step"}));
  EXPECT_EQ((*f)->metadata().at("format"), "pt");

  auto b = (*f)->Get("b.weight");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->dtype, DType::kBF16);
  EXPECT_EQ(b->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(b->numel(), 6);
  ASSERT_EQ(b->nbytes, 12u);
  EXPECT_EQ(std::memcmp(b->data, bf.data(), 12), 0);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data) % 2, 0u);

  auto a = (*f)->Get("a.bias");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(std::memcmp(a->data, f32.data(), 12), 0);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data) % 4, 0u);

  auto s = (*f)->Get("step");
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->shape.empty());
  EXPECT_EQ(s->numel(), 1);
  int64_t got;
  std::memcpy(&got, s->data, 8);
  EXPECT_EQ(got, 42);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(s->data) % 8, 0u);

  auto e = (*f)->Get("empty");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->nbytes, 0u);
  EXPECT_EQ(e->numel(), 0);

  auto l = (*f)->Get("lazy");
  ASSERT_TRUE(l.ok());
  ASSERT_EQ(l->nbytes, 5u);
  EXPECT_EQ(l->data[4], 14);

  auto missing = (*f)->Get("nope");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("missing tensor 'nope' in " + path));
}

TEST(SafetensorsTest, WriterRefusesBadTensors) {
  SafetensorsWriter w;
  float x[2] = {0, 0};
  EXPECT_FALSE(w.Add("", DType::kF32, {2}, x, 8).ok());
  EXPECT_FALSE(w.Add("__metadata__", DType::kF32, {2}, x, 8).ok());
  EXPECT_FALSE(w.Add("a", DType::kF32, {3}, x, 8).ok());   // byte count mismatch
  EXPECT_FALSE(w.Add("a", DType::kF32, {-2}, x, 8).ok());  // negative dim
  ASSERT_TRUE(w.Add("a", DType::kF32, {2}, x, 8).ok());
  EXPECT_FALSE(w.Add("a", DType::kF32, {2}, x, 8).ok());  // duplicate
}

TEST(SafetensorsTest, WriterFailsCleanlyOnUnwritablePath) {
  SafetensorsWriter w;
  Status s = w.Write("/nonexistent-dir-pw/x.safetensors");
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_THAT(s.message(), HasSubstr("/nonexistent-dir-pw/x.safetensors"));
}

TEST(SafetensorsTest, AcceptsHandWrittenHeaderWithMetadataAndPadding) {
  std::string h =
      R"({"__metadata__":{"format":"pt"},"w":{"dtype":"F16","shape":[2,2],"data_offsets":[0,8]}})"
      "    ";
  auto r = Parse(Image(h, 8));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->tensors.size(), 1u);
  EXPECT_EQ(r->tensors[0].offset, 8 + h.size());
  EXPECT_EQ(r->metadata.at("format"), "pt");
}

TEST(SafetensorsTest, RejectsTooShortFiles) {
  ExpectRejected("", StatusCode::kCorrupt, {"too short"});
  ExpectRejected(std::string(7, '\0'), StatusCode::kCorrupt, {"too short"});
}

TEST(SafetensorsTest, RejectsHeaderLengthBeyondFile) {
  std::string img = Image(R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 4);
  img[0] = static_cast<char>(0xf0);  // claims more than the file holds
  ExpectRejected(img, StatusCode::kCorrupt, {"exceeds the file size"});
}

TEST(SafetensorsTest, RejectsHeaderLengthOverCap) {
  std::string img(16, '\0');
  img[7] = 0x7f;  // ~9e18
  ExpectRejected(img, StatusCode::kCorrupt, {"exceeds the cap"});
}

TEST(SafetensorsTest, RejectsHeaderLengthShorterThanJson) {
  std::string h = R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})";
  std::string img = Image(h, 4);
  img[0] = static_cast<char>(h.size() - 5);  // JSON cut short
  ExpectRejected(img, StatusCode::kCorrupt, {"not valid JSON"});
}

TEST(SafetensorsTest, RejectsTruncatedDataSection) {
  std::string img = Image(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 16);
  img.resize(img.size() - 3);
  ExpectRejected(img, StatusCode::kCorrupt, {"'w'", "exceed the data section"});
}

TEST(SafetensorsTest, RejectsMalformedJson) {
  ExpectRejected(Image("{not json}", 0), StatusCode::kCorrupt, {"not valid JSON"});
  ExpectRejected(Image("[1,2,3]", 0), StatusCode::kCorrupt, {"not a JSON object"});
  ExpectRejected(Image(R"({"w":[1]})", 0), StatusCode::kCorrupt, {"'w'", "not a JSON object"});
  ExpectRejected(Image(std::string(100, '[') + std::string(100, ']'), 0), StatusCode::kCorrupt,
                 {"nested deeper"});
  ExpectRejected(Image(std::string(1000000, '['), 0), StatusCode::kCorrupt, {"nested deeper"});
}

TEST(SafetensorsTest, RejectsDuplicateTensorNames) {
  ExpectRejected(Image(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                       R"("w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                       2),
                 StatusCode::kCorrupt, {"duplicate key 'w'"});
}

TEST(SafetensorsTest, RejectsBadFields) {
  ExpectRejected(Image(R"({"w":{"shape":[1],"data_offsets":[0,1]}})", 1), StatusCode::kCorrupt,
                 {"'w'", "'dtype'"});
  ExpectRejected(Image(R"({"w":{"dtype":"F8_E5M2","shape":[1],"data_offsets":[0,1]}})", 1),
                 StatusCode::kUnsupported, {"'w'", "unknown dtype 'F8_E5M2'"});
  ExpectRejected(Image(R"({"w":{"dtype":"U8","data_offsets":[0,1]}})", 1), StatusCode::kCorrupt,
                 {"'w'", "'shape'"});
  ExpectRejected(Image(R"({"w":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}})", 1),
                 StatusCode::kCorrupt, {"'w'", "shape[0]"});
  ExpectRejected(Image(R"({"w":{"dtype":"U8","shape":[1.5],"data_offsets":[0,1]}})", 1),
                 StatusCode::kCorrupt, {"'w'", "shape[0]"});
  ExpectRejected(Image(R"({"w":{"dtype":"U8","shape":[18446744073709551615],)"
                       R"("data_offsets":[0,1]}})",
                       1),
                 StatusCode::kCorrupt, {"'w'", "shape[0]"});
  ExpectRejected(Image(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,4],)"
                       R"("data_offsets":[0,1]}})",
                       1),
                 StatusCode::kCorrupt, {"'w'", "overflows"});
  ExpectRejected(Image(R"({"w":{"dtype":"U8","shape":[1]}})", 1), StatusCode::kCorrupt,
                 {"'w'", "'data_offsets'"});
  ExpectRejected(Image(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0]}})", 1),
                 StatusCode::kCorrupt, {"'w'", "'data_offsets'"});
  ExpectRejected(Image(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,-1]}})", 1),
                 StatusCode::kCorrupt, {"'w'", "'data_offsets'"});
  ExpectRejected(Image(R"({"__metadata__":{"a":1}})", 0), StatusCode::kCorrupt, {"__metadata__.a"});
  ExpectRejected(Image(R"({"__metadata__":[]})", 0), StatusCode::kCorrupt, {"__metadata__"});
}

TEST(SafetensorsTest, RejectsOffsetsOutOfBoundsOrReversed) {
  ExpectRejected(Image(R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})", 4),
                 StatusCode::kCorrupt, {"'w'", "[2, 6)", "data section of 4 bytes"});
  ExpectRejected(Image(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[3,1]}})", 4),
                 StatusCode::kCorrupt, {"'w'", "begin > end"});
}

TEST(SafetensorsTest, RejectsSizeNotMatchingDtypeTimesShape) {
  ExpectRejected(Image(R"({"w":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,10]}})", 12),
                 StatusCode::kCorrupt, {"'w'", "10 bytes", "BF16", "[2, 3]", "needs 12"});
}

TEST(SafetensorsTest, RejectsOverlappingTensors) {
  ExpectRejected(Image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                       R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                       12),
                 StatusCode::kCorrupt, {"'a'", "'b'", "overlap"});
  // Zero-sized tensors share no bytes, so they may sit anywhere in bounds.
  auto ok = Parse(Image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                        R"("b":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})",
                        8));
  EXPECT_TRUE(ok.ok()) << ok.status().ToString();
}

TEST(SafetensorsTest, OpenReportsMissingFileAndCorruptFile) {
  TempDir tmp;
  auto missing = SafetensorsFile::Open(tmp.File("none.safetensors"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("none.safetensors"));

  const std::string path = tmp.File("bad.safetensors");
  WriteFile(path, Image(R"({"w":{"dtype":"U8","shape":[9],"data_offsets":[0,9]}})", 4));
  auto bad = SafetensorsFile::Open(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr(path));
  EXPECT_THAT(bad.status().message(), HasSubstr("'w'"));

  auto dir = SafetensorsFile::Open(tmp.path());
  EXPECT_FALSE(dir.ok());
}

// Checkpoint directories ---------------------------------------------------------------------

void WriteTensors(const std::string& path, const std::vector<std::string>& names) {
  SafetensorsWriter w;
  for (const auto& n : names) {
    std::vector<uint16_t> v(6, F32ToBf16(1.0f));
    ASSERT_TRUE(w.Add(n, DType::kBF16, {2, 3}, v.data(), 12).ok());
  }
  ASSERT_TRUE(w.Write(path).ok());
}

TEST(CheckpointTest, OpensSingleFileAndChecksDtypeAndShape) {
  TempDir tmp;
  WriteTensors(tmp.File("model.safetensors"), {"x", "y"});
  auto ck = Checkpoint::Open(tmp.path());
  ASSERT_TRUE(ck.ok()) << ck.status().ToString();
  EXPECT_EQ((*ck)->TensorNames(), (std::vector<std::string>{"x", "y"}));
  EXPECT_TRUE((*ck)->Get("x", DType::kBF16, {2, 3}).ok());

  auto shape = (*ck)->Get("x", DType::kBF16, {3, 2});
  ASSERT_FALSE(shape.ok());
  EXPECT_EQ(shape.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(shape.status().message(),
              HasSubstr("tensor 'x' in " + tmp.path() + " has shape [2, 3], expected [3, 2]"));

  auto dtype = (*ck)->Get("y", DType::kF32, {2, 3});
  ASSERT_FALSE(dtype.ok());
  EXPECT_THAT(dtype.status().message(), HasSubstr("has dtype BF16, expected F32"));

  auto missing = (*ck)->Get("z", DType::kBF16, {2, 3});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("missing tensor 'z' in " + tmp.path()));
}

TEST(CheckpointTest, OpensShardsFromIndex) {
  TempDir tmp;
  WriteTensors(tmp.File("model-00001-of-00002.safetensors"), {"a", "b"});
  WriteTensors(tmp.File("model-00002-of-00002.safetensors"), {"c"});
  WriteFile(tmp.File("model.safetensors.index.json"),
            R"({"metadata":{"total_size":36},"weight_map":{)"
            R"("a":"model-00001-of-00002.safetensors","b":"model-00001-of-00002.safetensors",)"
            R"("c":"model-00002-of-00002.safetensors"}})");
  auto ck = Checkpoint::Open(tmp.path());
  ASSERT_TRUE(ck.ok()) << ck.status().ToString();
  EXPECT_EQ((*ck)->TensorNames(), (std::vector<std::string>{"a", "b", "c"}));
  auto c = (*ck)->Get("c", DType::kBF16, {2, 3});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(Bf16ToF32(static_cast<uint16_t>(c->data[0] | (c->data[1] << 8))), 1.0f);
}

Status OpenWithIndex(const TempDir& tmp, const std::string& index) {
  WriteFile(tmp.File("model.safetensors.index.json"), index);
  auto ck = Checkpoint::Open(tmp.path());
  return ck.ok() ? Status::Ok() : ck.status();
}

TEST(CheckpointTest, RejectsBadIndex) {
  TempDir tmp;
  WriteTensors(tmp.File("s1.safetensors"), {"a"});
  const std::string idx = "model.safetensors.index.json";

  Status s = OpenWithIndex(tmp, "{broken");
  EXPECT_EQ(s.code(), StatusCode::kCorrupt);
  EXPECT_THAT(s.message(), HasSubstr(idx));
  EXPECT_THAT(s.message(), HasSubstr("not valid JSON"));

  s = OpenWithIndex(tmp, R"({"metadata":{}})");
  EXPECT_THAT(s.message(), HasSubstr("'weight_map'"));

  s = OpenWithIndex(tmp, R"({"weight_map":{"a":7}})");
  EXPECT_THAT(s.message(), HasSubstr("'weight_map.a' is not a string"));

  s = OpenWithIndex(tmp, R"({"weight_map":{"a":"missing.safetensors"}})");
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("missing.safetensors"));
  EXPECT_THAT(s.message(), HasSubstr(idx));

  s = OpenWithIndex(tmp, R"({"weight_map":{"a":"s1.safetensors","b":"s1.safetensors"}})");
  EXPECT_EQ(s.code(), StatusCode::kCorrupt);
  EXPECT_THAT(s.message(), HasSubstr("'b'"));
  EXPECT_THAT(s.message(), HasSubstr("does not contain it"));

  s = OpenWithIndex(tmp, R"({"weight_map":{"a":"../s1.safetensors"}})");
  EXPECT_THAT(s.message(), HasSubstr("not a file name inside the directory"));

  // A shard that is itself corrupt: the error names both the index and the shard.
  WriteFile(tmp.File("s2.safetensors"), "short");
  s = OpenWithIndex(tmp, R"({"weight_map":{"a":"s2.safetensors"}})");
  EXPECT_EQ(s.code(), StatusCode::kCorrupt);
  EXPECT_THAT(s.message(), HasSubstr("s2.safetensors"));
  EXPECT_THAT(s.message(), HasSubstr(idx));
}

TEST(CheckpointTest, RejectsEmptyDirectory) {
  TempDir tmp;
  auto ck = Checkpoint::Open(tmp.path());
  ASSERT_FALSE(ck.ok());
  EXPECT_EQ(ck.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(ck.status().message(), HasSubstr(tmp.path()));
}

TEST(CheckpointTest, ACopiedCheckpointReadsAsTheMappedOne) {
  TempDir tmp;
  WriteTensors(tmp.File("model.safetensors"), {"x", "y"});
  auto mapped = Checkpoint::Open(tmp.path());
  auto copied = Checkpoint::Open(tmp.path(), FileLoad::kCopy);
  ASSERT_TRUE(mapped.ok()) << mapped.status().ToString();
  ASSERT_TRUE(copied.ok()) << copied.status().ToString();
  EXPECT_EQ((*copied)->TensorNames(), (*mapped)->TensorNames());
  for (const char* n : {"x", "y"}) {
    auto a = (*mapped)->Get(n, DType::kBF16, {2, 3});
    auto b = (*copied)->Get(n, DType::kBF16, {2, 3});
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_EQ(a->nbytes, b->nbytes);
    EXPECT_NE(a->data, b->data);
    EXPECT_EQ(std::memcmp(a->data, b->data, a->nbytes), 0) << n;
  }
  auto bad = Checkpoint::Open(tmp.File("nothing-here"), FileLoad::kCopy);
  EXPECT_FALSE(bad.ok());
}

}  // namespace
}  // namespace pw
