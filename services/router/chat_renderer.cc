#include "services/router/chat_renderer.h"

#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <sstream>

#include "common/text/chat_template.h"

namespace pw::router {

bool ChatTemplateTakesContentParts(const std::string& source) {
  static const std::regex kLoopOverContent(R"(\{%-?\s*for\s[^%]*\bin\s[^%]*content)");
  if (std::regex_search(source, kLoopOverContent)) return true;
  for (const char* test : {"is string", "is not string", "is iterable", "is sequence", "is mapping"}) {
    if (source.find(test) != std::string::npos) return true;
  }
  return false;
}

namespace {

// Each message's list of text parts as one string, the texts joined by "\n" (the parts were
// checked to be text parts by the request's parser).
nlohmann::ordered_json JoinTextParts(const nlohmann::ordered_json& messages) {
  nlohmann::ordered_json out = messages;
  for (auto& m : out) {
    auto content = m.find("content");
    if (content == m.end() || !content->is_array()) continue;
    std::string text;
    for (size_t k = 0; k < content->size(); ++k) {
      if (k > 0) text += "\n";
      text += (*content)[k].value("text", "");
    }
    *content = text;
  }
  return out;
}

}  // namespace

Result<ChatRenderer> MakeChatRenderer(const Tokenizer& tokenizer, const std::string& model_dir) {
  std::string source = tokenizer.chat_template();
  std::string origin = "tokenizer_config.json chat_template";
  const std::string jinja =
      model_dir.empty() ? "" : (std::filesystem::path(model_dir) / "chat_template.jinja").string();
  std::error_code ec;
  if (!jinja.empty() && std::filesystem::is_regular_file(jinja, ec)) {
    std::ifstream in(jinja, std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    if (!in.good() && !in.eof()) return IoError(jinja + ": cannot read");
    source = text.str();
    origin = jinja;
  }
  if (source.empty()) {
    return Unsupported("the model has no chat template (no chat_template.jinja, and "
                       "tokenizer_config.json has no chat_template)");
  }
  auto parsed = ChatTemplate::Parse(source);
  if (!parsed.ok()) return parsed.status().WithContext(origin);
  auto tmpl = std::make_shared<ChatTemplate>(std::move(*parsed));
  const bool takes_parts = ChatTemplateTakesContentParts(source);
  std::optional<std::string> bos, eos;
  if (!tokenizer.bos_token().empty()) bos = tokenizer.bos_token();
  if (!tokenizer.eos_token().empty()) eos = tokenizer.eos_token();
  return ChatRenderer([tmpl, bos, eos, takes_parts](const ChatPrompt& prompt) {
    ChatTemplateInputs in;
    in.messages = takes_parts ? prompt.messages : JoinTextParts(prompt.messages);
    in.tools = prompt.tools;
    in.kwargs = prompt.kwargs;
    in.add_generation_prompt = prompt.add_generation_prompt;
    in.continue_final_message = prompt.continue_final_message;
    in.bos_token = bos;
    in.eos_token = eos;
    return tmpl->Render(in);
  });
}

ChatRenderer ChatUnavailable(const Status& why) {
  const std::string message = "chat completions are unavailable: " + why.ToString();
  return ChatRenderer([message](const ChatPrompt&) -> Result<std::string> {
    return Unsupported(message);
  });
}

}  // namespace pw::router
