#include "common/formats/model_config.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "common/mmap_file.h"

namespace pw {
namespace {

using json = nlohmann::json;

const char* JsonTypeName(const json& v) { return v.type_name(); }

// Reads fields of one config.json object; every error names the file and the field.
class FieldReader {
 public:
  // `prefix` names the object the fields are in ("text_config.") in messages; empty at the top.
  FieldReader(const json& root, const std::string& label, std::string prefix = "")
      : root_(root), label_(label), prefix_(std::move(prefix)) {}

  Status Error(StatusCode code, const std::string& field, const std::string& what) const {
    return Status(code, label_ + ": field '" + prefix_ + field + "' " + what);
  }

  // The name a field has in this file when transformers 4.x and 5.x spell it differently (`a`
  // or `b`): the one present, `a` when neither is. Both present with different values is an
  // error naming both, never one of them silently preferred.
  Result<std::string> Alias(const std::string& a, const std::string& b) const {
    const json* va = Find(a);
    const json* vb = Find(b);
    if (va != nullptr && vb != nullptr && *va != *vb) {
      return Error(StatusCode::kInvalidArgument, a,
                   "is " + Dump(*va) + " but '" + prefix_ + b + "' is " + Dump(*vb) +
                       "; both name the same setting (transformers 4.x / 5.x), so they must agree");
    }
    return va == nullptr && vb != nullptr ? b : a;
  }

  static std::string Dump(const json& v) {
    return v.dump(-1, ' ', false, json::error_handler_t::replace).substr(0, 200);
  }

  // Present, null or not.
  bool Has(const std::string& key) const { return root_.contains(key); }

