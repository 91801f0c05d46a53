// Tests of the byte-level BPE tokenizer: ids identical to HF `tokenizers` on the committed
// fixtures, decode round trips, the streaming decoder, and refusal of bad input.
#include "common/text/tokenizer.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "common/text/unicode_tables.h"

namespace pw {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

std::string SourcePath(const std::string& rel) { return std::string(PW_SOURCE_DIR) + "/" + rel; }

// The committed tokenizer; PW_TEST_TOKENIZER_JSON overrides it (to try another file by hand).
std::string ModelTokenizerPath() {
  if (const char* p = std::getenv("PW_TEST_TOKENIZER_JSON")) return p;
  return SourcePath("models/tiny-moe/tokenizer.json");
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

std::string TempDirFor(const std::string& name) {
  fs::path dir = fs::path(::testing::TempDir()) / ("pw_tokenizer_test_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

std::string Ids(const std::vector<int32_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) s += ',';
    s += std::to_string(ids[i]);
  }
  return s + "]";
}

// The GPT-2 byte alphabet, written independently of the implementation: printable bytes stand
// for themselves, the rest map to U+0100.. in order.
std::string ByteChar(int b) {
  static std::vector<std::string> table = [] {
    std::vector<std::string> t(256);
    int next = 256;
    for (int i = 0; i < 256; ++i) {
      const bool printable = (i >= 33 && i <= 126) || (i >= 161 && i <= 172) || i >= 174;
      const int cp = printable ? i : next++;
      std::string s;
      if (cp < 0x80) {
        s.push_back(static_cast<char>(cp));
      } else {
        s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      }
      t[i] = s;
    }
    return t;
  }();
  return table[b];
}

// A small but complete byte-level BPE tokenizer: the 256 byte tokens (ids 0..255), a few merges,
// and the three special tokens of our model.
json MinimalTokenizerJson() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteChar(b)] = b;
  const std::string sp = ByteChar(' ');
  std::vector<std::pair<std::string, std::string>> merges = {
      {"h", "e"}, {"l", "l"},       {"he", "ll"}, {"hell", "o"},      {sp, "w"},
      {"o", "r"}, {sp + "w", "or"}, {"l", "d"},   {sp + "wor", "ld"}, {sp, sp}};
  int next = 256;
  json merges_json = json::array();
  for (auto& [a, b] : merges) {
    vocab[a + b] = next++;
    merges_json.push_back(json::array({a, b}));
  }
  json added = json::array();
  for (const char* s : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
    added.push_back({{"id", next},
                     {"content", s},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
    vocab[s] = next++;
  }
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer",
           {{"type", "ByteLevel"},
            {"add_prefix_space", false},
            {"trim_offsets", true},
            {"use_regex", true}}},
          {"post_processor", nullptr},
          {"decoder",
           {{"type", "ByteLevel"},
            {"add_prefix_space", true},
            {"trim_offsets", true},
            {"use_regex", true}}},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"ignore_merges", false},
            {"vocab", vocab},
            {"merges", merges_json}}}};
}

std::unique_ptr<Tokenizer> LoadMinimal() {
  auto t = Tokenizer::FromJsonText(MinimalTokenizerJson().dump(), "minimal.json");
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(t).value() : nullptr;
}

// Checks the streaming decoder on `ids`: every piece is valid UTF-8 and the pieces concatenate
// to the full decode.
void ExpectIncrementalMatches(const Tokenizer& tok, const std::vector<int32_t>& ids,
                              const std::string& label) {
  auto full = tok.Decode(ids);
  ASSERT_TRUE(full.ok()) << label << ": " << full.status().ToString();
  IncrementalDecoder dec(tok);
  std::string joined;
  for (size_t i = 0; i < ids.size(); ++i) {
    auto piece = dec.Push(ids[i]);
    ASSERT_TRUE(piece.ok()) << label << ": " << piece.status().ToString();
    EXPECT_FALSE(utf8::FindInvalid(*piece).has_value())
        << label << ": invalid UTF-8 emitted after id " << i;
    EXPECT_LE(dec.pending_bytes(), 3u);
    joined += *piece;
  }
  const std::string tail = dec.Finish();
  EXPECT_FALSE(utf8::FindInvalid(tail).has_value()) << label;
  joined += tail;
  EXPECT_EQ(joined, *full) << label;
}

// ------------------------------------------------------------------------------------------
// Against HF on the committed fixtures.

