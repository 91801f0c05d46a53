// libFuzzer target: config.json (ModelConfig) and YAML-with-schema parsing on arbitrary text.
// Both must return a status for anything malformed; accepted configs must be self-consistent.
#include <string>
#include <string_view>

#include "common/formats/model_config.h"
#include "common/formats/yaml_config.h"

namespace {

const pw::config::Schema& ClusterLikeSchema() {
  using pw::config::Schema;
  static const Schema s = Schema::Map({
      {"router", Schema::Map({{"host", Schema::String().Default("127.0.0.1")},
                              {"port", Schema::Int().Range(1, 65535).Default(8000)}})},
      {"workers",
       Schema::List(Schema::Map({
                        {"kind", Schema::String().OneOf({"prefill", "decode"}).Required()},
                        {"port", Schema::Int().Range(1, 65535).Required()},
                        {"ratio", Schema::Double().Range(0, 1).Default(0.5)},
                        {"on", Schema::Bool().Default(true)},
                    }))
           .Size(0, 16)},
      {"bits", Schema::MapOf(Schema::Int().Range(3, 8))},
      {"nested", Schema::List(Schema::List(Schema::String()))},
  });
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // First byte picks the parser so one corpus serves both.
  if (size == 0) return 0;
  std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  if (data[0] & 1) {
    auto c = pw::ParseModelConfig(text, "fuzz-config.json");
    if (c.ok()) {
      PW_CHECK(c->num_heads % c->num_kv_heads == 0);
      PW_CHECK(c->num_experts_per_tok <= c->num_experts);
      PW_CHECK(c->head_dim > 0 && c->decoder_sparse_step > 0);
      for (int64_t l = 0; l < c->num_layers && l < 4; ++l) (void)c->IsMoeLayer(l);
    }
  } else {
    auto v = pw::config::ParseYamlConfig(text, "fuzz.yaml", ClusterLikeSchema());
    if (v.ok()) {
      PW_CHECK((*v)["router"]["port"].AsInt() >= 1);
      if (v->Has("workers")) {
        for (const auto& w : (*v)["workers"].Items()) PW_CHECK(w["port"].AsInt() <= 65535);
      }
    } else {
      PW_CHECK(v.status().message().rfind("fuzz.yaml", 0) == 0);
    }
  }
  return 0;
}