  // Present and not null.
  const json* Find(const std::string& key) const {
    auto it = root_.find(key);
    if (it == root_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  // An integer field. `def` empty means required.
  Status Int(const std::string& key, int64_t* out, std::optional<int64_t> def = std::nullopt,
             int64_t min = 0) const {
    const json* v = Find(key);
    if (v == nullptr) {
      if (!def) return Error(StatusCode::kInvalidArgument, key, "is required but missing");
      *out = *def;
      return Status::Ok();
    }
    if (v->is_number_unsigned()) {
      uint64_t u = v->get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) {
        return Error(StatusCode::kInvalidArgument, key, "is too large");
      }
      *out = static_cast<int64_t>(u);
    } else if (v->is_number_integer()) {
      *out = v->get<int64_t>();
    } else {
      return Error(StatusCode::kInvalidArgument, key,
                   std::string("must be an integer, got ") + JsonTypeName(*v));
    }
    if (*out < min) {
      return Error(StatusCode::kInvalidArgument, key,
                   "is " + std::to_string(*out) + ", must be >= " + std::to_string(min));
    }
    return Status::Ok();
  }

  Status OptInt(const std::string& key, std::optional<int64_t>* out) const {
    if (Find(key) == nullptr) {
      out->reset();
      return Status::Ok();
    }
    int64_t v;
    PW_RETURN_IF_ERROR(Int(key, &v, std::nullopt, INT64_MIN));
    *out = v;
    return Status::Ok();
  }

  Status Double(const std::string& key, double* out, double def, bool positive) const {
    const json* v = Find(key);
    if (v == nullptr) {
      *out = def;
      return Status::Ok();
    }
    if (!v->is_number()) {
      return Error(StatusCode::kInvalidArgument, key,
                   std::string("must be a number, got ") + JsonTypeName(*v));
    }
    *out = v->get<double>();
    if (positive && !(*out > 0)) {
      return Error(StatusCode::kInvalidArgument, key, "must be > 0");
    }
    return Status::Ok();
  }

  Status Bool(const std::string& key, bool* out, bool def) const {
    const json* v = Find(key);
    if (v == nullptr) {
      *out = def;
      return Status::Ok();
    }
    if (!v->is_boolean()) {
      return Error(StatusCode::kInvalidArgument, key,
                   std::string("must be true or false, got ") + JsonTypeName(*v));
    }
    *out = v->get<bool>();
    return Status::Ok();
  }

  Status IntList(const std::string& key, std::vector<int64_t>* out) const {
    out->clear();
    const json* v = Find(key);
    if (v == nullptr) return Status::Ok();
    if (!v->is_array()) {
      return Error(StatusCode::kInvalidArgument, key,
                   std::string("must be a list of integers, got ") + JsonTypeName(*v));
    }
    for (size_t i = 0; i < v->size(); ++i) {
      const json& e = (*v)[i];
      if (!e.is_number_integer()) {
        return Error(StatusCode::kInvalidArgument, key + "[" + std::to_string(i) + "]",
                     "must be an integer");
      }
      out->push_back(e.get<int64_t>());
    }
    return Status::Ok();
  }

  // eos_token_id: one integer or a list of integers.
  Status IntOrList(const std::string& key, std::vector<int64_t>* out) const {
    const json* v = Find(key);
    if (v != nullptr && v->is_array()) return IntList(key, out);
    out->clear();
    if (v == nullptr) return Status::Ok();
    int64_t x;
    PW_RETURN_IF_ERROR(Int(key, &x, std::nullopt, INT64_MIN));
    out->push_back(x);
    return Status::Ok();
  }

 private:
  const json& root_;
  const std::string& label_;
  std::string prefix_;
};

// RoPE as transformers 5.x writes it (rope_parameters: {rope_type, rope_theta, factor, ...}) or
// 4.x (rope_theta at the top, rope_scaling: {type | rope_type, factor, ...} or null), read the
// way HF's standardize_rope_params and rope init functions (modeling_rope_utils.py) read it.
Status ReadRope(const FieldReader& r, double theta_default, ModelConfig* c) {
  PW_ASSIGN_OR_RETURN(const std::string dict_name, r.Alias("rope_parameters", "rope_scaling"));
  const json* dict = r.Find(dict_name);
  if (dict != nullptr && !dict->is_object()) {
    return r.Error(StatusCode::kInvalidArgument, dict_name,
                   std::string("must be an object or null, got ") + JsonTypeName(*dict));
  }
  static const json kEmpty = json::object();
  static const std::string kNoLabel;  // d's own errors are never used: key_error names the dict
  const FieldReader d(dict != nullptr ? *dict : kEmpty, kNoLabel);
  auto key_error = [&](StatusCode code, const std::string& key, const std::string& what) {
    return r.Error(code, dict_name + "." + key, what);
  };
  // A value in the dict read with the top-level reader's checks, its errors naming the dict.
  auto dict_double = [&](const std::string& key, double* out, std::optional<double> def) -> Status {
    const json* v = d.Find(key);
    if (v == nullptr) {
      if (!def) return key_error(StatusCode::kInvalidArgument, key, "is required for this rope_type");
      *out = *def;
      return Status::Ok();
    }
    if (!v->is_number()) {
      return key_error(StatusCode::kInvalidArgument, key,
                       std::string("must be a number, got ") + JsonTypeName(*v));
    }
    *out = v->get<double>();
    if (!(*out > 0) || !std::isfinite(*out)) {
      return key_error(StatusCode::kInvalidArgument, key, "must be a finite number > 0");
    }
    return Status::Ok();
  };

  // The type: "rope_type" (or 4.x "type"), "default" when absent.
  std::string type = "default";
  {
    const json* a = d.Find("rope_type");
    const json* b = d.Find("type");
    if (a != nullptr && b != nullptr && *a != *b) {
      return key_error(StatusCode::kInvalidArgument, "rope_type",
                       "is " + FieldReader::Dump(*a) + " but '" + dict_name + ".type' is " +
                           FieldReader::Dump(*b) + "; they must agree");
    }
    const json* t = a != nullptr ? a : b;
    if (t != nullptr) {
      if (!t->is_string()) {
        return key_error(StatusCode::kInvalidArgument, a != nullptr ? "rope_type" : "type",
                         "must be a string");
      }
      type = t->get<std::string>();
    }
  }
  RopeScaling& s = c->rope_scaling;
  std::set<std::string> keys = {"rope_type", "type", "rope_theta", "partial_rotary_factor"};
  // Qwen3.5's M-RoPE splits the rotary frequencies among three position axes (time, height,
  // width); a text-only request has all three equal, so the split does not change RoPE.
  if (c->type == ModelType::kQwen35Moe) keys.insert({"mrope_section", "mrope_interleaved"});
  if (type == "default") {
    s.type = RopeType::kDefault;
  } else if (type == "linear") {
    s.type = RopeType::kLinear;
    keys.insert("factor");
  } else if (type == "dynamic") {
    s.type = RopeType::kDynamic;
    keys.insert("factor");
  } else if (type == "yarn") {
    s.type = RopeType::kYarn;
    keys.insert({"factor", "original_max_position_embeddings", "attention_factor", "beta_fast",
                 "beta_slow", "mscale", "mscale_all_dim", "truncate"});
  } else if (type == "llama3") {
    s.type = RopeType::kLlama3;
    keys.insert({"factor", "original_max_position_embeddings", "low_freq_factor",
                 "high_freq_factor"});
  } else {
    return key_error(StatusCode::kUnsupported, "rope_type",
                     "is '" + type.substr(0, 100) +
                         "'; supported: default, linear, dynamic, yarn, llama3");
  }
  if (dict != nullptr) {
    for (auto it = dict->begin(); it != dict->end(); ++it) {
      if (keys.count(it.key()) == 0) {
        return key_error(StatusCode::kUnsupported, it.key(),
                         "is not used by rope_type '" + type + "'; refused rather than ignored");
      }
    }
  }

  // rope_theta: top level (4.x) or in the dict (5.x).
  const json* top_theta = r.Find("rope_theta");
  const json* dict_theta = d.Find("rope_theta");
  if (top_theta != nullptr && dict_theta != nullptr && *top_theta != *dict_theta) {
    return r.Error(StatusCode::kInvalidArgument, "rope_theta",
                   "is " + FieldReader::Dump(*top_theta) + " but '" + dict_name +
                       ".rope_theta' is " + FieldReader::Dump(*dict_theta) +
                       "; they must agree");
  }
  if (dict_theta != nullptr) {
    PW_RETURN_IF_ERROR(dict_double("rope_theta", &c->rope_theta, std::nullopt));
  } else {
    PW_RETURN_IF_ERROR(r.Double("rope_theta", &c->rope_theta, theta_default, true));
  }
  // partial_rotary_factor: the rotary covers all of head_dim, except for glm4_moe (its family
  // parse reads the factor).
  for (const FieldReader* fr : {&r, &d}) {
    if (c->type == ModelType::kGlm4Moe || c->type == ModelType::kQwen3Next ||
        c->type == ModelType::kQwen35Moe) {
      break;
    }
    if (const json* p = fr->Find("partial_rotary_factor")) {
      if (!p->is_number() || p->get<double>() != 1.0) {
        const std::string name = fr == &r ? std::string("partial_rotary_factor")
                                          : dict_name + ".partial_rotary_factor";
        return r.Error(StatusCode::kUnsupported, name,
                       "is " + FieldReader::Dump(*p) + "; only 1 (rotary over all of head_dim)");
      }
    }
  }
  if (s.type == RopeType::kDefault) return Status::Ok();

  // original_max_position_embeddings: in the dict, or at the top level (HF gives the top level
  // priority; here both must agree); default max_position_embeddings as HF sets it.
  if (s.type == RopeType::kYarn || s.type == RopeType::kLlama3) {
    const json* top = r.Find("original_max_position_embeddings");
    const json* in = d.Find("original_max_position_embeddings");
    if (top != nullptr && in != nullptr && *top != *in) {
      return r.Error(StatusCode::kInvalidArgument, "original_max_position_embeddings",
                     "is " + FieldReader::Dump(*top) + " but '" + dict_name +
                         ".original_max_position_embeddings' is " + FieldReader::Dump(*in) +
                         "; they must agree");
    }
    if (in != nullptr) {
      if (!in->is_number_integer() || in->get<int64_t>() < 1) {
        return key_error(StatusCode::kInvalidArgument, "original_max_position_embeddings",
                         "must be an integer >= 1");
      }
      s.original_max_position_embeddings = in->get<int64_t>();
    } else {
      PW_RETURN_IF_ERROR(r.Int("original_max_position_embeddings",
                               &s.original_max_position_embeddings, c->max_position_embeddings,
                               1));
    }
  }
  if (s.type == RopeType::kYarn) {
    // factor may be absent: then max_position_embeddings / original (as HF).
    const double implicit = static_cast<double>(c->max_position_embeddings) /
                            static_cast<double>(s.original_max_position_embeddings);
    PW_RETURN_IF_ERROR(dict_double("factor", &s.factor, implicit));
    double beta_fast, beta_slow, mscale = 0, mscale_all_dim = 0;
    PW_RETURN_IF_ERROR(dict_double("beta_fast", &beta_fast, 32.0));
    PW_RETURN_IF_ERROR(dict_double("beta_slow", &beta_slow, 1.0));
    s.beta_fast = beta_fast;
    s.beta_slow = beta_slow;
    if (const json* t = d.Find("truncate")) {
      if (!t->is_boolean()) {
        return key_error(StatusCode::kInvalidArgument, "truncate", "must be true or false");
      }
      s.truncate = t->get<bool>();
    }
    for (auto [key, out] : {std::pair{"mscale", &mscale}, {"mscale_all_dim", &mscale_all_dim}}) {
      if (const json* v = d.Find(key)) {
        if (!v->is_number() || v->get<double>() < 0) {
          return key_error(StatusCode::kInvalidArgument, key, "must be a number >= 0");
        }
        *out = v->get<double>();
      }
    }
    s.mscale_all_dim = mscale_all_dim;
    // HF's yarn_get_mscale: 0.1 * m * ln(factor) + 1, or 1 when factor <= 1.
    auto get_mscale = [](double scale, double m) {
      return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0;
    };
    if (d.Find("attention_factor") != nullptr) {
      PW_RETURN_IF_ERROR(dict_double("attention_factor", &s.attention_factor, std::nullopt));
    } else if (mscale != 0 && mscale_all_dim != 0) {
      s.attention_factor = get_mscale(s.factor, mscale) / get_mscale(s.factor, mscale_all_dim);
    } else {
      s.attention_factor = get_mscale(s.factor, 1.0);
    }
  } else {
    PW_RETURN_IF_ERROR(dict_double("factor", &s.factor, std::nullopt));
  }
  if (s.type == RopeType::kLlama3) {
    PW_RETURN_IF_ERROR(dict_double("low_freq_factor", &s.low_freq_factor, std::nullopt));
    PW_RETURN_IF_ERROR(dict_double("high_freq_factor", &s.high_freq_factor, std::nullopt));
    if (!(s.high_freq_factor > s.low_freq_factor)) {
      return key_error(StatusCode::kInvalidArgument, "high_freq_factor",
                       "must be greater than low_freq_factor");
    }
  }
  return Status::Ok();
}

}  // namespace

const char* RopeTypeName(RopeType t) {
  switch (t) {
    case RopeType::kDefault:
      return "default";
    case RopeType::kLinear:
      return "linear";
    case RopeType::kDynamic:
      return "dynamic";
    case RopeType::kYarn:
      return "yarn";
    case RopeType::kLlama3:
      return "llama3";
    case RopeType::kProportional:
      return "proportional";
  }
  return "?";
}

const char* ModelTypeName(ModelType t) {
  switch (t) {
    case ModelType::kQwen2Moe:
      return "qwen2_moe";
    case ModelType::kQwen3Moe:
      return "qwen3_moe";
    case ModelType::kOlmoe:
      return "olmoe";
    case ModelType::kMixtral:
      return "mixtral";
    case ModelType::kGlm4Moe:
      return "glm4_moe";
    case ModelType::kQwen3Next:
      return "qwen3_next";
    case ModelType::kQwen35Moe:
      return "qwen3_5_moe_text";
    case ModelType::kGptOss:
      return "gpt_oss";
    case ModelType::kGemma4:
      return "gemma4_text";
    case ModelType::kDeepseekV3:
      return "deepseek_v3";
  }
  return "?";
}

int64_t ModelConfig::MaxHeadDim() const {
  int64_t m = head_dim;
  for (int64_t l = 0; l < num_layers; ++l) m = std::max(m, LayerHeadDim(l));
  return m;
}

int64_t ModelConfig::MaxKvWidth() const {
  int64_t m = num_kv_heads * head_dim;
  for (int64_t l = 0; l < num_layers; ++l) m = std::max(m, LayerKvHeads(l) * LayerHeadDim(l));
  return m;
}

int64_t ModelConfig::MaxContext() const {
  if (rope_scaling.type == RopeType::kDynamic && rope_scaling.factor > 1) {
    return static_cast<int64_t>(static_cast<double>(max_position_embeddings) *
                                rope_scaling.factor);
  }
  return max_position_embeddings;
}

bool ModelConfig::IsMoeLayer(int64_t layer) const {
  if (num_experts <= 0) return false;
  if (layer < first_k_dense_replace) return false;
  if (layer % moe_layer_freq != 0) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) {
    return false;
  }
  return (layer + 1) % decoder_sparse_step == 0;
}

std::string ModelConfig::Summary() const {
  std::string s = model_type + ": " + std::to_string(num_layers) + " layers, hidden " +
                  std::to_string(hidden_size) + ", " + std::to_string(num_heads) + "/" +
                  std::to_string(num_kv_heads) + " heads x " + std::to_string(head_dim);
  if (full_head_dim > 0 && (full_head_dim != head_dim || full_num_kv_heads != num_kv_heads)) {
    s += " (full layers " + std::to_string(num_heads) + "/" + std::to_string(full_num_kv_heads) +
         " x " + std::to_string(full_head_dim) + ")";
  }
  s += ", " + std::to_string(num_experts) + " experts top-" + std::to_string(num_experts_per_tok) +
       " ffn " + std::to_string(moe_intermediate_size);
  if (shared_expert_intermediate_size > 0) {
    s += ", shared expert " + std::to_string(shared_expert_intermediate_size);
  }
  if (mla.enabled()) {
    s += ", MLA latent " + std::to_string(mla.kv_lora_rank) + "+" +
         std::to_string(mla.qk_rope_head_dim) + " (q_lora " + std::to_string(mla.q_lora_rank) +
         ", v " + std::to_string(mla.v_head_dim) + ")";
  }
  s += ", vocab " + std::to_string(vocab_size);
  return s;
}

namespace {

// The HF defaults of the sigmoid-routed families' MoE fields.
struct SigmoidMoeDefaults {
  int64_t intermediate_size, first_k_dense_replace;
  double routed_scaling_factor;
  int64_t n_group, topk_group;
};
constexpr SigmoidMoeDefaults kGlm4MoeDefaults = {10944, 1, 1.0, 1, 1};     // Glm4MoeConfig
constexpr SigmoidMoeDefaults kDeepseekV3Defaults = {18432, 3, 2.5, 8, 4};  // DeepseekV3Config

// glm4_moe's and deepseek_v3's MoE fields, after num_experts and num_experts_per_tok. The
// grouping must divide the experts and leave room for top-k.
Status ParseSigmoidMoeExperts(const FieldReader& r, const SigmoidMoeDefaults& def,
                              ModelConfig* c) {
  PW_RETURN_IF_ERROR(r.Int("moe_intermediate_size", &c->moe_intermediate_size, std::nullopt, 1));
  PW_RETURN_IF_ERROR(r.Int("intermediate_size", &c->intermediate_size, def.intermediate_size, 1));
  PW_RETURN_IF_ERROR(
      r.Int("first_k_dense_replace", &c->first_k_dense_replace, def.first_k_dense_replace, 0));
  PW_RETURN_IF_ERROR(r.Bool("norm_topk_prob", &c->norm_topk_prob, true));
  PW_RETURN_IF_ERROR(r.Double("routed_scaling_factor", &c->routed_scaling_factor,
                              def.routed_scaling_factor, true));
  PW_RETURN_IF_ERROR(r.Int("n_shared_experts", &c->n_shared_experts, 1, 0));
  c->shared_expert_intermediate_size = c->n_shared_experts * c->moe_intermediate_size;
  PW_RETURN_IF_ERROR(r.Int("num_nextn_predict_layers", &c->num_nextn_predict_layers, 1, 0));
  PW_RETURN_IF_ERROR(r.Int("n_group", &c->n_group, def.n_group, 1));
  PW_RETURN_IF_ERROR(r.Int("topk_group", &c->topk_group, def.topk_group, 1));
  if (c->type == ModelType::kDeepseekV3) {
    PW_RETURN_IF_ERROR(r.Int("moe_layer_freq", &c->moe_layer_freq, 1, 1));
    // DeepSeek's own config.json names the gate (transformers' config does not): the engine
    // runs V3's sigmoid scores with the bias-corrected grouped top-k; V2's softmax or greedy
    // selection would route otherwise.
    for (const auto& [key, want] : {std::pair<const char*, const char*>{"scoring_func", "sigmoid"},
                                    {"topk_method", "noaux_tc"}}) {
      const json* v = r.Find(key);
      if (v != nullptr && (!v->is_string() || v->get<std::string>() != want)) {
        return r.Error(StatusCode::kUnsupported, key,
                       "is " + v->dump() + "; deepseek_v3 is served with " + want + " only");
      }
    }
  }
  const std::string experts = std::to_string(c->num_experts);
  if (c->num_experts % c->n_group != 0) {
    return r.Error(StatusCode::kInvalidArgument, "n_group",
                   "is " + std::to_string(c->n_group) + ", which does not divide n_routed_experts " +
                       experts);
  }
  const int64_t per_group = c->num_experts / c->n_group;
  if (c->n_group > 1 && per_group < 2) {
    return r.Error(StatusCode::kInvalidArgument, "n_group",
                   "is " + std::to_string(c->n_group) + ": groups of " +
                       std::to_string(per_group) + " of the " + experts +
                       " experts; a group is ranked by its two best scores and needs 2");
  }
  if (c->topk_group > c->n_group) {
    return r.Error(StatusCode::kInvalidArgument, "topk_group",
                   "is " + std::to_string(c->topk_group) + ", more than n_group " +
                       std::to_string(c->n_group));
  }
  if (c->num_experts_per_tok > c->topk_group * per_group) {
    return r.Error(StatusCode::kInvalidArgument, "num_experts_per_tok",
                   "is " + std::to_string(c->num_experts_per_tok) + ", more than the " +
                       std::to_string(c->topk_group * per_group) + " experts of topk_group " +
                       std::to_string(c->topk_group) + " groups");
  }
  if (c->first_k_dense_replace > c->num_layers) {
    return r.Error(StatusCode::kInvalidArgument, "first_k_dense_replace",
                   "is " + std::to_string(c->first_k_dense_replace) + ", more than the " +
                       std::to_string(c->num_layers) + " layers");
  }
  return Status::Ok();
}

// deepseek_v3's MLA dimensions (HF DeepseekV3Config's defaults); head_dim is the RoPE part, as
// HF sets it. Fields that restate a dimension (qk_head_dim, head_dim) must agree with it.
Status ParseMla(const FieldReader& r, ModelConfig* c) {
  MlaConfig& m = c->mla;
  // q_lora_rank null: q_proj straight from the hidden state; absent: HF's default.
  if (r.Find("q_lora_rank") != nullptr || !r.Has("q_lora_rank")) {
    PW_RETURN_IF_ERROR(r.Int("q_lora_rank", &m.q_lora_rank, 1536, 1));
  }
  PW_RETURN_IF_ERROR(r.Int("kv_lora_rank", &m.kv_lora_rank, 512, 1));
  PW_RETURN_IF_ERROR(r.Int("qk_nope_head_dim", &m.qk_nope_head_dim, 128, 1));
  PW_RETURN_IF_ERROR(r.Int("qk_rope_head_dim", &m.qk_rope_head_dim, 64, 2));
  PW_RETURN_IF_ERROR(r.Int("v_head_dim", &m.v_head_dim, 128, 1));
  PW_RETURN_IF_ERROR(r.Bool("rope_interleave", &m.rope_interleave, true));
  if (m.qk_rope_head_dim % 2 != 0) {
    return r.Error(StatusCode::kInvalidArgument, "qk_rope_head_dim",
                   "is " + std::to_string(m.qk_rope_head_dim) + "; RoPE needs it even");
  }
  for (auto [key, want, what] :
       {std::tuple{"qk_head_dim", m.qk_head_dim(), "qk_nope_head_dim + qk_rope_head_dim"},
        std::tuple{"head_dim", m.qk_rope_head_dim, "qk_rope_head_dim"}}) {
    if (r.Find(key) == nullptr) continue;
    int64_t v;
    PW_RETURN_IF_ERROR(r.Int(key, &v, std::nullopt, 1));
    if (v != want) {
      return r.Error(StatusCode::kInvalidArgument, key,
                     "is " + std::to_string(v) + ", but " + what + " is " +
                         std::to_string(want) + "; the MLA dimensions are inconsistent");
    }
  }
  c->head_dim = m.qk_rope_head_dim;
  return Status::Ok();
}

// An FP8 block-scaled checkpoint's quantization_config (DeepSeek-V3's: quant_method "fp8", fmt
// "e4m3", weight_block_size [128, 128]); anything else is refused naming the field.
Status ParseFp8Quantization(const FieldReader& r, ModelConfig* c) {
  const json* q = r.Find("quantization_config");
  if (q == nullptr) return Status::Ok();
  if (!q->is_object()) {
    return r.Error(StatusCode::kInvalidArgument, "quantization_config", "must be an object");
  }
  auto field = [&](const char* key) -> const json* {
    auto it = q->find(key);
    return it == q->end() || it->is_null() ? nullptr : &*it;
  };
  const json* method = field("quant_method");
  if (method == nullptr || *method != "fp8") {
    return r.Error(StatusCode::kUnsupported, "quantization_config.quant_method",
                   "is " + (method ? FieldReader::Dump(*method) : std::string("missing")) +
                       "; only \"fp8\" (block-scaled float8_e4m3fn) is read");
  }
  if (const json* fmt = field("fmt"); fmt != nullptr && *fmt != "e4m3") {
    return r.Error(StatusCode::kUnsupported, "quantization_config.fmt",
                   "is " + FieldReader::Dump(*fmt) + "; only \"e4m3\" is read");
  }
  const json* block = field("weight_block_size");
  if (block == nullptr || !block->is_array() || block->size() != 2 ||
      !(*block)[0].is_number_integer() || !(*block)[1].is_number_integer() ||
      (*block)[0].get<int64_t>() < 1 || (*block)[1].get<int64_t>() < 1) {
    return r.Error(StatusCode::kInvalidArgument, "quantization_config.weight_block_size",
                   "is " + (block ? FieldReader::Dump(*block) : std::string("missing")) +
                       "; it must be two integers >= 1 (rows, cols of one scale's block)");
  }
  c->fp8_block_rows = (*block)[0].get<int64_t>();
  c->fp8_block_cols = (*block)[1].get<int64_t>();
  return Status::Ok();
}

// qwen3_next's layer kinds and linear-attention shapes (HF Qwen3NextConfig's defaults): which
// layers are Gated DeltaNet, from layer_types or every full_attention_interval-th layer full
// attention. A list of the wrong length, an unknown kind, or value heads that the key heads
// do not divide is refused, naming the field.
Status ParseQwen3NextLayers(const FieldReader& r, ModelConfig* c) {
  LinearAttentionConfig& la = c->linear_attention;
  PW_RETURN_IF_ERROR(r.Int("linear_num_key_heads", &la.num_key_heads, 16, 1));
  PW_RETURN_IF_ERROR(r.Int("linear_num_value_heads", &la.num_value_heads, 32, 1));
  PW_RETURN_IF_ERROR(r.Int("linear_key_head_dim", &la.key_head_dim, 128, 1));
  PW_RETURN_IF_ERROR(r.Int("linear_value_head_dim", &la.value_head_dim, 128, 1));
  PW_RETURN_IF_ERROR(r.Int("linear_conv_kernel_dim", &la.conv_kernel, 4, 1));
  if (la.num_value_heads % la.num_key_heads != 0) {
    return r.Error(StatusCode::kInvalidArgument, "linear_num_value_heads",
                   "is " + std::to_string(la.num_value_heads) +
                       ", not a multiple of linear_num_key_heads " +
                       std::to_string(la.num_key_heads) +
                       " (each key head serves a whole group of value heads)");
  }
  la.layers.assign(static_cast<size_t>(c->num_layers), false);
  if (const json* lt = r.Find("layer_types")) {
    if (!lt->is_array()) {
      return r.Error(StatusCode::kInvalidArgument, "layer_types", "must be a list of strings");
    }
    if (lt->size() != static_cast<size_t>(c->num_layers)) {
      return r.Error(StatusCode::kInvalidArgument, "layer_types",
                     "has " + std::to_string(lt->size()) + " entries for num_hidden_layers " +
                         std::to_string(c->num_layers));
    }
    for (size_t i = 0; i < lt->size(); ++i) {
      const json& e = (*lt)[i];
      const std::string kind = e.is_string() ? e.get<std::string>() : "";
      if (kind != "linear_attention" && kind != "full_attention") {
        return r.Error(StatusCode::kUnsupported, "layer_types[" + std::to_string(i) + "]",
                       "is " + FieldReader::Dump(e) +
                           "; supported: \"linear_attention\", \"full_attention\"");
      }
      la.layers[i] = kind == "linear_attention";
    }
  } else {
    int64_t interval = 4;
    PW_RETURN_IF_ERROR(r.Int("full_attention_interval", &interval, 4, 1));
    for (int64_t l = 0; l < c->num_layers; ++l) {
      la.layers[static_cast<size_t>(l)] = (l + 1) % interval != 0;
    }
  }
  return Status::Ok();
}

// gpt_oss's attention and activation fields (HF GptOssConfig's defaults). layer_types must
// name every layer; the activation's constants are the ones the clamped SwiGLU op computes.
Status ParseGptOss(const FieldReader& r, ModelConfig* c) {
  PW_RETURN_IF_ERROR(r.Bool("attention_bias", &c->qkv_bias, true));
  c->o_bias = c->qkv_bias;
  c->qk_norm = QkNorm::kNone;
  c->attention_sinks = true;
  // HF's GptOssConfig defaults to YaRN (factor 32); a file without its RoPE settings is
  // refused rather than run with another RoPE.
  const json* rp = r.Find("rope_parameters");
  const json* rs = r.Find("rope_scaling");
  if ((rp == nullptr || rp->is_null()) && (rs == nullptr || rs->is_null())) {
    return r.Error(StatusCode::kInvalidArgument, "rope_parameters",
                   "is missing (and rope_scaling too); gpt_oss's YaRN settings must be given");
  }
  PW_RETURN_IF_ERROR(r.Int("sliding_window", &c->sliding_window, 128, 1));
  const size_t n = static_cast<size_t>(c->num_layers);
  c->layer_sliding.assign(n, false);
  if (const json* lt = r.Find("layer_types"); lt != nullptr && !lt->is_null()) {
    if (!lt->is_array()) {
      return r.Error(StatusCode::kInvalidArgument, "layer_types", "must be a list of strings");
    }
    if (lt->size() != n) {
      return r.Error(StatusCode::kInvalidArgument, "layer_types",
                     "has " + std::to_string(lt->size()) + " entries, but num_hidden_layers is " +
                         std::to_string(n));
    }
    for (size_t i = 0; i < n; ++i) {
      const json& e = (*lt)[i];
      const std::string v = e.is_string() ? e.get<std::string>() : "";
      if (v != "sliding_attention" && v != "full_attention") {
        return r.Error(StatusCode::kInvalidArgument, "layer_types[" + std::to_string(i) + "]",
                       "is " + FieldReader::Dump(e) +
                           "; expected \"sliding_attention\" or \"full_attention\"");
      }
      c->layer_sliding[i] = v == "sliding_attention";
    }
  } else {
    for (size_t i = 0; i < n; ++i) c->layer_sliding[i] = (i + 1) % 2 != 0;  // HF's default
  }
  double alpha = 1.702, limit = 7.0;
  PW_RETURN_IF_ERROR(r.Double("swiglu_alpha", &alpha, 1.702, true));
  PW_RETURN_IF_ERROR(r.Double("swiglu_limit", &limit, 7.0, true));
  if (alpha != 1.702) {
    return r.Error(StatusCode::kUnsupported, "swiglu_alpha",
                   "is " + std::to_string(alpha) + "; only gpt-oss's 1.702 is served");
  }
  if (limit != 7.0) {
    return r.Error(StatusCode::kUnsupported, "swiglu_limit",
                   "is " + std::to_string(limit) + "; only gpt-oss's 7 is served");
  }
  return Status::Ok();
}

// gemma4's per-layer-type RoPE: rope_parameters.{sliding_attention, full_attention}, each
// {rope_type "default" | "proportional", rope_theta, partial_rotary_factor, factor} (HF's
// defaults when rope_parameters is absent: sliding default 10000, full proportional 0.25 1e6).
Status ReadGemma4Rope(const FieldReader& r, ModelConfig* c) {
  const json* rp = r.Find("rope_parameters");
  if (rp == nullptr) {
    c->sliding_rope_theta = 10000.0;
    c->rope_theta = 1e6;
    c->rope_scaling.type = RopeType::kProportional;
    c->rope_scaling.proportion = 0.25;
    return Status::Ok();
  }
  if (!rp->is_object()) {
    return r.Error(StatusCode::kInvalidArgument, "rope_parameters",
                   std::string("must be an object, got ") + JsonTypeName(*rp));
  }
  for (const auto& [kind, v] : rp->items()) {
    if (kind != "sliding_attention" && kind != "full_attention") {
      return r.Error(StatusCode::kUnsupported, "rope_parameters." + kind,
                     "is not a layer type of gemma4 (sliding_attention, full_attention)");
    }
  }
  for (const char* kind : {"sliding_attention", "full_attention"}) {
    const std::string at = std::string("rope_parameters.") + kind;
    auto it = rp->find(kind);
    if (it == rp->end() || !it->is_object()) {
      return r.Error(StatusCode::kInvalidArgument, at,
                     "must be an object with rope_type and rope_theta");
    }
    static const std::string kNoLabel;
    const FieldReader d(*it, kNoLabel);
    const json* type = d.Find("rope_type");
    const std::string t = type != nullptr && type->is_string() ? type->get<std::string>() : "";
    if (t != "default" && t != "proportional") {
      return r.Error(StatusCode::kUnsupported, at + ".rope_type",
                     "is " + (type ? FieldReader::Dump(*type) : std::string("missing")) +
                         "; gemma4 layers take \"default\" or \"proportional\"");
    }
    for (const auto& [key, value] : it->items()) {
      if (key != "rope_type" && key != "rope_theta" &&
          !(t == "proportional" && (key == "partial_rotary_factor" || key == "factor"))) {
        return r.Error(StatusCode::kUnsupported, at + "." + key,
                       "is not used by rope_type '" + t + "'; refused rather than ignored");
      }
    }
    double theta = 0, proportion = 1, factor = 1;
    auto number = [&](const char* key, double* out, std::optional<double> def) -> Status {
      const json* v = d.Find(key);
      if (v == nullptr) {
        if (!def) return r.Error(StatusCode::kInvalidArgument, at + "." + key, "is required");
        *out = *def;
        return Status::Ok();
      }
      if (!v->is_number() || !(v->get<double>() > 0) || !std::isfinite(v->get<double>())) {
        return r.Error(StatusCode::kInvalidArgument, at + "." + key, "must be a finite number > 0");
      }
      *out = v->get<double>();
      return Status::Ok();
    };
    PW_RETURN_IF_ERROR(number("rope_theta", &theta, std::nullopt));
    PW_RETURN_IF_ERROR(number("partial_rotary_factor", &proportion, 1.0));
    PW_RETURN_IF_ERROR(number("factor", &factor, 1.0));
    if (proportion > 1) {
      return r.Error(StatusCode::kInvalidArgument, at + ".partial_rotary_factor",
                     "is " + std::to_string(proportion) + "; must be in (0, 1]");
    }
    RopeScaling sc;
    sc.type = t == "default" ? RopeType::kDefault : RopeType::kProportional;
    sc.factor = factor;
    sc.proportion = proportion;
    if (std::string(kind) == "sliding_attention") {
      c->sliding_rope_theta = theta;
      c->sliding_rope_scaling = sc;
    } else {
      c->rope_theta = theta;
      c->rope_scaling = sc;
    }
  }
  return Status::Ok();
}

// gemma4's full-attention layers' shape (after layer_types, num_key_value_heads, head_dim and
// attention_k_eq_v). HF's Gemma4TextConfig derives a per_layer_config for the full layers from
// global_head_dim (default 512) and, with attention_k_eq_v, num_global_key_value_heads (absent:
// no override); a per_layer_config in the file (transformers 5 writes one) replaces both. Its
// keys are layer indices, its overrides head_dim and num_key_value_heads; HF's RoPE takes one
// shape per layer type, so every full layer must have the same and the sliding layers the
// top-level one.
Status ReadGemma4FullShape(const FieldReader& r, const json& root, ModelConfig* c) {
  const size_t n = c->layer_sliding.size();
  int64_t full_hd = c->head_dim, full_kv = c->num_kv_heads;
  std::string hd_from = "head_dim", kv_from = "num_key_value_heads";
  bool any_full = false;
  for (size_t i = 0; i < n; ++i) any_full = any_full || !c->layer_sliding[i];
  if (const json* plc = r.Find("per_layer_config")) {
    if (!plc->is_object()) {
      return r.Error(StatusCode::kInvalidArgument, "per_layer_config", "must be an object");
    }
    std::vector<int64_t> hd(n, c->head_dim), kv(n, c->num_kv_heads);
    std::vector<std::string> hd_at(n, "head_dim"), kv_at(n, "num_key_value_heads");
    for (const auto& [key, o] : plc->items()) {
      const std::string at = "per_layer_config." + key;
      size_t used = 0;
      long long layer = -1;
      try {
        layer = std::stoll(key, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != key.size() || layer < 0 || static_cast<size_t>(layer) >= n) {
        return r.Error(StatusCode::kInvalidArgument, at,
                       "is not a layer index in [0, " + std::to_string(n) + ")");
      }
      if (!o.is_object()) return r.Error(StatusCode::kInvalidArgument, at, "must be an object");
      const size_t l = static_cast<size_t>(layer);
      for (const auto& [field, v] : o.items()) {
        if (field != "head_dim" && field != "num_key_value_heads") {
          return r.Error(StatusCode::kUnsupported, at + "." + field,
                         "is a per-layer override of a field not served per layer (only "
                         "head_dim and num_key_value_heads)");
        }
        if (!v.is_number_integer() || v.get<int64_t>() < 1) {
          return r.Error(StatusCode::kInvalidArgument, at + "." + field,
                         "is " + FieldReader::Dump(v) + "; must be an integer >= 1");
        }
        (field == "head_dim" ? hd : kv)[l] = v.get<int64_t>();
        (field == "head_dim" ? hd_at : kv_at)[l] = at + "." + field;
      }
    }
    size_t first = n;  // the first full layer
    for (size_t l = 0; l < n; ++l) {
      if (c->layer_sliding[l]) {
        if (hd[l] != c->head_dim || kv[l] != c->num_kv_heads) {
          const bool dim = hd[l] != c->head_dim;
          return r.Error(StatusCode::kUnsupported, dim ? hd_at[l] : kv_at[l],
                         "is " + std::to_string(dim ? hd[l] : kv[l]) + " on sliding layer " +
                             std::to_string(l) +
                             "; sliding layers take the top-level head_dim and "
                             "num_key_value_heads");
        }
        continue;
      }
      if (first == n) {
        first = l;
        full_hd = hd[l], full_kv = kv[l], hd_from = hd_at[l], kv_from = kv_at[l];
      } else if (hd[l] != full_hd || kv[l] != full_kv) {
        auto shape = [&](size_t i) {
          return std::to_string(kv[i]) + " kv heads x " + std::to_string(hd[i]);
        };
        return r.Error(StatusCode::kInvalidArgument, "per_layer_config",
                       "gives full_attention layer " + std::to_string(first) + " " + shape(first) +
                           " and layer " + std::to_string(l) + " " + shape(l) +
                           "; every full_attention layer must have one shape (HF's RoPE takes "
                           "one per layer type)");
      }
    }
    // The fields per_layer_config replaces must not say otherwise.
    int64_t v = 0;
    if (any_full && r.Find("global_head_dim") != nullptr) {
      PW_RETURN_IF_ERROR(r.Int("global_head_dim", &v, std::nullopt, 1));
      if (v != full_hd) {
        return r.Error(StatusCode::kInvalidArgument, "global_head_dim",
                       "is " + std::to_string(v) + ", but " + hd_from + " gives the full layers " +
                           std::to_string(full_hd));
      }
    }
    if (any_full && c->k_eq_v && r.Find("num_global_key_value_heads") != nullptr) {
      PW_RETURN_IF_ERROR(r.Int("num_global_key_value_heads", &v, std::nullopt, 1));
      if (v != full_kv) {
        return r.Error(StatusCode::kInvalidArgument, "num_global_key_value_heads",
                       "is " + std::to_string(v) + ", but " + kv_from + " gives the full layers " +
                           std::to_string(full_kv));
      }
    }
  } else if (any_full) {
    PW_RETURN_IF_ERROR(r.Int("global_head_dim", &full_hd, 512, 2));
    hd_from = "global_head_dim";
    if (!root.contains("global_head_dim")) hd_from += " (absent: HF's 512)";
    // HF reads num_global_key_value_heads only with attention_k_eq_v.
    if (c->k_eq_v && r.Find("num_global_key_value_heads") != nullptr) {
      PW_RETURN_IF_ERROR(r.Int("num_global_key_value_heads", &full_kv, std::nullopt, 1));
      kv_from = "num_global_key_value_heads";
    }
  }
  if (!any_full) return Status::Ok();
  if (full_hd % 2 != 0) {
    return r.Error(StatusCode::kInvalidArgument, hd_from,
                   "is " + std::to_string(full_hd) +
                       "; the full layers' head size must be even "
                       "for RoPE");
  }
  if (c->num_heads % full_kv != 0) {
    return r.Error(StatusCode::kInvalidArgument, kv_from,
                   "is " + std::to_string(full_kv) + ", which does not divide " +
                       "num_attention_heads " + std::to_string(c->num_heads));
  }
  c->full_head_dim = full_hd;
  c->full_num_kv_heads = full_kv;
  return Status::Ok();
}

// gemma4_text (HF Gemma4TextConfig's defaults): the MoE variant's text stack. Fields of the
// variants not served are refused naming the field (model_config.h).
Status ParseGemma4(const FieldReader& r, const json& root, ModelConfig* c) {
  auto refuse = [&](const std::string& field, const std::string& what) {
    return r.Error(StatusCode::kUnsupported, field, what);
  };
  PW_RETURN_IF_ERROR(r.Int("hidden_size", &c->hidden_size, std::nullopt, 1));
  PW_RETURN_IF_ERROR(r.Int("num_hidden_layers", &c->num_layers, std::nullopt, 1));
  PW_RETURN_IF_ERROR(r.Int("num_attention_heads", &c->num_heads, std::nullopt, 1));
  PW_RETURN_IF_ERROR(r.Int("vocab_size", &c->vocab_size, std::nullopt, 1));
  PW_RETURN_IF_ERROR(r.Int("num_key_value_heads", &c->num_kv_heads, 4, 1));
  if (c->num_heads % c->num_kv_heads != 0) {
    return r.Error(StatusCode::kInvalidArgument, "num_key_value_heads",
                   "is " + std::to_string(c->num_kv_heads) + ", which does not divide " +
                       "num_attention_heads " + std::to_string(c->num_heads));
  }
  PW_RETURN_IF_ERROR(r.Int("head_dim", &c->head_dim, 256, 2));
  if (c->head_dim % 2 != 0) {
    return r.Error(StatusCode::kInvalidArgument, "head_dim", "must be even for RoPE");
  }
  c->rotary_dim = c->head_dim;
  PW_RETURN_IF_ERROR(r.Int("max_position_embeddings", &c->max_position_embeddings, 131072, 1));
  PW_RETURN_IF_ERROR(r.Double("rms_norm_eps", &c->rms_norm_eps, 1e-6, true));
  PW_RETURN_IF_ERROR(r.Bool("tie_word_embeddings", &c->tie_word_embeddings, true));
  if (const json* act = r.Find("hidden_activation");
      act != nullptr && (!act->is_string() || act->get<std::string>() != "gelu_pytorch_tanh")) {
    return refuse("hidden_activation",
                  "is " + FieldReader::Dump(*act) + "; only \"gelu_pytorch_tanh\" is served");
  }

  // The variants not served.
  bool moe = false;
  PW_RETURN_IF_ERROR(r.Bool("enable_moe_block", &moe, false));
  if (!moe) {
    return refuse("enable_moe_block",
                  "is false (or absent: HF's default); only Gemma-4's MoE variant is served");
  }
  if (const json* v = r.Find("hidden_size_per_layer_input");
      !root.contains("hidden_size_per_layer_input") ||
      (v != nullptr && !(v->is_number_integer() && v->get<int64_t>() == 0))) {
    return refuse("hidden_size_per_layer_input",
                  (v != nullptr ? "is " + FieldReader::Dump(*v)
                                : std::string("is absent (HF's default 256)")) +
                      "; per-layer inputs are not supported (0 or null: none)");
  }
  int64_t shared = 0;
  PW_RETURN_IF_ERROR(r.Int("num_kv_shared_layers", &shared, 0, 0));
  if (shared != 0) {
    return refuse("num_kv_shared_layers",
                  "is " + std::to_string(shared) + "; KV shared between layers is not supported");
  }
  // "vision": image tokens attend both ways, text causally (HF masks text-only input
  // causally), so a text-only server runs it as causal.
  if (const json* v = r.Find("use_bidirectional_attention");
      v != nullptr && !(v->is_string() && v->get<std::string>() == "vision")) {
    return refuse("use_bidirectional_attention",
                  "is " + FieldReader::Dump(*v) +
                      "; only causal attention (null, or \"vision\" on text) is served");
  }
  bool bias = false;
  PW_RETURN_IF_ERROR(r.Bool("attention_bias", &bias, false));
  if (bias) return refuse("attention_bias", "is true; gemma4 attention with biases is not served");
  PW_RETURN_IF_ERROR(r.Bool("attention_k_eq_v", &c->k_eq_v, false));

  // Layer types, then the full layers' shape.
  PW_RETURN_IF_ERROR(r.Int("sliding_window", &c->sliding_window, 512, 1));
  const size_t n = static_cast<size_t>(c->num_layers);
  c->layer_sliding.assign(n, false);
  if (const json* lt = r.Find("layer_types")) {
    if (!lt->is_array()) {
      return r.Error(StatusCode::kInvalidArgument, "layer_types", "must be a list of strings");
    }
    if (lt->size() != n) {
      return r.Error(StatusCode::kInvalidArgument, "layer_types",
                     "has " + std::to_string(lt->size()) + " entries, but num_hidden_layers is " +
                         std::to_string(n));
    }
    for (size_t i = 0; i < n; ++i) {
      const json& e = (*lt)[i];
      const std::string v = e.is_string() ? e.get<std::string>() : "";
      if (v != "sliding_attention" && v != "full_attention") {
        return r.Error(StatusCode::kInvalidArgument, "layer_types[" + std::to_string(i) + "]",
                       "is " + FieldReader::Dump(e) +
                           "; expected \"sliding_attention\" or \"full_attention\"");
      }
      c->layer_sliding[i] = v == "sliding_attention";
    }
    if (c->layer_sliding[n - 1]) {
      // HF forces the last layer to full attention (with a warning); the file must say so.
      return r.Error(StatusCode::kInvalidArgument, "layer_types[" + std::to_string(n - 1) + "]",
                     "is \"sliding_attention\"; Gemma-4's last layer is \"full_attention\"");
    }
  } else {
    for (size_t i = 0; i + 1 < n; ++i) c->layer_sliding[i] = (i + 1) % 6 != 0;  // HF's 5:1
  }
  PW_RETURN_IF_ERROR(ReadGemma4FullShape(r, root, c));
  PW_RETURN_IF_ERROR(ReadGemma4Rope(r, c));
  c->sliding_rope = true;
  c->qk_norm = QkNorm::kPerHead;
  c->v_norm = true;
  c->attention_scale = 1.0;
  c->scale_embeddings = true;
  PW_RETURN_IF_ERROR(r.Double("final_logit_softcapping", &c->final_logit_softcapping, 0, true));
  {
    PW_ASSIGN_OR_RETURN(const std::string name, r.Alias("dtype", "torch_dtype"));
    if (const json* dt = r.Find(name)) {
      const std::string v = dt->is_string() ? dt->get<std::string>() : "";
      if (v != "bfloat16" && v != "float16" && v != "float32") {
        return refuse(name, "is " + FieldReader::Dump(*dt) +
                                "; supported: \"bfloat16\", \"float16\", \"float32\"");
      }
      c->dtype = v;
    }
  }

  // Experts: every layer, beside a dense MLP; the top-k weights renormalised.
  PW_RETURN_IF_ERROR(r.Int("num_experts", &c->num_experts, std::nullopt, 1));
  PW_RETURN_IF_ERROR(r.Int("top_k_experts", &c->num_experts_per_tok, std::nullopt, 1));
  if (c->num_experts_per_tok > c->num_experts) {
    return r.Error(StatusCode::kInvalidArgument, "top_k_experts",
                   "is " + std::to_string(c->num_experts_per_tok) + ", more than the " +
                       std::to_string(c->num_experts) + " experts");
  }
  PW_RETURN_IF_ERROR(r.Int("moe_intermediate_size", &c->moe_intermediate_size, std::nullopt, 1));
  PW_RETURN_IF_ERROR(r.Int("intermediate_size", &c->intermediate_size, 9216, 1));
  c->norm_topk_prob = true;

  PW_RETURN_IF_ERROR(r.OptInt("bos_token_id", &c->bos_token_id));
  PW_RETURN_IF_ERROR(r.IntOrList("eos_token_id", &c->eos_token_ids));
  PW_RETURN_IF_ERROR(r.OptInt("pad_token_id", &c->pad_token_id));
  if (!root.contains("bos_token_id")) c->bos_token_id = 2;
  if (!root.contains("eos_token_id")) c->eos_token_ids = {1};
  if (!root.contains("pad_token_id")) c->pad_token_id = 0;
  return Status::Ok();
}

}  // namespace

Result<ModelConfig> ParseModelConfig(const std::string& text, const std::string& label) {
  json file;
  try {
    file = json::parse(text);
  } catch (const std::exception& e) {
    return InvalidArgument(label + ": not valid JSON: " + e.what());
  }
  if (!file.is_object()) return InvalidArgument(label + ": top level is not a JSON object");

  // A multimodal wrapper keeps the language model's fields in text_config (transformers 5.x
  // and 4.x alike); everything below reads them from there.
  ModelConfig c;
  const json* body = &file;
  if (auto tc = file.find("text_config"); tc != file.end() && !tc->is_null()) {
    FieldReader top(file, label);
    if (!tc->is_object()) {
      return top.Error(StatusCode::kInvalidArgument, "text_config",
                       std::string("must be an object, got ") + JsonTypeName(*tc));
    }
    const json* wmt = top.Find("model_type");
    c.wrapper_model_type = wmt != nullptr && wmt->is_string() ? wmt->get<std::string>() : "?";
    body = &*tc;
  }
  const json& root = *body;
  FieldReader r(root, label, c.wrapper_model_type.empty() ? "" : "text_config.");

  const json* mt = r.Find("model_type");
  if (mt == nullptr) return r.Error(StatusCode::kInvalidArgument, "model_type", "is missing");
  if (!mt->is_string()) {
    return r.Error(StatusCode::kInvalidArgument, "model_type", "must be a string");
  }
  c.model_type = mt->get<std::string>();
  if (c.model_type == "qwen2_moe") {
    c.type = ModelType::kQwen2Moe;
  } else if (c.model_type == "qwen3_moe") {
    c.type = ModelType::kQwen3Moe;
  } else if (c.model_type == "olmoe") {
    c.type = ModelType::kOlmoe;
  } else if (c.model_type == "mixtral") {
    c.type = ModelType::kMixtral;
  } else if (c.model_type == "glm4_moe") {
    c.type = ModelType::kGlm4Moe;
  } else if (c.model_type == "qwen3_next") {
    c.type = ModelType::kQwen3Next;
  } else if (c.model_type == "qwen3_5_moe_text") {
    c.type = ModelType::kQwen35Moe;
  } else if (c.model_type == "gpt_oss") {
    c.type = ModelType::kGptOss;
  } else if (c.model_type == "gemma4_text") {
    c.type = ModelType::kGemma4;
  } else if (c.model_type == "deepseek_v3") {
    c.type = ModelType::kDeepseekV3;
  } else if (c.model_type == "kimi_k2") {
    // Kimi-K2 ships its own model_type over DeepSeek-V3's architecture (and modeling code).
    const json* arch = r.Find("architectures");
    if (arch == nullptr || !arch->is_array() ||
        std::find(arch->begin(), arch->end(), json("DeepseekV3ForCausalLM")) == arch->end()) {
      return r.Error(StatusCode::kUnsupported, "architectures",
                     "is " + (arch ? FieldReader::Dump(*arch) : std::string("missing")) +
                         "; model_type 'kimi_k2' is served as deepseek_v3 only with the "
                         "DeepseekV3ForCausalLM architecture");
    }
    c.type = ModelType::kDeepseekV3;
  } else {
    return r.Error(StatusCode::kUnsupported, "model_type",
                   "is '" + c.model_type.substr(0, 100) +
                       "'; supported: qwen2_moe, qwen3_moe, olmoe, mixtral, glm4_moe, qwen3_next, "
                       "qwen3_5_moe_text, gpt_oss, gemma4_text, deepseek_v3, kimi_k2");
  }
  if (!c.wrapper_model_type.empty() && c.wrapper_model_type != "?") {
    for (ModelType w : {ModelType::kQwen2Moe, ModelType::kQwen3Moe, ModelType::kOlmoe,
                        ModelType::kMixtral, ModelType::kQwen3Next}) {
      if (c.wrapper_model_type == ModelTypeName(w)) {
        return Status(StatusCode::kInvalidArgument,
                      label + ": model_type '" + c.wrapper_model_type +
                          "' is a text model, but the file also has a text_config");
      }
    }
  }
  const ModelType t = c.type;
  // The Gated DeltaNet hybrids (linear_attention_config.h).
  const bool hybrid = t == ModelType::kQwen3Next || t == ModelType::kQwen35Moe;
  const bool qwen = t == ModelType::kQwen2Moe || t == ModelType::kQwen3Moe || hybrid;
  if (t == ModelType::kQwen35Moe && c.wrapper_model_type == "qwen3_5_moe") {
    c.weights_prefix = "model.language_model.";
  }
  if (t == ModelType::kGemma4) {
    if (c.wrapper_model_type == "gemma4") c.weights_prefix = "model.language_model.";
    PW_RETURN_IF_ERROR(ParseGemma4(r, root, &c));
    return c;
  }

  // Body.
  PW_RETURN_IF_ERROR(r.Int("hidden_size", &c.hidden_size, std::nullopt, 1));
  PW_RETURN_IF_ERROR(r.Int("num_hidden_layers", &c.num_layers, std::nullopt, 1));
  PW_RETURN_IF_ERROR(r.Int("num_attention_heads", &c.num_heads, std::nullopt, 1));
  PW_RETURN_IF_ERROR(r.Int("vocab_size", &c.vocab_size, std::nullopt, 1));
  // Absent num_key_value_heads takes the class default (qwen2_moe 16, qwen3_moe 4, mixtral 8);
  // olmoe's default, and an explicit null for any type, mean num_attention_heads (no GQA).
  int64_t kv_default = c.num_heads;
  if (!root.contains("num_key_value_heads")) {
    if (t == ModelType::kQwen2Moe) kv_default = 16;
    if (t == ModelType::kQwen3Moe) kv_default = 4;
    if (t == ModelType::kMixtral) kv_default = 8;
    if (t == ModelType::kGlm4Moe || t == ModelType::kGptOss) kv_default = 8;
    if (hybrid) kv_default = 2;
  }
  PW_RETURN_IF_ERROR(r.Int("num_key_value_heads", &c.num_kv_heads, kv_default, 1));
  if (c.num_heads % c.num_kv_heads != 0) {
    return r.Error(StatusCode::kInvalidArgument, "num_key_value_heads",
                   "is " + std::to_string(c.num_kv_heads) + ", which does not divide " +
                       "num_attention_heads " + std::to_string(c.num_heads));
  }
  if (t == ModelType::kOlmoe) {
    if (c.hidden_size % c.num_heads != 0) {
      return r.Error(StatusCode::kInvalidArgument, "num_attention_heads",
                     "does not divide hidden_size " + std::to_string(c.hidden_size));
    }
    c.head_dim = c.hidden_size / c.num_heads;  // olmoe ignores any head_dim field
  } else if (t == ModelType::kDeepseekV3) {
    PW_RETURN_IF_ERROR(ParseMla(r, &c));
  } else {
    PW_RETURN_IF_ERROR(r.Int("head_dim", &c.head_dim, c.hidden_size / c.num_heads, 1));
    if (c.head_dim == 0) {
      return r.Error(StatusCode::kInvalidArgument, "head_dim", "is 0 (hidden_size < heads?)");
    }
    if (t == ModelType::kQwen2Moe && c.head_dim * c.num_heads != c.hidden_size) {
      return r.Error(StatusCode::kInvalidArgument, "head_dim",
                     "x num_attention_heads must equal hidden_size for qwen2_moe");
    }
  }
  if (c.head_dim % 2 != 0) {
    return r.Error(StatusCode::kInvalidArgument, "head_dim", "must be even for RoPE");
  }
  const int64_t max_pos_default = t == ModelType::kOlmoe     ? 4096
                                  : t == ModelType::kMixtral ? 4096 * 32
                                  : t == ModelType::kGlm4Moe ? 131072
                                  : t == ModelType::kGptOss  ? 131072
                                  : t == ModelType::kDeepseekV3 ? 4096
                                                             : 32768;
  PW_RETURN_IF_ERROR(
      r.Int("max_position_embeddings", &c.max_position_embeddings, max_pos_default, 1));
  PW_RETURN_IF_ERROR(r.Double("rms_norm_eps", &c.rms_norm_eps,
                              qwen || t == ModelType::kDeepseekV3 ? 1e-6 : 1e-5, true));
  PW_RETURN_IF_ERROR(ReadRope(r,
                              t == ModelType::kMixtral  ? 1e6
                              : t == ModelType::kGptOss ? 150000.0
                                                        : 10000.0,
                              &c));
  PW_RETURN_IF_ERROR(r.Bool("tie_word_embeddings", &c.tie_word_embeddings, false));
  {
    PW_ASSIGN_OR_RETURN(const std::string name, r.Alias("dtype", "torch_dtype"));
    if (const json* dt = r.Find(name)) {
      const std::string v = dt->is_string() ? dt->get<std::string>() : "";
      if (v != "bfloat16" && v != "float16" && v != "float32") {
        return r.Error(StatusCode::kUnsupported, name,
                       "is " + FieldReader::Dump(*dt) +
                           "; supported: \"bfloat16\", \"float16\", \"float32\"");
      }
      c.dtype = v;
    }
  }

  // Refusals.
  if (const json* act = r.Find("hidden_act")) {
    if (!act->is_string() || act->get<std::string>() != "silu") {
      return r.Error(StatusCode::kUnsupported, "hidden_act",
                     "is " +
                         act->dump(-1, ' ', false, json::error_handler_t::replace).substr(0, 100) +
                         "; only \"silu\" is supported");
    }
  }
  if (qwen) {
    bool sliding = false;
    PW_RETURN_IF_ERROR(r.Bool("use_sliding_window", &sliding, false));
    if (sliding) {
      return r.Error(StatusCode::kUnsupported, "use_sliding_window",
                     "is true; sliding-window attention is not supported");
    }
  }
  // transformers 5.x: layer_types says which layers attend through a sliding window (a
  // hybrid's, which layers are linear attention: its own parse; gpt_oss serves sliding layers:
  // ParseGptOss).
  if (hybrid) {
    PW_RETURN_IF_ERROR(ParseQwen3NextLayers(r, &c));
  } else if (const json* lt = r.Find("layer_types"); lt != nullptr && t != ModelType::kGptOss) {
    if (!lt->is_array()) {
      return r.Error(StatusCode::kInvalidArgument, "layer_types", "must be a list of strings");
    }
    for (size_t i = 0; i < lt->size(); ++i) {
      const json& e = (*lt)[i];
      if (!e.is_string() || e.get<std::string>() != "full_attention") {
        return r.Error(StatusCode::kUnsupported, "layer_types[" + std::to_string(i) + "]",
                       "is " + FieldReader::Dump(e) + "; only \"full_attention\" is supported");
      }
    }
  }
  if (t == ModelType::kMixtral && r.Find("sliding_window") != nullptr) {
    int64_t window;
    PW_RETURN_IF_ERROR(r.Int("sliding_window", &window, std::nullopt, 1));
    if (window < c.max_position_embeddings) {
      return r.Error(
          StatusCode::kUnsupported, "sliding_window",
          "is " + std::to_string(window) + "; sliding-window attention is not supported");
    }
  }

  // Attention details.
  switch (t) {
    case ModelType::kQwen2Moe:
      PW_RETURN_IF_ERROR(r.Bool("qkv_bias", &c.qkv_bias, true));
      c.o_bias = false;
      c.qk_norm = QkNorm::kNone;
      break;
    case ModelType::kQwen3Moe:
    case ModelType::kQwen3Next:
    case ModelType::kQwen35Moe:
      PW_RETURN_IF_ERROR(r.Bool("attention_bias", &c.qkv_bias, false));
      c.o_bias = c.qkv_bias;
      c.qk_norm = QkNorm::kPerHead;
      break;
    case ModelType::kOlmoe: {
      PW_RETURN_IF_ERROR(r.Bool("attention_bias", &c.qkv_bias, false));
      c.o_bias = c.qkv_bias;
      c.qk_norm = QkNorm::kFull;
      if (r.Find("clip_qkv") != nullptr) {
        double clip;
        PW_RETURN_IF_ERROR(r.Double("clip_qkv", &clip, 0, true));
        c.clip_qkv = clip;
      }
      break;
    }
    case ModelType::kMixtral:
      c.qkv_bias = false;
      c.o_bias = false;
      c.qk_norm = QkNorm::kNone;
      break;
    case ModelType::kGlm4Moe: {
      PW_RETURN_IF_ERROR(r.Bool("attention_bias", &c.qkv_bias, false));
      c.o_bias = false;  // o_proj never has a bias
      bool qk_norm = false;
      PW_RETURN_IF_ERROR(r.Bool("use_qk_norm", &qk_norm, false));
      c.qk_norm = qk_norm ? QkNorm::kPerHead : QkNorm::kNone;
      break;
    }
    case ModelType::kGptOss:
      PW_RETURN_IF_ERROR(ParseGptOss(r, &c));
      break;
    case ModelType::kGemma4:  // ParseGemma4, above
      break;
    case ModelType::kDeepseekV3: {
      // attention_bias: on q_a_proj (or q_proj), kv_a_proj_with_mqa and o_proj.
      PW_RETURN_IF_ERROR(r.Bool("attention_bias", &c.qkv_bias, false));
      c.o_bias = c.qkv_bias;
      c.qk_norm = QkNorm::kNone;
      // HF yarn_apply_mscale: YaRN's mscale_all_dim scales q.k of every dim, not only the
      // rotated ones.
      double scale = 1.0 / std::sqrt(static_cast<double>(c.mla.qk_head_dim()));
      const RopeScaling& rs = c.rope_scaling;
      if (rs.type != RopeType::kDefault && rs.mscale_all_dim != 0) {
        const double m = rs.factor <= 1 ? 1.0 : 0.1 * rs.mscale_all_dim * std::log(rs.factor) + 1;
        scale *= m * m;
      }
      c.mla.softmax_scale = scale;
      PW_RETURN_IF_ERROR(ParseFp8Quantization(r, &c));
      break;
    }
  }

  // Rotary dims: all of head_dim, or (glm4_moe 0.5, qwen3_next 0.25 by default) the first
  // partial_rotary_factor of it.
  c.rotary_dim = c.head_dim;
  if (t == ModelType::kGlm4Moe || hybrid) {
    // Top level (the released checkpoints), else in transformers 5's rope_parameters.
    const double def = t == ModelType::kGlm4Moe ? 0.5 : 0.25;
    double factor = def;
    const json* rp = r.Find("rope_parameters");
    if (r.Find("partial_rotary_factor") == nullptr && rp != nullptr && rp->is_object() &&
        rp->contains("partial_rotary_factor")) {
      PW_RETURN_IF_ERROR(FieldReader(*rp, label).Double("partial_rotary_factor", &factor, def, true)
                             .WithContext("rope_parameters"));
    } else {
      PW_RETURN_IF_ERROR(r.Double("partial_rotary_factor", &factor, def, true));
    }
    const double dims = static_cast<double>(c.head_dim) * factor;
    c.rotary_dim = static_cast<int64_t>(dims);  // int(head_dim * factor), as HF
    if (factor > 1 || c.rotary_dim < 2 || c.rotary_dim % 2 != 0) {
      return r.Error(StatusCode::kInvalidArgument, "partial_rotary_factor",
                     "gives " + std::to_string(c.rotary_dim) + " rotary dims of head_dim " +
                         std::to_string(c.head_dim) + "; they must be even, in [2, head_dim]");
    }
  }

  // Experts.
  if (t == ModelType::kGlm4Moe || t == ModelType::kDeepseekV3) {
    PW_RETURN_IF_ERROR(r.Int("n_routed_experts", &c.num_experts, std::nullopt, 1));
  } else {
    // transformers 5.x writes num_local_experts for qwen3_moe too; either name, for any type.
    PW_ASSIGN_OR_RETURN(const std::string name,
                        t == ModelType::kMixtral || t == ModelType::kGptOss
                            ? r.Alias("num_local_experts", "num_experts")
                            : r.Alias("num_experts", "num_local_experts"));
    PW_RETURN_IF_ERROR(r.Int(name, &c.num_experts, std::nullopt, 1));
  }
  PW_RETURN_IF_ERROR(r.Int("num_experts_per_tok", &c.num_experts_per_tok, std::nullopt, 1));
  if (c.num_experts_per_tok > c.num_experts) {
    return r.Error(StatusCode::kInvalidArgument, "num_experts_per_tok",
                   "is " + std::to_string(c.num_experts_per_tok) + ", more than the " +
                       std::to_string(c.num_experts) + " experts");
  }
  if (qwen) {
    PW_RETURN_IF_ERROR(r.Int("moe_intermediate_size", &c.moe_intermediate_size, std::nullopt, 1));
    PW_RETURN_IF_ERROR(r.Int("intermediate_size", &c.intermediate_size,
                             t == ModelType::kQwen2Moe ? 5632 : 6144, 1));
    // qwen3_5_moe_text has neither (HF's every layer is MoE).
    if (t != ModelType::kQwen35Moe) {
      PW_RETURN_IF_ERROR(r.Int("decoder_sparse_step", &c.decoder_sparse_step, 1, 1));
      PW_RETURN_IF_ERROR(r.IntList("mlp_only_layers", &c.mlp_only_layers));
    }
    for (size_t i = 0; i < c.mlp_only_layers.size(); ++i) {
      int64_t l = c.mlp_only_layers[i];
      if (l < 0 || l >= c.num_layers) {
        return r.Error(StatusCode::kInvalidArgument, "mlp_only_layers[" + std::to_string(i) + "]",
                       "is " + std::to_string(l) + ", not a layer index below " +
                           std::to_string(c.num_layers));
      }
    }
    PW_RETURN_IF_ERROR(r.Bool("norm_topk_prob", &c.norm_topk_prob, t == ModelType::kQwen3Next));
    if (t == ModelType::kQwen35Moe) c.norm_topk_prob = true;  // its router always renormalises
  } else if (t == ModelType::kGlm4Moe) {
    PW_RETURN_IF_ERROR(ParseSigmoidMoeExperts(r, kGlm4MoeDefaults, &c));
  } else if (t == ModelType::kDeepseekV3) {
    PW_RETURN_IF_ERROR(ParseSigmoidMoeExperts(r, kDeepseekV3Defaults, &c));
  } else {
    PW_RETURN_IF_ERROR(r.Int("intermediate_size", &c.moe_intermediate_size, std::nullopt, 1));
    c.intermediate_size = c.moe_intermediate_size;
    if (t == ModelType::kOlmoe) {
      PW_RETURN_IF_ERROR(r.Bool("norm_topk_prob", &c.norm_topk_prob, false));
    } else {
      // mixtral always renormalises the top-k weights; gpt_oss's softmax over the top-k
      // logits is the same weights.
      c.norm_topk_prob = true;
    }
  }
  if (t == ModelType::kQwen2Moe || hybrid) {
    PW_RETURN_IF_ERROR(r.Int("shared_expert_intermediate_size",
                             &c.shared_expert_intermediate_size,
                             t == ModelType::kQwen2Moe ? 5632 : 512, 0));
  }

  // Special tokens (HF defaults: olmoe eos 50279 pad 1; mixtral bos 1 eos 2; qwen: none).
  PW_RETURN_IF_ERROR(r.OptInt("bos_token_id", &c.bos_token_id));
  PW_RETURN_IF_ERROR(r.IntOrList("eos_token_id", &c.eos_token_ids));
  PW_RETURN_IF_ERROR(r.OptInt("pad_token_id", &c.pad_token_id));
  const bool has_bos = root.contains("bos_token_id");
  const bool has_eos = root.contains("eos_token_id");
  const bool has_pad = root.contains("pad_token_id");
  if (t == ModelType::kOlmoe) {
    if (!has_eos) c.eos_token_ids = {50279};
    if (!has_pad) c.pad_token_id = 1;
  } else if (t == ModelType::kMixtral) {
    if (!has_bos) c.bos_token_id = 1;
    if (!has_eos) c.eos_token_ids = {2};  } else if (t == ModelType::kDeepseekV3) {
    if (!has_bos) c.bos_token_id = 0;
    if (!has_eos) c.eos_token_ids = {1};
  }
  return c;
}

Result<ModelConfig> LoadModelConfig(const std::string& path) {
  PW_ASSIGN_OR_RETURN(auto file, MmapFile::Open(path));
  if (file->size() > (16u << 20)) {
    return InvalidArgument(path + ": " + std::to_string(file->size()) +
                           " bytes is too large for a config.json");
  }
  std::string text(reinterpret_cast<const char*>(file->data()), file->size());
  return ParseModelConfig(text, path);
}

}  // namespace pw