TEST(TokenizerFixtures, IdsMatchHfAndRoundTrip) {
  const std::string tok_path = ModelTokenizerPath();
  const std::string cases_path = SourcePath("tests/fixtures/tokenizer_cases.json");
  if (!fs::exists(tok_path) || !fs::exists(cases_path)) {
    GTEST_SKIP() << "needs " << tok_path << " and " << cases_path;
  }
  auto tok = Tokenizer::FromFile(tok_path);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  json cases = json::parse(ReadFile(cases_path));
  if (cases.is_object() && cases.contains("cases")) cases = cases["cases"];
  ASSERT_TRUE(cases.is_array());
  ASSERT_GE(cases.size(), 200u);
  size_t mismatches = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string text = cases[i]["text"].get<std::string>();
    const std::vector<int32_t> want = cases[i]["ids"].get<std::vector<int32_t>>();
    const std::string label = "case " + std::to_string(i) + " " + json(text).dump();
    auto got = (*tok)->Encode(text);
    ASSERT_TRUE(got.ok()) << label << ": " << got.status().ToString();
    if (*got != want) ++mismatches;
    EXPECT_EQ(*got, want) << label << "\n got  " << Ids(*got) << "\n want " << Ids(want);
    auto back = (*tok)->Decode(want);
    ASSERT_TRUE(back.ok()) << label;
    EXPECT_EQ(*back, text) << label;
    ExpectIncrementalMatches(**tok, want, label);
  }
  EXPECT_EQ(mismatches, 0u) << "of " << cases.size() << " fixture strings";
}

// Applies a patch from tokenizer_random_cases.json (see tools/gen_tokenizer_random_cases.py).
json ApplyPatch(json tok, const json& patch) {
  for (auto it = patch.begin(); it != patch.end(); ++it) {
    const std::string& path = it.key();
    if (path == "!merges_as_strings") {
      for (json& m : tok["model"]["merges"]) {
        if (m.is_array()) m = m[0].get<std::string>() + " " + m[1].get<std::string>();
      }
    } else if (path[0] == '+') {
      for (const json& v : it.value()) tok[path.substr(1)].push_back(v);
    } else {
      json* node = &tok;
      size_t start = 0, dot;
      while ((dot = path.find('.', start)) != std::string::npos) {
        node = &(*node)[path.substr(start, dot - start)];
        start = dot + 1;
      }
      (*node)[path.substr(start)] = it.value();
    }
  }
  return tok;
}

TEST(TokenizerFixtures, RandomStringsAllVariantsMatchHf) {
  const std::string tok_path = ModelTokenizerPath();
  const std::string cases_path = SourcePath("tests/fixtures/tokenizer_random_cases.json");
  if (!fs::exists(tok_path) || !fs::exists(cases_path)) {
    GTEST_SKIP() << "needs " << tok_path << " and " << cases_path;
  }
  const json base = json::parse(ReadFile(tok_path));
  const json fixture = json::parse(ReadFile(cases_path));
  ASSERT_GE(fixture["variants"].size(), 8u);
  for (const json& variant : fixture["variants"]) {
    const std::string name = variant["name"].get<std::string>();
    auto tok = Tokenizer::FromJsonText(ApplyPatch(base, variant["patch"]).dump(), name);
    ASSERT_TRUE(tok.ok()) << name << ": " << tok.status().ToString();
    size_t mismatches = 0;
    for (const json& c : variant["cases"]) {
      const std::string text = c["text"].get<std::string>();
      const std::vector<int32_t> want = c["ids"].get<std::vector<int32_t>>();
      auto got = (*tok)->Encode(text);
      ASSERT_TRUE(got.ok()) << name << ": " << got.status().ToString();
      if (*got != want) {
        ++mismatches;
        ADD_FAILURE() << name << " " << json(text).dump() << "\n got  " << Ids(*got) << "\n want "
                      << Ids(want);
      }
      ExpectIncrementalMatches(**tok, want, name);
    }
    EXPECT_EQ(mismatches, 0u) << name;
  }
}

