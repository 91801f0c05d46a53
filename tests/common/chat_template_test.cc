// Tests of the chat template renderer: byte-identical to HF transformers' apply_chat_template on
// the committed fixtures, plus the subset's semantics and refusal of what it does not support.
#include "common/text/chat_template.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/text/tokenizer.h"

namespace pw {
namespace {

using json = nlohmann::json;

std::string SourcePath(const std::string& rel) { return std::string(PW_SOURCE_DIR) + "/" + rel; }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

ChatTemplateInputs Inputs(std::vector<ChatMessage> messages, bool gen = false) {
  ChatTemplateInputs in;
  in.messages = ChatTemplateInputs::TextMessages(messages);
  in.add_generation_prompt = gen;
  in.bos_token = "<s>";
  in.eos_token = "</s>";
  return in;
}

// Renders `tpl` with `in`, failing the test on error.
std::string Render(const std::string& tpl, const ChatTemplateInputs& in) {
  auto t = ChatTemplate::Parse(tpl);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  if (!t.ok()) return "<parse error>";
  auto out = t->Render(in);
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  return out.ok() ? *out : "<render error>";
}

TEST(ChatTemplateFixtures, MatchesHfApplyChatTemplate) {
  const std::string path = SourcePath("tests/fixtures/chat_template_cases.json");
  ASSERT_TRUE(std::filesystem::exists(path)) << path;
  const json fixture = json::parse(ReadFile(path));
  std::map<std::string, ChatTemplate> templates;
  for (auto it = fixture["templates"].begin(); it != fixture["templates"].end(); ++it) {
    auto t = ChatTemplate::Parse(it.value().get<std::string>());
    ASSERT_TRUE(t.ok()) << it.key() << ": " << t.status().ToString();
    templates.emplace(it.key(), std::move(t).value());
  }
  ASSERT_GE(templates.size(), 5u);
  size_t checked = 0, errors = 0;
  for (const json& c : fixture["cases"]) {
    ChatTemplateInputs in;
    for (const json& m : c["messages"]) {
      in.messages.push_back(
          {{"role", m["role"].get<std::string>()}, {"content", m["content"].get<std::string>()}});
    }
    in.add_generation_prompt = c["add_generation_prompt"].get<bool>();
    if (!c["bos_token"].is_null()) in.bos_token = c["bos_token"].get<std::string>();
    if (!c["eos_token"].is_null()) in.eos_token = c["eos_token"].get<std::string>();
    const std::string name = c["template"].get<std::string>();
    const std::string label = name + " " + c["messages"].dump() +
                              (in.add_generation_prompt ? " +gen" : "") +
                              " bos=" + c["bos_token"].dump();
    auto out = templates.at(name).Render(in);
    if (c.contains("error")) {
      EXPECT_FALSE(out.ok()) << label << " rendered " << json(*out).dump() << ", HF raised "
                             << c["error"];
      if (!out.ok()) {
        EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument) << label;
      }
      ++errors;
    } else {
      ASSERT_TRUE(out.ok()) << label << ": " << out.status().ToString();
      EXPECT_EQ(*out, c["expected"].get<std::string>()) << label;
    }
    ++checked;
  }
  EXPECT_GE(checked, 100u);
  EXPECT_GT(errors, 0u);  // raise_exception cases are in the fixture
}

TEST(ChatTemplate, ChatMlOfTheModel) {
  const std::string dir = SourcePath("models/tiny-moe");
  if (!std::filesystem::exists(dir + "/tokenizer_config.json")) {
    GTEST_SKIP() << "needs " << dir << "/tokenizer_config.json";
  }
  auto tok = Tokenizer::FromModelDir(dir);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  ASSERT_FALSE((*tok)->chat_template().empty());
  auto in = Inputs({{"system", "Be brief."}, {"user", "Hi"}}, /*gen=*/true);
  EXPECT_EQ(Render((*tok)->chat_template(), in),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n");
  // The rendered prompt tokenizes with the special tokens as single ids.
  auto ids = (*tok)->Encode(Render((*tok)->chat_template(), in));
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ((*ids)[0], *(*tok)->TokenToId("<|im_start|>"));
}

TEST(ChatTemplate, WhitespaceControlAndBlocks) {
  const auto in = Inputs({{"user", "a"}, {"assistant", "b"}});
  // trim_blocks removes the newline after a block tag; lstrip_blocks the indentation before it.
  EXPECT_EQ(Render("{% for m in messages %}\n    {% if m.role == 'user' %}\nU:{{ m.content }}\n"
                   "    {% endif %}\n{% endfor %}",
                   in),
            "U:a\n");
  EXPECT_EQ(Render("x  {%- if true -%}  \n y {%- endif %}", in), "xy");
  EXPECT_EQ(Render("  {%+ if true %}z{% endif %}", in), "  z");  // '+' keeps the indentation
  EXPECT_EQ(Render("a {{- ' b ' -}} c", in), "a b c");
  EXPECT_EQ(Render("a{# comment #}b\n{# c2 #}\nc", in), "ab\nc");
  EXPECT_EQ(Render("end\n", in), "end");  // one trailing newline dropped, as Jinja does
}

TEST(ChatTemplate, ExpressionsAndLoopVariables) {
  const auto in = Inputs({{"user", "Hello"}, {"assistant", "World"}, {"user", "again"}});
  EXPECT_EQ(Render("{% for m in messages %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}"
                   "{{ loop.last }}{{ loop.revindex }},{% endfor %}",
                   in),
            "10TrueFalse3,21FalseFalse2,32FalseTrue1,");
  EXPECT_EQ(Render("{{ messages[1]['content'] + '!' ~ 3 }}", in), "World!3");
  EXPECT_EQ(Render("{{ messages[-1].content.upper() }}|{{ messages[0].content[1:3] }}", in),
            "AGAIN|el");
  EXPECT_EQ(Render("{{ messages | length }} {{ (messages[1:] | first).role }}", in), "3 assistant");
  EXPECT_EQ(Render("{{ 'yes' if messages[0].role == 'user' and not add_generation_prompt "
                   "else 'no' }}",
                   in),
            "yes");
  EXPECT_EQ(Render("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 * 3 + 1 }} {{ 1 / 2 }}", in),
            "3 -4 2 7 0.5");
  EXPECT_EQ(Render("{{ 'ab' in 'cabd' }} {{ 'x' not in ['x', 'y'] }} {{ foo is defined }} "
                   "{{ eos_token is string }} {{ none is none }}",
                   in),
            "True False False True True");
  EXPECT_EQ(
      Render("{% set x = 'a' %}{% for m in messages %}{% set x = m.role %}{% endfor %}{{ x }}", in),
      "a");  // a set inside a loop does not leak out of it
  EXPECT_EQ(Render("{{ {'a': 1, 'b': [1, 'x']} | tojson }} {{ 'q\"\\n' | tojson }}", in),
            "{\"a\": 1, \"b\": [1, \"x\"]} \"q\\\"\\n\"");
  EXPECT_EQ(Render("{{ '  pad ' | trim }}|{{ ['a', 'b'] | join('-') }}|{{ undefined_var }}|"
                   "{{ undefined_var | default('dflt') }}",
                   in),
            "pad|a-b||dflt");
  EXPECT_EQ(
      Render("{% for k, v in {'r': 'u', 's': 't'}.items() %}{{ k }}={{ v }};{% endfor %}", in),
      "r=u;s=t;");
  EXPECT_EQ(Render("{% if false %}a{% elif messages %}b{% else %}c{% endif %}", in), "b");
  EXPECT_EQ(Render("{{ bos_token }}{{ eos_token }}", Inputs({})), "<s></s>");
}

TEST(ChatTemplate, RenderErrors) {
  const auto in = Inputs({{"user", "x"}});
  auto t = ChatTemplate::Parse("{{ raise_exception('roles must alternate') }}");
  ASSERT_TRUE(t.ok());
  auto out = t->Render(in);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(out.status().message().find("roles must alternate"), std::string::npos);

  for (const char* bad :
       {"{{ 'a' + 1 }}", "{{ messages + 'x' }}", "{{ 1 // 0 }}", "{{ undefined_var.x }}",
        "{% for m in 5 %}{% endfor %}", "{{ bos_missing + 'x' }}", "{{ '{:>5}'.format(1) }}",
        "{{ '{0.role}'.format(messages[0]) }}", "{{ '{}{}'.format(1) }}", "{{ '{0}{}'.format(1, 2) }}",
        "{{ '{x}'.format(y=1) }}", "{{ 'a}'.format() }}", "{{ [1].append(2) }}", "{{ {'a': 1}.pop('a') }}",
        "{% if true %}{{ 1 | from_json }}{% endif %}", "{{ 1 is nosuch if true else 2 }}",
        "{{ 1 is sameas 1 }}", "{% macro m() %}{{ caller() }}{% endmacro %}{{ m() }}",
        "{% macro m() %}{{ caller(1, 2) }}{% endmacro %}{% call(a) m() %}{% endcall %}",
        "{{ '%s %s' | format(1) }}", "{{ '%s' | format(1, 2) }}", "{{ '%x' | format(1) }}",
        "{{ '%d' | format('a') }}", "{{ '%(a)s' | format(b=1) }}", "{{ '%s' | format(1, a=2) }}"}) {
    auto p = ChatTemplate::Parse(bad);
    ASSERT_TRUE(p.ok()) << bad << ": " << p.status().ToString();
    auto r = p->Render(in);
    EXPECT_FALSE(r.ok()) << bad << " rendered " << *r;
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    }
  }
  // A filter Jinja does not define, in an if's branch that is not taken, renders (as jinja2,
  // which checks it only when it is reached); so does str.format with plain fields.
  EXPECT_EQ(Render("{% if messages | length > 5 %}{{ x | from_json }}{% endif %}ok", in), "ok");
  EXPECT_EQ(Render("{{ '{}-{{}}-{0}'.format(1) if false else '{1}{0}{n}'.format('a', 'b', n=none) }}", in),
            "baNone");
  // An undefined bos_token prints as nothing but cannot be concatenated (as in Jinja).
  ChatTemplateInputs no_bos = in;
  no_bos.bos_token.reset();
  EXPECT_EQ(Render("[{{ bos_token }}]", no_bos), "[]");
  auto p = ChatTemplate::Parse("{{ bos_token + 'x' }}");
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->Render(no_bos).ok());
  // Output is bounded.
  p = ChatTemplate::Parse(
      "{% set s = 'x' * 1000000 %}{% for i in range(100) %}{{ s }}{% endfor %}");
  ASSERT_TRUE(p.ok());
  auto big = p->Render(in);
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), StatusCode::kResourceExhausted);
}

