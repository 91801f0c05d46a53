// pw-cluster serving a model whose chat template uses Jinja the engine does not run (in
// chat_template.jinja beside the model, which wins over tokenizer_config.json, or in
// tokenizer_config.json): the node starts, completions are served, and chat requests (and
// /tokenize with messages) get a 400 that names the file, the line and column, and the
// construct. Real processes on loopback.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "tests/support/http_util.h"
#include "tests/support/process_util.h"

namespace pw {
namespace {

using nlohmann::json;
using testing::FreePort;
using testing::Http;

std::string ModelDir() { return std::string(PW_SOURCE_DIR) + "/models/tiny-moe"; }

// The template with an import (not supported) on line 2, as `file` in a copy of the embedded
// model: chat_template.jinja (beside the model, where transformers 5 saves it) or
// tokenizer_config.json's chat_template.
void ServeWithUnsupportedTemplate(const std::string& file) {
  const std::string dir = std::string(PW_BINARY_DIR) + "/test-tmp/chat-template-unsupported-" + file;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir + "/model");
  for (const auto& e : std::filesystem::directory_iterator(ModelDir())) {
    if (e.path().filename() == file) continue;
    std::filesystem::create_symlink(e.path(), dir + "/model/" + e.path().filename().string());
  }
  const std::string tpl =
      "{%- for message in messages %}\n"
      "   {%- import 'helpers.jinja' as helpers %}\n"
      "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}\n"
      "{%- endfor %}\n"
      "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}\n";
  if (file == "chat_template.jinja") {
    std::ofstream(dir + "/model/" + file) << tpl;
  } else {
    json cfg = json::parse(testing::ReadFile(ModelDir() + "/" + file));
    cfg["chat_template"] = tpl;
    std::ofstream(dir + "/model/" + file) << cfg.dump();
  }
  std::set<int> used;
  auto port = [&used] {
    int p;
    do p = FreePort(); while (!used.insert(p).second);
    return p;
  };
  const int http = port(), ctl = port(), broker = port();
  const std::string yaml = dir + "/cluster.yaml";
  std::ofstream(yaml) << "model_dir: " << dir << "/model\nmodel_name: tiny-moe\nrun_dir: " << dir
                      << "/run\nbin_dir: " << PW_BINARY_DIR << "/bin\n"
                      << "heartbeat_ms: 300\ndrain_timeout_ms: 3000\n"
                      << "router: {port: " << http << ", control_port: " << ctl << "}\n"
                      << "broker: {control_port: " << broker << "}\n"
                      << "prefill: [{id: prefill-0, kv_blocks: 64}]\n"
                      << "decode: [{id: decode-0, kv_blocks: 128}]\n"
                      << "restart: {initial_backoff_ms: 200, max_backoff_ms: 2000}\n";
  testing::ChildProcess cluster;
  ASSERT_TRUE(cluster.Start(
      {std::string(PW_BINARY_DIR) + "/bin/pw-cluster", "up", "--config", yaml},
      dir + "/run-pw-cluster.out"));
  const bool serving = testing::WaitServing(http, 120);
  EXPECT_TRUE(serving) << testing::RunLogs(dir + "/run");
  if (serving) {
    auto [status, body] = Http(http, "POST", "/v1/completions",
                               R"({"model":"tiny-moe","prompt":"The sea","max_tokens":4,)"
                               R"("temperature":0})");
    EXPECT_EQ(status, 200) << body;
    const std::string chat =
        R"({"model":"tiny-moe","messages":[{"role":"user","content":"Hi"}],"max_tokens":4})";
    auto [chat_status, chat_body] = Http(http, "POST", "/v1/chat/completions", chat);
    EXPECT_EQ(chat_status, 400) << chat_body;
    const json err = json::parse(chat_body, nullptr, false);
    ASSERT_TRUE(err.is_object() && err.contains("error")) << chat_body;
    const std::string message = err["error"]["message"].get<std::string>();
    for (const std::string& part : {std::string("chat completions are unavailable"), file,
                                    std::string("line 2, column 8"),
                                    std::string("unsupported statement 'import'")}) {
      EXPECT_NE(message.find(part), std::string::npos) << part << " not in: " << message;
    }
    auto [tok_status, tok_body] =
        Http(http, "POST", "/tokenize", R"({"messages":[{"role":"user","content":"Hi"}]})");
    EXPECT_EQ(tok_status, 400) << tok_body;
    EXPECT_NE(tok_body.find("line 2, column 8"), std::string::npos) << tok_body;
    // The router's log says why at start.
    const std::string log = testing::ReadFile(dir + "/run/router.log");
    EXPECT_NE(log.find("chat completions disabled"), std::string::npos) << log;
  }
  cluster.Kill(SIGTERM);
  if (cluster.Wait(20000) < 0) cluster.Kill(SIGKILL);
  testing::KillNodeProcesses({ctl, broker});
  testing::KillConfigProcesses(yaml);
}

TEST(ChatTemplateServing, UnsupportedTemplateServesCompletionsAndRefusesChatWithItsPosition) {
  if (!std::filesystem::exists(ModelDir() + "/model.safetensors")) {
    GTEST_SKIP() << "no weights in " << ModelDir();
  }
  for (const char* file : {"chat_template.jinja", "tokenizer_config.json"}) {
    SCOPED_TRACE(file);
    ServeWithUnsupportedTemplate(file);
  }
}

}  // namespace
}  // namespace pw