TEST(TokenizerFixtures, DecodeOfRandomIdsMatchesHf) {
  const std::string tok_path = ModelTokenizerPath();
  const std::string cases_path = SourcePath("tests/fixtures/tokenizer_random_cases.json");
  if (!fs::exists(tok_path) || !fs::exists(cases_path)) {
    GTEST_SKIP() << "needs " << tok_path << " and " << cases_path;
  }
  auto tok = Tokenizer::FromFile(tok_path);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  const json fixture = json::parse(ReadFile(cases_path));
  ASSERT_GE(fixture["decode_cases"].size(), 50u);
  size_t replaced = 0;
  for (const json& c : fixture["decode_cases"]) {
    const std::vector<int32_t> ids = c["ids"].get<std::vector<int32_t>>();
    const bool skip = c["skip_special_tokens"].get<bool>();
    const std::string want = c["text"].get<std::string>();
    auto got = (*tok)->Decode(ids, skip);
    ASSERT_TRUE(got.ok()) << Ids(ids) << ": " << got.status().ToString();
    EXPECT_EQ(*got, want) << Ids(ids) << " skip=" << skip;
    if (want.find("\xEF\xBF\xBD") != std::string::npos) ++replaced;
    // Streaming gives the same text, one id at a time.
    IncrementalDecoder dec(**tok, skip);
    std::string joined;
    for (int32_t id : ids) joined += *dec.Push(id);
    joined += dec.Finish();
    EXPECT_EQ(joined, want) << Ids(ids) << " skip=" << skip;
  }
  EXPECT_GT(replaced, 0u);  // the fixture exercises U+FFFD replacement
}

// ------------------------------------------------------------------------------------------
// Behaviour on a small hand-made tokenizer (no committed file needed).

TEST(Tokenizer, MergesByRankAndSplitsWords) {
  auto tok = LoadMinimal();
  ASSERT_NE(tok, nullptr);
  const int32_t hello = *tok->TokenToId("hello");
  const int32_t world = *tok->TokenToId(ByteChar(' ') + "world");
  auto ids = tok->Encode("hello world");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<int32_t>{hello, world}));
  // "  world": the pattern gives the first space alone, then " world".
  ids = tok->Encode("  world");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<int32_t>{' ', world}));
  // Bytes with no merge stay single-byte tokens (ids 0..255 equal the bytes' table positions).
  ids = tok->Encode("xyz");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<int32_t>{'x', 'y', 'z'}));
  ids = tok->Encode("");
  ASSERT_TRUE(ids.ok());
  EXPECT_TRUE(ids->empty());
}

TEST(Tokenizer, SpecialTokensSplitFirstAndDecode) {
  auto tok = LoadMinimal();
  ASSERT_NE(tok, nullptr);
  const int32_t im_start = *tok->TokenToId("<|im_start|>");
  const int32_t im_end = *tok->TokenToId("<|im_end|>");
  auto ids = tok->Encode("<|im_start|>hello<|im_end|><|im_end|>");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<int32_t>{im_start, *tok->TokenToId("hello"), im_end, im_end}));
  EXPECT_TRUE(tok->IsSpecial(im_end));
  EXPECT_FALSE(tok->IsSpecial(*tok->TokenToId("hello")));
  auto text = tok->Decode(*ids);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "<|im_start|>hello<|im_end|><|im_end|>");
  text = tok->Decode(*ids, /*skip_special_tokens=*/true);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "hello");
  // A partial special token is ordinary text.
  ids = tok->Encode("<|im_");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->size(), 5u);
  EXPECT_EQ(tok->IdToToken(im_end).value_or(""), "<|im_end|>");
  EXPECT_FALSE(tok->IdToToken(-1).has_value());
  EXPECT_FALSE(tok->IdToToken(tok->VocabSize()).has_value());
}

TEST(Tokenizer, AddedTokenIdsAreDerivedAsHfDoes) {
  // HF ignores the "id" written in added_tokens: content already in the vocabulary keeps its
  // model id; new content gets the next id after the model vocabulary and earlier added tokens.
  json j = MinimalTokenizerJson();
  const int32_t hello_id = j["model"]["vocab"]["hello"].get<int32_t>();
  const int32_t model_size = static_cast<int32_t>(j["model"]["vocab"].size());
  j["added_tokens"].push_back({{"id", 9999},
                               {"content", "hello"},
                               {"single_word", false},
                               {"lstrip", false},
                               {"rstrip", false},
                               {"normalized", true},
                               {"special", false}});
  j["added_tokens"].push_back({{"id", 5},
                               {"content", "<x>"},
                               {"single_word", false},
                               {"lstrip", true},
                               {"rstrip", true},
                               {"normalized", false},
                               {"special", true}});
  j["added_tokens"].push_back({{"id", 5},
                               {"content", "<y>"},
                               {"single_word", false},
                               {"lstrip", false},
                               {"rstrip", false},
                               {"normalized", false},
                               {"special", false}});
  auto t = Tokenizer::FromJsonText(j.dump(), "derived.json");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ((*t)->TokenToId("hello"), hello_id);
  EXPECT_EQ((*t)->TokenToId("<x>"), model_size);
  EXPECT_EQ((*t)->TokenToId("<y>"), model_size + 1);
  EXPECT_EQ((*t)->VocabSize(), model_size + 2);
  // lstrip/rstrip: the spaces around <x> belong to the token.
  auto ids = (*t)->Encode("hello  <x>  hello");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<int32_t>{hello_id, model_size, hello_id}));
  auto text = (*t)->Decode(*ids, /*skip_special_tokens=*/true);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "hellohello");
}