TEST(ChatTemplate, UnsupportedAndMalformedSyntaxNamePosition) {
  struct Case {
    const char* tpl;
    StatusCode code;
    const char* in_message;
  };
  const std::vector<Case> cases = {
      {"{% call m() %}{% endcall %}", StatusCode::kUnsupported, "line 1, column 9: unsupported function 'm'"},
      {"{% macro m() %}{% endmacro %}{% call m %}{% endcall %}", StatusCode::kUnsupported,
       "'call' needs a macro call"},
      {"{% macro m() %}{% endmacro %}{% call(a=1) m() %}{% endcall %}", StatusCode::kUnsupported,
       "a default for a caller parameter"},
      {"{% macro m() %}{% endmacro %}{% call m() %}x", StatusCode::kInvalidArgument, "without 'endcall'"},
      {"{% endcall %}", StatusCode::kInvalidArgument, "unexpected 'endcall'"},
      {"ok\n{% include 'x' %}", StatusCode::kUnsupported, "line 2, column 4"},
      {"{{ x | batch(2) }}", StatusCode::kUnsupported, "unsupported filter 'batch'"},
      {"{{ x is escaped }}", StatusCode::kUnsupported, "unsupported test 'escaped'"},
      {"{{ x.zfill(3) }}", StatusCode::kUnsupported, "unsupported method 'zfill'"},
      // A filter or test Jinja does not define either: refused where jinja2 refuses it when it
      // compiles the template (outside an if, or in a loop's body inside one) ...
      {"{{ x | from_json }}", StatusCode::kUnsupported, "column 6: no filter named 'from_json'"},
      {"{% if x %}{% for m in messages %}{{ m | from_json }}{% endfor %}{% endif %}",
       StatusCode::kUnsupported, "no filter named 'from_json'"},
      {"{% for m in messages if m is nosuch %}{% endfor %}", StatusCode::kUnsupported,
       "no test named 'nosuch'"},
      // ... and one jinja2 has but this engine lacks is refused wherever it is.
      {"{% if x %}{{ x | batch(2) }}{% endif %}", StatusCode::kUnsupported, "unsupported filter 'batch'"},
      {"{% macro m() %}{% endmacro %}{{ m() }}{{ n(1) }}", StatusCode::kUnsupported,
       "column 42: unsupported function 'n'"},
      {"{% set a, b = 1, 2 %}", StatusCode::kUnsupported, "several names"},
      {"{% for m in messages recursive %}{% endfor %}", StatusCode::kUnsupported, "recursive"},
      {"a\n  {% raw %}{{ x }}{% endraw %}", StatusCode::kUnsupported,
       "line 2, column 6: unsupported statement 'raw'"},
      {"{% break %}", StatusCode::kInvalidArgument, "'break' outside a loop"},
      {"{% for m in messages %}{% macro k() %}{% continue %}{% endmacro %}{% endfor %}",
       StatusCode::kInvalidArgument, "'continue' outside a loop"},
      {"{% macro m(a=1, b) %}{% endmacro %}", StatusCode::kInvalidArgument, "without a default"},
      {"{% macro m() %}", StatusCode::kInvalidArgument, "without 'endmacro'"},
      {"{% set x %}abc", StatusCode::kInvalidArgument, "without 'endset'"},
      {"{% for m in messages %}{% else %}{% else %}{% endfor %}", StatusCode::kInvalidArgument,
       "'else' after 'else'"},
      {"{% for m in messages %}", StatusCode::kInvalidArgument, "without 'endfor'"},
      {"{% if x %}a{% else %}b", StatusCode::kInvalidArgument, "without 'endif'"},
      {"{% endif %}", StatusCode::kInvalidArgument, "unexpected 'endif'"},
      {"abc {{ x ", StatusCode::kInvalidArgument, "never closed"},
      {"{{ 'unterminated }}", StatusCode::kInvalidArgument, "unterminated string"},
      {"{{ x + }}", StatusCode::kInvalidArgument, "expected an expression"},
      {"{{ x y }}", StatusCode::kInvalidArgument, "unexpected 'y'"},
      {"{{ a ? b }}", StatusCode::kInvalidArgument, "unexpected character '?'"},
      {"{% if x %}{% else %}{% else %}{% endif %}", StatusCode::kInvalidArgument, "after 'else'"},
  };
  for (const Case& c : cases) {
    auto t = ChatTemplate::Parse(c.tpl);
    ASSERT_FALSE(t.ok()) << c.tpl << " was accepted";
    EXPECT_EQ(t.status().code(), c.code) << c.tpl << ": " << t.status().ToString();
    EXPECT_NE(t.status().message().find(c.in_message), std::string::npos)
        << c.tpl << ": " << t.status().message();
    EXPECT_NE(t.status().message().find("line "), std::string::npos) << t.status().message();
  }
}

