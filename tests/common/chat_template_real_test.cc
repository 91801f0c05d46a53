// The chat templates real checkpoints ship (tests/fixtures/chat_templates/: llama.cpp's
// models/templates and vLLM's examples, sources in the README there), rendered byte for byte
// as HF transformers' apply_chat_template renders them with jinja2
// (tests/fixtures/chat_template_real_cases.json, tools/gen_chat_template_real_cases.py).
#include <gtest/gtest.h>

#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <optional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/text/chat_template.h"

namespace pw {
namespace {

using json = nlohmann::ordered_json;

std::string SourcePath(const std::string& rel) { return std::string(PW_SOURCE_DIR) + "/" + rel; }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Sets TZ for one test (strftime_now shows local time) and puts the old value back.
class ScopedTz {
 public:
  explicit ScopedTz(const char* tz) {
    if (const char* old = std::getenv("TZ")) old_ = old;
    setenv("TZ", tz, 1);
    tzset();
  }
  ~ScopedTz() {
    if (old_) {
      setenv("TZ", old_->c_str(), 1);
    } else {
      unsetenv("TZ");
    }
    tzset();
  }

 private:
  std::optional<std::string> old_;
};

TEST(ChatTemplateRealTemplates, RenderLikeJinja2) {
  // The fixture's clock is naive UTC (strftime_now shows local time, as HF does).
  ScopedTz utc("UTC0");
  const std::string path = SourcePath("tests/fixtures/chat_template_real_cases.json");
  ASSERT_TRUE(std::filesystem::exists(path)) << path;
  const json fixture = json::parse(ReadFile(path));
  std::map<std::string, std::string> sources;
  for (const auto& [name, file] : fixture["templates"].items()) {
    const std::string p = SourcePath(file.get<std::string>());
    ASSERT_TRUE(std::filesystem::exists(p)) << p;
    sources[name] = ReadFile(p);
  }
  const size_t real = sources.size();
  ASSERT_GE(real, 128u);  // every template of llama.cpp's models/templates and vLLM's examples
  for (const auto& [name, src] : fixture["inline_templates"].items()) {
    sources[name] = src.get<std::string>();
  }
  // jinja2 refuses to compile a few templates as they were published (a syntax error, a filter
  // no Jinja defines outside an if): HF raises for every conversation. The engine must refuse
  // those at parse time too, and parse every other.
  std::set<std::string> uncompilable;
  for (const json& c : fixture["cases"]) {
    const std::string e = c.value("error", "");
    if (e.rfind("TemplateSyntaxError", 0) == 0 || e.rfind("TemplateAssertionError", 0) == 0) {
      uncompilable.insert(c["template"].get<std::string>());
    }
  }
  std::map<std::string, ChatTemplate> templates;
  std::set<std::string> refused;  // uncompilable ones the engine refused as well
  for (const auto& [name, src] : sources) {
    auto t = ChatTemplate::Parse(src);
    if (uncompilable.count(name)) {
      EXPECT_FALSE(t.ok()) << name << ": jinja2 cannot compile it, the engine parsed it";
      if (!t.ok()) refused.insert(name);
      continue;
    }
    EXPECT_TRUE(t.ok()) << name << ": " << t.status().ToString();
    if (t.ok()) templates.emplace(name, std::move(t).value());
  }
  std::map<std::string, std::pair<int, int>> identical;  // template -> (identical, cases)
  size_t errors = 0;
  for (const json& c : fixture["cases"]) {
    const std::string name = c["template"].get<std::string>();
    auto& [same, total] = identical[name];
    ++total;
    if (refused.count(name)) {
      EXPECT_TRUE(c.contains("error")) << name << ": HF rendered a case of a template it cannot compile";
      if (c.contains("error")) ++same;
      continue;
    }
    auto t = templates.find(name);
    if (t == templates.end()) continue;
    ChatTemplateInputs in;
    in.messages = fixture["conversations"][c["conversation"].get<size_t>()];
    if (!c["tools"].is_null()) in.tools = fixture["tools"][c["tools"].get<size_t>()];
    in.kwargs = c["kwargs"];
    in.add_generation_prompt = c["add_generation_prompt"].get<bool>();
    in.continue_final_message = c["continue_final_message"].get<bool>();
    in.bos_token = fixture["bos_token"].get<std::string>();
    in.eos_token = fixture["eos_token"].get<std::string>();
    in.now_unix = fixture["now"].get<int64_t>();
    const std::string label = name + " conversation " + c["conversation"].dump() + " tools " +
                              c["tools"].dump() + (in.add_generation_prompt ? " +gen" : "") +
                              (in.continue_final_message ? " +continue" : "") + " " +
                              c["kwargs"].dump();
    auto out = t->second.Render(in);
    if (c.contains("error")) {
      ++errors;
      const std::string hf = c["error"].get<std::string>();
      EXPECT_FALSE(out.ok()) << label << " rendered " << json(*out).dump() << ", HF raised " << hf;
      if (out.ok()) continue;
      EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument) << label;
      // What the template itself raised is passed on word for word.
      const std::string raised = "TemplateError: ";
      if (hf.rfind(raised, 0) == 0) {
        EXPECT_NE(out.status().message().find(hf.substr(raised.size())), std::string::npos)
            << label << ": " << out.status().message();
      }
      ++same;
    } else {
      EXPECT_TRUE(out.ok()) << label << ": " << out.status().ToString();
      if (!out.ok()) continue;
      EXPECT_EQ(*out, c["expected"].get<std::string>()) << label;
      if (*out == c["expected"].get<std::string>()) ++same;
    }
  }
  // Every real template jinja2 compiles renders some case (one that raised for every case would
  // only show that both sides fail).
  std::map<std::string, int> rendered;
  for (const json& c : fixture["cases"]) rendered[c["template"].get<std::string>()] += c.contains("expected");
  for (const auto& [name, file] : fixture["templates"].items()) {
    if (!uncompilable.count(name)) {
      EXPECT_GT(rendered[name], 0) << name << ": HF rendered none of its cases";
    }
  }
  EXPECT_EQ(refused.size(), 2u);  // vLLM's template_vicuna and tool_chat_template_gemma4
  size_t all_identical = 0, real_identical = 0;
  for (const auto& [name, counts] : identical) {
    const bool ok = counts.first == counts.second;
    all_identical += ok;
    real_identical += ok && fixture["templates"].contains(name);
    std::printf("%-60s %3d/%3d\n", name.c_str(), counts.first, counts.second);
  }
  std::printf("real templates rendering every case like jinja2: %zu of %zu (%zu of them refused at "
              "load, as jinja2 refuses to compile them)\n",
              real_identical, real, refused.size());
  EXPECT_EQ(all_identical, sources.size());
  EXPECT_GT(errors, 0u);
}

// strftime_now shows local time without a zone, as HF's datetime.now().strftime(...) does: the
// expected strings are Python's datetime.fromtimestamp(t).strftime(f) under the same TZ (POSIX
// zone strings, no tz database needed; EST5EDT in summer and in winter).
TEST(ChatTemplateRealTemplates, StrftimeNowIsLocalTimeAsHf) {
  auto full = ChatTemplate::Parse("{{ strftime_now('%Y-%m-%d %H:%M %a %b|%Z|%z|%%Z|%%%z') }}");
  auto date = ChatTemplate::Parse("{{ strftime_now('%d %b %Y %H:%M') }}");  // Llama 3.x's
  ASSERT_TRUE(full.ok() && date.ok());
  auto render = [](const ChatTemplate& t, int64_t now) {
    ChatTemplateInputs in;
    in.now_unix = now;
    auto out = t.Render(in);
    EXPECT_TRUE(out.ok()) << out.status().ToString();
    return out.ok() ? *out : std::string();
  };
  struct Case {
    const char* tz;
    const char* summer;  // 1753522200 (2025-07-26 09:30 UTC), the full format
    const char* winter;  // 1736000000 (2025-01-04 14:13 UTC), the date format
  };
  for (const Case& c : {Case{"IST-5:30", "2025-07-26 15:00 Sat Jul|||%Z|%", "04 Jan 2025 19:43"},
                        Case{"EST5EDT,M3.2.0,M11.1.0", "2025-07-26 05:30 Sat Jul|||%Z|%",
                             "04 Jan 2025 09:13"},
                        Case{"UTC0", "2025-07-26 09:30 Sat Jul|||%Z|%", "04 Jan 2025 14:13"}}) {
    ScopedTz zone(c.tz);
    EXPECT_EQ(render(*full, 1753522200), c.summer) << c.tz;
    EXPECT_EQ(render(*date, 1736000000), c.winter) << c.tz;
  }
}

// upper, lower, title, capitalize (filters and str methods) and the tests `is lower` / `is upper`
// beyond ASCII, as jinja2 on Python strings gives them (tests/fixtures/chat_template_case_cases.json,
// tools/gen_chat_template_case_cases.py): full case mappings (ß -> SS, ŉ -> ʼN), final sigma,
// titlecase digraphs (ǅ), jinja2's own `title` filter (split at '-', brackets and whitespace).
TEST(ChatTemplateRealTemplates, CaseFiltersAndMethodsAsPython) {
  const json fixture = json::parse(ReadFile(SourcePath("tests/fixtures/chat_template_case_cases.json")));
  auto t = ChatTemplate::Parse(fixture["template"].get<std::string>());
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  size_t n = 0;
  for (const json& c : fixture["cases"]) {
    ChatTemplateInputs in;
    in.kwargs = {{"s", c[0]}};
    auto out = t->Render(in);
    ASSERT_TRUE(out.ok()) << c[0] << ": " << out.status().ToString();
    EXPECT_EQ(*out, c[1].get<std::string>()) << "s = " << c[0].get<std::string>();
    ++n;
  }
  EXPECT_GE(n, 25u);
}

}  // namespace
}  // namespace pw