TEST(Tokenizer, InvalidUtf8IsRefusedWithOffset) {
  auto tok = LoadMinimal();
  ASSERT_NE(tok, nullptr);
  struct Case {
    std::string text;
    size_t offset;
  };
  const std::vector<Case> cases = {
      {"\xff", 0},                 // never valid
      {"abc\xc3", 3},              // truncated two-byte sequence
      {"ab\xc0\xaf", 2},           // overlong '/'
      {"x\xed\xa0\x80y", 1},       // UTF-16 surrogate
      {"ok \xf4\x90\x80\x80", 3},  // above U+10FFFF
      {"\xe2\x82\xac\x80", 3},     // stray continuation after a valid euro sign
  };
  for (const Case& c : cases) {
    auto ids = tok->Encode(c.text);
    ASSERT_FALSE(ids.ok()) << "offset " << c.offset;
    EXPECT_EQ(ids.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(ids.status().message().find("byte offset " + std::to_string(c.offset)),
              std::string::npos)
        << ids.status().message();
  }
}

TEST(Tokenizer, DecodeRefusesUnknownIds) {
  auto tok = LoadMinimal();
  ASSERT_NE(tok, nullptr);
  const std::vector<int32_t> bad = {'a', tok->VocabSize()};
  auto text = tok->Decode(bad);
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(text.status().message().find("position 1"), std::string::npos);
  const std::vector<int32_t> negative = {-5};
  EXPECT_FALSE(tok->Decode(negative).ok());
  IncrementalDecoder dec(*tok);
  EXPECT_FALSE(dec.Push(-1).ok());
  EXPECT_FALSE(dec.Push(1 << 30).ok());
}

TEST(Tokenizer, LossyDecodeFollowsMaximalSubparts) {
  auto lossy = [](std::string_view b) {
    std::string out;
    utf8::AppendLossy(b, true, &out);
    return out;
  };
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(lossy("a\xE2\x82"
                  "b"),
            "a" + r + "b");                     // truncated 3-byte: one U+FFFD
  EXPECT_EQ(lossy("\xF0\x80\x80"), r + r + r);  // F0 80 is not a valid prefix
  EXPECT_EQ(lossy("\xF0\x9F\x98"), r);          // unfinished emoji at the end
  EXPECT_EQ(lossy("\xC0\xAF"), r + r);          // overlong lead is invalid alone
  EXPECT_EQ(lossy("\xED\xA0\x80"), r + r + r);  // surrogate
  EXPECT_EQ(lossy("\xF0\x9F\x98\x80"), "\xF0\x9F\x98\x80");
  std::string out;
  EXPECT_EQ(utf8::AppendLossy("ab\xF0\x9F\x98", false, &out), 2u);  // holds the prefix
  EXPECT_EQ(out, "ab");
}

TEST(IncrementalDecoder, HoldsPartialCharactersAndFlushesReplacement) {
  auto tok = LoadMinimal();
  ASSERT_NE(tok, nullptr);
  // "é" is C3 A9; "😀" is F0 9F 98 80: fed one byte token at a time.
  IncrementalDecoder dec(*tok);
  auto p = dec.Push(0xC3);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(*p, "");
  EXPECT_EQ(dec.pending_bytes(), 1u);
  p = dec.Push(0xA9);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(*p, "\xC3\xA9");
  EXPECT_EQ(*dec.Push(0xF0), "");
  EXPECT_EQ(*dec.Push(0x9F), "");
  EXPECT_EQ(*dec.Push(0x98), "");
  EXPECT_EQ(*dec.Push(0x80), "\xF0\x9F\x98\x80");
  // The stream ends inside a character: U+FFFD, as HF's decode gives for the same ids.
  EXPECT_EQ(*dec.Push(0xE2), "");
  EXPECT_EQ(*dec.Push(0x82), "");
  EXPECT_EQ(dec.Finish(), "\xEF\xBF\xBD");
  const std::vector<int32_t> ids = {0xE2, 0x82};
  EXPECT_EQ(*tok->Decode(ids), "\xEF\xBF\xBD");
  // An invalid byte inside the stream is replaced at once, not held.
  IncrementalDecoder dec2(*tok);
  EXPECT_EQ(*dec2.Push(0xC3), "");
  EXPECT_EQ(*dec2.Push('x'), "\xEF\xBF\xBDx");
  EXPECT_EQ(dec2.Finish(), "");
}

TEST(IncrementalDecoder, RandomByteStreamsMatchFullDecode) {
  auto tok = LoadMinimal();
  ASSERT_NE(tok, nullptr);
  const uint32_t seed = 12345;
  std::mt19937 rng(seed);
  for (int round = 0; round < 200; ++round) {
    std::vector<int32_t> ids;
    const int n = rng() % 24;
    for (int i = 0; i < n; ++i) {
      // Mostly pieces of valid UTF-8 with some arbitrary bytes and multi-byte merged tokens.
      const uint32_t r = rng() % 10;
      if (r < 7) {
        static const std::string kText = "h\xC3\xA9llo \xE2\x82\xAC \xF0\x9F\x98\x80 world";
        ids.push_back(static_cast<uint8_t>(kText[rng() % kText.size()]));
      } else if (r < 9) {
        ids.push_back(static_cast<int32_t>(rng() % 256));
      } else {
        ids.push_back(*tok->TokenToId("hello"));
      }
    }
    ExpectIncrementalMatches(*tok, ids,
                             "seed " + std::to_string(seed) + " round " + std::to_string(round));
  }
}

TEST(Tokenizer, EncodesOneMegabyteWellUnderASecond) {
  const std::string tok_path = ModelTokenizerPath();
  std::unique_ptr<Tokenizer> tok;
  if (fs::exists(tok_path)) {
    auto t = Tokenizer::FromFile(tok_path);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    tok = std::move(t).value();
  } else {
    tok = LoadMinimal();
  }
  ASSERT_NE(tok, nullptr);
  // Random words over several scripts, so the word cache does not see only repeats.
  std::mt19937 rng(7);
  const std::vector<std::string> alphabet = {"a",
                                             "e",
                                             "i",
                                             "o",
                                             "n",
                                             "s",
                                             "t",
                                             "r",
                                             "l",
                                             "h",
                                             "\xC3\xA9",
                                             "\xD0\xB4",
                                             "\xE6\x97\xA5",
                                             "1",
                                             "7",
                                             ",",
                                             ".",
                                             "(",
                                             ")",
                                             "'s",
                                             "\xF0\x9F\x98\x80"};
  const std::vector<std::string> seps = {" ", " ", " ", "  ", "\n", "\n\n", "\t", ", "};
  std::string text;
  while (text.size() < (1u << 20)) {
    const int len = 1 + rng() % 9;
    for (int i = 0; i < len; ++i) text += alphabet[rng() % alphabet.size()];
    text += seps[rng() % seps.size()];
  }
  // CPU time of this thread, so that a loaded machine does not fail the test.
  auto cpu_seconds = [] {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
  };
  const double t0 = cpu_seconds();
  auto ids = tok->Encode(text);
  const double secs = cpu_seconds() - t0;
  ASSERT_TRUE(ids.ok()) << ids.status().ToString();
  std::printf("encoded %zu bytes into %zu tokens in %.3f s of CPU (%.1f MB/s)\n", text.size(),
              ids->size(), secs, text.size() / secs / 1e6);
  auto back = tok->Decode(*ids);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, text);
#if !defined(PW_SANITIZER_BUILD)
  EXPECT_LT(secs, 1.0);
#endif
}