TEST(ChatTemplate, DeepNestingIsRefusedNotOverflowed) {
  for (const std::string& tpl :
       {"{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}",
        "{{ " + std::string(100000, '-') + "1 }}",
        "{{ " + std::string(50000, '[') + std::string(50000, ']') + " }}", [] {
          std::string t;
          for (int k = 0; k < 20000; ++k) t += "{% if true %}";
          for (int k = 0; k < 20000; ++k) t += "{% endif %}";
          return t;
        }()}) {
    auto t = ChatTemplate::Parse(tpl);
    ASSERT_FALSE(t.ok());
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument) << t.status().ToString();
    EXPECT_NE(t.status().message().find("nested too deeply"), std::string::npos);
  }
  // Moderate nesting is fine.
  EXPECT_EQ(
      Render("{{ ((((1 + 2)))) }}{% if true %}{% if true %}x{% endif %}{% endif %}", Inputs({})),
      "3x");
}

TEST(ChatTemplate, NamespacesMacrosAndLoopControlsFailCleanly) {
  const auto in = Inputs({{"user", "x"}});
  for (const char* bad : {
           "{% set s = 'str' %}{% set s.a = 1 %}",                     // not a namespace
           "{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}",             // too many arguments
           "{% macro m(a) %}{% endmacro %}{{ m(b=1) }}",              // unknown keyword
           "{% macro m(a) %}{% endmacro %}{{ m(1, a=2) }}",           // given twice
           "{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}",         // endless recursion
           "{% for m in messages %}{{ loop.cycle() }}{% endfor %}",   // nothing to cycle
           "{{ (messages | map(attribute='role'))[0] }}",             // a generator has no index
           "{{ messages | selectattr('role') | length }}",            // nor a length
           "{{ messages | map(attribute='role') | tojson }}",         // nor JSON
           "{{ namespace(a=1) | tojson }}",
           "{% for x in none %}{% endfor %}",
       }) {
    auto p = ChatTemplate::Parse(bad);
    ASSERT_TRUE(p.ok()) << bad << ": " << p.status().ToString();
    auto r = p->Render(in);
    EXPECT_FALSE(r.ok()) << bad << " rendered " << *r;
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    }
  }
  // Recursion that ends is fine, and a namespace changed inside a macro is shared.
  EXPECT_EQ(Render("{% set ns = namespace(n=0) %}{% macro down(k) %}{% set ns.n = ns.n + 1 %}"
                   "{% if k > 0 %}{{ k }}{{ down(k - 1) }}{% endif %}{% endmacro %}"
                   "{{ down(5) }}|{{ ns.n }}",
                   in),
            "54321|6");
  // continue_final_message needs text to continue and excludes add_generation_prompt.
  ChatTemplateInputs cont = Inputs({{"user", "a"}, {"assistant", "b"}});
  cont.continue_final_message = true;
  EXPECT_EQ(Render("{% for m in messages %}<{{ m.content }}>{% endfor %}", cont), "<a><b");
  cont.add_generation_prompt = true;
  auto t = ChatTemplate::Parse("{% for m in messages %}{{ m.content }}{% endfor %}");
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE(t->Render(cont).ok());
  cont.add_generation_prompt = false;
  auto hides = ChatTemplate::Parse("{% for m in messages %}{{ m.role }}{% endfor %}{# content #}");
  ASSERT_TRUE(hides.ok());
  EXPECT_FALSE(hides->Render(cont).ok());  // the template never renders the final content
}