TEST(Tokenizer, ConcurrentEncodesAgree) {
  auto tok = LoadMinimal();
  ASSERT_NE(tok, nullptr);
  const std::string text = "hello world, hello again\n  world <|im_end|> \xE6\x97\xA5\xE6\x9C\xAC";
  auto want = tok->Encode(text);
  ASSERT_TRUE(want.ok());
  std::vector<std::thread> threads;
  std::vector<int> bad(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 500; ++i) {
        auto got = tok->Encode(text + std::to_string(i % 7));
        if (!got.ok() || got->size() < want->size()) ++bad[t];
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(bad[t], 0);
}

TEST(UnicodeTables, ClassesOfKnownCodepoints) {
  using unicode::CharClass;
  using unicode::Classify;
  EXPECT_EQ(Classify(U'a'), CharClass::kLetter);
  EXPECT_EQ(Classify(0x65E5), CharClass::kLetter);  // 日
  EXPECT_EQ(Classify(0x00AA), CharClass::kLetter);  // ª (Lo)
  EXPECT_EQ(Classify(U'7'), CharClass::kNumber);
  EXPECT_EQ(Classify(0x00BD), CharClass::kNumber);  // ½ (No)
  EXPECT_EQ(Classify(0x2167), CharClass::kNumber);  // Ⅷ (Nl)
  EXPECT_EQ(Classify(0x0663), CharClass::kNumber);  // Arabic-Indic 3
  EXPECT_EQ(Classify(U' '), CharClass::kWhiteSpace);
  EXPECT_EQ(Classify(0x0085), CharClass::kWhiteSpace);
  EXPECT_EQ(Classify(0x3000), CharClass::kWhiteSpace);
  EXPECT_EQ(Classify(0x001C), CharClass::kOther);   // not White_Space, unlike str.isspace
  EXPECT_EQ(Classify(0x200B), CharClass::kOther);   // zero-width space is Cf
  EXPECT_EQ(Classify(0x0301), CharClass::kOther);   // combining acute (Mn)
  EXPECT_EQ(Classify(0x1F600), CharClass::kOther);  // emoji (So)
  EXPECT_EQ(Classify(0x1C89), CharClass::kLetter);  // assigned in Unicode 16.0
  EXPECT_EQ(Classify(0x110000), CharClass::kOther);
  // Tables sorted and disjoint.
  using Table = std::pair<const unicode::CodepointRange*, size_t>;
  for (auto [ranges, n] : {Table{unicode::kLetterRanges, unicode::kLetterRangesSize},
                           Table{unicode::kNumberRanges, unicode::kNumberRangesSize},
                           Table{unicode::kWhiteSpaceRanges, unicode::kWhiteSpaceRangesSize}}) {
    for (size_t i = 0; i < n; ++i) {
      EXPECT_LE(ranges[i].first, ranges[i].last);
      if (i > 0) {
        EXPECT_LT(ranges[i - 1].last + 1, ranges[i].first);
      }
    }
  }
}

// ------------------------------------------------------------------------------------------
// Malformed tokenizer.json: each variant is written to a file and must be refused with the
// right code, naming the file and the field.

struct BadCase {
  std::string name;
  std::function<void(json&)> mutate;  // applied to the minimal tokenizer (ignored if raw set)
  std::string raw;                    // file content instead of a mutated JSON, when non-empty
  StatusCode code;
  std::string expect_in_message;
};

TEST(TokenizerBadInput, MalformedFilesAreRefusedWithFieldNames) {
  const std::string dir = TempDirFor("bad");
  const std::vector<BadCase> cases = {
      {"not_json", nullptr, "{\"model\": {", StatusCode::kCorrupt, "not valid JSON"},
      {"not_object", nullptr, "[1, 2]", StatusCode::kCorrupt, "expected a JSON object"},
      {"no_model", [](json& j) { j.erase("model"); }, "", StatusCode::kCorrupt, "'model'"},
      {"no_vocab", [](json& j) { j["model"].erase("vocab"); }, "", StatusCode::kCorrupt,
       "'model.vocab': missing"},
      {"vocab_array",
       [](json& j) {
         j["model"]["vocab"] = json::array({1, 2});
       },
       "", StatusCode::kCorrupt, "model.vocab"},
      {"vocab_string_id", [](json& j) { j["model"]["vocab"]["a"] = "x"; }, "", StatusCode::kCorrupt,
       "model.vocab[\"a\"]"},
      {"vocab_negative_id", [](json& j) { j["model"]["vocab"]["a"] = -3; }, "",
       StatusCode::kCorrupt, "model.vocab[\"a\"]"},
      {"vocab_duplicate_id", [](json& j) { j["model"]["vocab"]["a"] = 0x62; }, "",
       StatusCode::kCorrupt, "also used by"},
      {"no_merges", [](json& j) { j["model"].erase("merges"); }, "", StatusCode::kCorrupt,
       "'model.merges': missing"},
      {"merge_no_space", [](json& j) { j["model"]["merges"][2] = "hell"; }, "",
       StatusCode::kCorrupt, "model.merges[2]"},
      {"merge_two_spaces", [](json& j) { j["model"]["merges"][0] = "h e l"; }, "",
       StatusCode::kCorrupt, "model.merges[0]"},
      {"merge_triple",
       [](json& j) {
         j["model"]["merges"][1] = json::array({"l", "l", "l"});
       },
       "", StatusCode::kCorrupt, "model.merges[1]"},
      {"merge_number", [](json& j) { j["model"]["merges"][3] = 7; }, "", StatusCode::kCorrupt,
       "model.merges[3]"},
      {"merge_unknown_token",
       [](json& j) {
         j["model"]["merges"].push_back(json::array({"q", "zz"}));
       },
       "", StatusCode::kCorrupt, "\"zz\" is not in model.vocab"},
      {"merge_result_unknown",
       [](json& j) {
         j["model"]["merges"].push_back(json::array({"q", "z"}));
       },
       "", StatusCode::kCorrupt, "\"qz\" is not in model.vocab"},
      {"model_wordpiece", [](json& j) { j["model"]["type"] = "WordPiece"; }, "",
       StatusCode::kUnsupported, "WordPiece"},
      {"byte_fallback", [](json& j) { j["model"]["byte_fallback"] = true; }, "",
       StatusCode::kUnsupported, "byte_fallback"},
      {"dropout", [](json& j) { j["model"]["dropout"] = 0.1; }, "", StatusCode::kUnsupported,
       "model.dropout"},
      {"normalizer_nfc",
       [](json& j) {
         j["normalizer"] = {{"type", "NFC"}};
       },
       "", StatusCode::kUnsupported, "NFC"},
      {"pretok_metaspace",
       [](json& j) {
         j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "_"}};
       },
       "", StatusCode::kUnsupported, "Metaspace"},
      {"pretok_null", [](json& j) { j["pre_tokenizer"] = nullptr; }, "", StatusCode::kUnsupported,
       "pre_tokenizer"},
      {"split_unknown_regex",
       [](json& j) {
         j["pre_tokenizer"] = {
             {"type", "Sequence"},
             {"pretokenizers",
              {{{"type", "Split"},
                {"pattern", {{"Regex", "\\w+|\\d"}}},
                {"behavior", "Isolated"},
                {"invert", false}},
               {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
       },
       "", StatusCode::kUnsupported, "\\w+|\\d"},
      {"split_removed_behavior",
       [](json& j) {
         j["pre_tokenizer"] = {
             {"type", "Sequence"},
             {"pretokenizers",
              {{{"type", "Split"},
                {"pattern",
                 {{"Regex",
                   "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| "
                   "?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"}}},
                {"behavior", "Removed"},
                {"invert", false}},
               {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
       },
       "", StatusCode::kUnsupported, "Removed"},
      {"sequence_without_bytelevel",
       [](json& j) {
         j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", json::array()}};
       },
       "", StatusCode::kUnsupported, "ByteLevel"},
      {"decoder_wordpiece",
       [](json& j) {
         j["decoder"] = {{"type", "WordPiece"}};
       },
       "", StatusCode::kUnsupported, "WordPiece"},
      {"post_template",
       [](json& j) {
         j["post_processor"] = {{"type", "TemplateProcessing"}};
       },
       "", StatusCode::kUnsupported, "TemplateProcessing"},
      {"truncation",
       [](json& j) {
         j["truncation"] = {{"max_length", 5}};
       },
       "", StatusCode::kUnsupported, "truncation"},
      {"added_no_id", [](json& j) { j["added_tokens"][1].erase("id"); }, "", StatusCode::kCorrupt,
       "added_tokens[1].id"},
      {"added_empty", [](json& j) { j["added_tokens"][0]["content"] = ""; }, "",
       StatusCode::kCorrupt, "added_tokens[0].content"},
      {"added_flag_type", [](json& j) { j["added_tokens"][2]["lstrip"] = "yes"; }, "",
       StatusCode::kCorrupt, "added_tokens[2].lstrip"},
      {"unk_missing", [](json& j) { j["model"]["unk_token"] = "<unk>"; }, "", StatusCode::kCorrupt,
       "model.unk_token"},
  };
  for (const BadCase& c : cases) {
    const std::string path = dir + "/" + c.name + ".json";
    if (!c.raw.empty()) {
      WriteFile(path, c.raw);
    } else {
      json j = MinimalTokenizerJson();
      c.mutate(j);
      WriteFile(path, j.dump());
    }
    auto t = Tokenizer::FromFile(path);
    ASSERT_FALSE(t.ok()) << c.name << " was accepted";
    EXPECT_EQ(t.status().code(), c.code) << c.name << ": " << t.status().ToString();
    EXPECT_NE(t.status().message().find(path), std::string::npos)
        << c.name << ": message does not name the file: " << t.status().message();
    EXPECT_NE(t.status().message().find(c.expect_in_message), std::string::npos)
        << c.name << ": " << t.status().message();
  }
  auto missing = Tokenizer::FromFile(dir + "/does_not_exist.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

TEST(TokenizerBadInput, TruncatedFilesNeverCrash) {
  const std::string text = MinimalTokenizerJson().dump();
  // Every prefix at a coarse stride, plus bytes flipped: each must load or fail cleanly.
  for (size_t len = 0; len < text.size(); len += 97) {
    auto t = Tokenizer::FromJsonText(text.substr(0, len), "truncated.json");
    EXPECT_FALSE(t.ok()) << len;
  }
  std::mt19937 rng(99);
  for (int i = 0; i < 200; ++i) {
    std::string s = text;
    s[rng() % s.size()] = static_cast<char>(rng() % 128);
    auto t = Tokenizer::FromJsonText(s, "flipped.json");
    if (t.ok()) {
      EXPECT_TRUE((*t)->Encode("hello world").ok());
    }
  }
}

// ------------------------------------------------------------------------------------------
// Model directory with tokenizer_config.json.

TEST(TokenizerModelDir, ReadsSpecialTokensAndChatTemplate) {
  const std::string dir = TempDirFor("modeldir");
  WriteFile(dir + "/tokenizer.json", MinimalTokenizerJson().dump());
  json cfg = {{"bos_token", nullptr},
              {"eos_token", {{"__type", "AddedToken"}, {"content", "<|im_end|>"}}},
              {"chat_template", "{% for m in messages %}{{ m['content'] }}{% endfor %}"}};
  WriteFile(dir + "/tokenizer_config.json", cfg.dump());
  auto t = Tokenizer::FromModelDir(dir);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ((*t)->eos_token(), "<|im_end|>");
  EXPECT_EQ((*t)->eos_token_id(), (*t)->TokenToId("<|im_end|>"));
  EXPECT_FALSE((*t)->bos_token_id().has_value());
  EXPECT_EQ((*t)->chat_template(), cfg["chat_template"].get<std::string>());

  // A list of named templates: "default" is used.
  cfg["chat_template"] = json::array(
      {{{"name", "tool_use"}, {"template", "T"}}, {{"name", "default"}, {"template", "D"}}});
  cfg["eos_token"] = "<|endoftext|>";
  WriteFile(dir + "/tokenizer_config.json", cfg.dump());
  t = Tokenizer::FromModelDir(dir);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ((*t)->chat_template(), "D");
  EXPECT_EQ((*t)->eos_token_id(), (*t)->TokenToId("<|endoftext|>"));

  // An eos token the vocabulary lacks is an error naming the config file and the field.
  cfg["eos_token"] = "</s>";
  WriteFile(dir + "/tokenizer_config.json", cfg.dump());
  t = Tokenizer::FromModelDir(dir);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("tokenizer_config.json"), std::string::npos);
  EXPECT_NE(t.status().message().find("eos_token"), std::string::npos);

  WriteFile(dir + "/tokenizer_config.json", "{ not json");
  t = Tokenizer::FromModelDir(dir);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kCorrupt);
}

TEST(TokenizerModelDir, CommittedModelHasSpecialTokens) {
  const std::string dir = SourcePath("models/tiny-moe");
  if (!fs::exists(dir + "/tokenizer.json") || !fs::exists(dir + "/tokenizer_config.json")) {
    GTEST_SKIP() << "needs " << dir << "/tokenizer.json and tokenizer_config.json";
  }
  auto t = Tokenizer::FromModelDir(dir);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_TRUE((*t)->eos_token_id().has_value());
  for (const char* s : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
    auto id = (*t)->TokenToId(s);
    ASSERT_TRUE(id.has_value()) << s;
    EXPECT_TRUE((*t)->IsSpecial(*id)) << s;
    auto ids = (*t)->Encode(s);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(*ids, std::vector<int32_t>{*id});
  }
}

}  // namespace
}  // namespace pw