TEST(ChatTemplate, MutatedRealTemplatesNeverCrash) {
  // Mutated copies of real templates (macros, namespaces, loop controls): each parses and
  // renders or fails with a status.
  const json fixture =
      json::parse(ReadFile(SourcePath("tests/fixtures/chat_template_real_cases.json")));
  ChatTemplateInputs in;
  in.messages = nlohmann::ordered_json::parse(fixture["conversations"][5].dump());
  in.tools = nlohmann::ordered_json::parse(fixture["tools"][0].dump());
  in.bos_token = "<s>";
  in.eos_token = "</s>";
  in.now_unix = 0;
  uint32_t state = 88172645u;
  auto next = [&state] {
    state ^= state << 13;
    state ^= state >> 17;
    state ^= state << 5;
    return state;
  };
  const std::string alphabet = "{}%#-+'\"[]().|:,=~ \nabcdefor";
  for (const char* name : {"llama.cpp-openai-gpt-oss-120b", "llama.cpp-glm_4_5",
                           "llama.cpp-NousResearch-Hermes-3-Llama-3.1-8B-tool_use"}) {
    const std::string base = ReadFile(SourcePath(fixture["templates"][name].get<std::string>()));
    ASSERT_FALSE(base.empty()) << name;
    for (int round = 0; round < 300; ++round) {
      std::string s = base;
      for (int k = 1 + next() % 4; k > 0; --k) {
        const size_t pos = next() % s.size();
        switch (next() % 3) {
          case 0:
            s[pos] = alphabet[next() % alphabet.size()];
            break;
          case 1:
            s.erase(pos, 1 + next() % 3);
            break;
          default:
            s.insert(pos, 1, alphabet[next() % alphabet.size()]);
            break;
        }
      }
      auto t = ChatTemplate::Parse(s);
      if (t.ok()) (void)t->Render(in);
    }
  }
}

TEST(ChatTemplate, ArbitraryBytesNeverCrash) {
  // Mutated copies of a real template: each parses and renders or fails with a status.
  const std::string base =
      "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
      "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}"
      "{{ '<|im_start|>assistant\\n' }}{% endif %}";
  const auto in = Inputs({{"user", "hi"}});
  uint32_t state = 2463534242u;
  auto next = [&state] {
    state ^= state << 13;
    state ^= state >> 17;
    state ^= state << 5;
    return state;
  };
  const std::string alphabet = "{}%#-+'\"[]().|:,=~ \nabcdefor";
  for (int round = 0; round < 2000; ++round) {
    std::string s = base;
    const int edits = 1 + next() % 4;
    for (int k = 0; k < edits; ++k) {
      const size_t pos = next() % s.size();
      switch (next() % 3) {
        case 0:
          s[pos] = alphabet[next() % alphabet.size()];
          break;
        case 1:
          s.erase(pos, 1 + next() % 3);
          break;
        default:
          s.insert(pos, 1, alphabet[next() % alphabet.size()]);
          break;
      }
    }
    auto t = ChatTemplate::Parse(s);
    if (t.ok()) (void)t->Render(in);
  }
}

}  // namespace
}  // namespace pw
