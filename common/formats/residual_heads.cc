#include "common/formats/residual_heads.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/hash.h"

namespace pw {

namespace {

// Header: magic[8], u32 version, u32 num_layers, u32 num_experts, u32 feature kind (1 = the
// per-layer routing histogram), u64 model_hash, f64 clamp, f64 ridge, u32 train_prompts,
// u32 heldout_prompts, f64 heldout_r2, f64 heldout_corr; then num_layers * 2 heads of
// (1 + num_experts) f64; then u64 FNV-1a 64 of every byte before it. Little-endian.
constexpr size_t kHeaderBytes = 8 + 4 * 4 + 8 + 8 + 8 + 4 * 2 + 8 + 8;
constexpr uint32_t kFeatureRoutingHistogram = 1;
constexpr uint32_t kMaxLayers = 1 << 12, kMaxExperts = 1 << 12;

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof v);
}

template <typename T>
T Get(const std::string& in, size_t* at) {
  T v;
  std::memcpy(&v, in.data() + *at, sizeof v);
  *at += sizeof v;
  return v;
}

template <typename F>
double PredictImpl(const std::vector<double>& h, int n, F feature, double clamp) {
  double r = h[0];
  for (int e = 0; e < n; ++e) r += h[1 + static_cast<size_t>(e)] * static_cast<double>(feature[e]);
  if (!std::isfinite(r)) return 0.0;
  return std::clamp(r, -clamp, clamp);
}

}  // namespace

ResidualHeads::ResidualHeads(int num_layers, int num_experts, uint64_t model_hash, double clamp)
    : num_layers_(num_layers),
      num_experts_(num_experts),
      model_hash_(model_hash),
      clamp_(clamp),
      heads_(static_cast<size_t>(num_layers) * kProjsPerExpert,
             std::vector<double>(1 + static_cast<size_t>(num_experts), 0.0)) {}

double ResidualHeads::Predict(int layer, ExpertProj proj, const float* feature) const {
  return PredictImpl(head(layer, proj), num_experts_, feature, clamp_);
}

double ResidualHeads::Predict(int layer, ExpertProj proj, const double* feature) const {
  return PredictImpl(head(layer, proj), num_experts_, feature, clamp_);
}

std::string ResidualHeads::Serialize() const {
  std::string out;
  out.append(kMagic, sizeof kMagic);
  Put<uint32_t>(&out, kVersion);
  Put<uint32_t>(&out, static_cast<uint32_t>(num_layers_));
  Put<uint32_t>(&out, static_cast<uint32_t>(num_experts_));
  Put<uint32_t>(&out, kFeatureRoutingHistogram);
  Put<uint64_t>(&out, model_hash_);
  Put<double>(&out, clamp_);
  Put<double>(&out, fit_.ridge);
  Put<uint32_t>(&out, fit_.train_prompts);
  Put<uint32_t>(&out, fit_.heldout_prompts);
  Put<double>(&out, fit_.heldout_r2);
  Put<double>(&out, fit_.heldout_corr);
  for (const auto& h : heads_) {
    for (double w : h) Put<double>(&out, w);
  }
  Put<uint64_t>(&out, Fnv1a64Of(out.data(), out.size()));
  return out;
}

Result<ResidualHeads> ResidualHeads::Parse(const std::string& in, const std::string& name) {
  if (in.size() < kHeaderBytes + 8) {
    return Corrupt(name + ": residual heads file is truncated (" + std::to_string(in.size()) +
                           " bytes, the header alone is " + std::to_string(kHeaderBytes + 8) + ")");
  }
  if (std::memcmp(in.data(), kMagic, sizeof kMagic) != 0) {
    return Corrupt(name + ": not a residual heads file (bad magic)");
  }
  size_t at = sizeof kMagic;
  const uint32_t version = Get<uint32_t>(in, &at);
  if (version != kVersion) {
    return Unsupported(name + ": residual heads version " + std::to_string(version) + " (this build reads " +
                       std::to_string(kVersion) + ")");
  }
  const uint32_t layers = Get<uint32_t>(in, &at), experts = Get<uint32_t>(in, &at);
  const uint32_t feature = Get<uint32_t>(in, &at);
  if (layers == 0 || experts == 0 || layers > kMaxLayers || experts > kMaxExperts) {
    return InvalidArgument(name + ": residual heads for " + std::to_string(layers) + " layers x " +
                           std::to_string(experts) + " experts: out of range");
  }
  if (feature != kFeatureRoutingHistogram) {
    return Unsupported(name + ": residual heads feature kind " + std::to_string(feature) + " is unknown");
  }
  const size_t weights = static_cast<size_t>(layers) * kProjsPerExpert * (1 + static_cast<size_t>(experts));
  const size_t want = kHeaderBytes + weights * sizeof(double) + 8;
  if (in.size() != want) {
    return Corrupt(name + ": residual heads file is " + std::string(in.size() < want ? "truncated" : "too long") +
                           " (" + std::to_string(in.size()) + " bytes; " + std::to_string(layers) + " layers x " +
                           std::to_string(experts) + " experts need " + std::to_string(want) + ")");
  }
  uint64_t stored;
  std::memcpy(&stored, in.data() + want - 8, 8);
  if (Fnv1a64Of(in.data(), want - 8) != stored) {
    return Corrupt(name + ": residual heads checksum mismatch (the file is corrupt)");
  }
  ResidualHeads r(static_cast<int>(layers), static_cast<int>(experts), 0);
  r.model_hash_ = Get<uint64_t>(in, &at);
  r.clamp_ = Get<double>(in, &at);
  r.fit_.ridge = Get<double>(in, &at);
  r.fit_.train_prompts = Get<uint32_t>(in, &at);
  r.fit_.heldout_prompts = Get<uint32_t>(in, &at);
  r.fit_.heldout_r2 = Get<double>(in, &at);
  r.fit_.heldout_corr = Get<double>(in, &at);
  if (!std::isfinite(r.clamp_) || r.clamp_ < 0) {
    return InvalidArgument(name + ": residual heads clamp must be finite and >= 0");
  }
  for (size_t h = 0; h < r.heads_.size(); ++h) {
    for (double& w : r.heads_[h]) {
      w = Get<double>(in, &at);
      if (!std::isfinite(w)) {
        return InvalidArgument(name + ": residual head of layer " + std::to_string(h / kProjsPerExpert) +
                               " has a non-finite weight");
      }
    }
  }
  return r;
}

Status ResidualHeads::Save(const std::string& path) const {
  const std::string bytes = Serialize();
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return IoError(tmp + ": cannot write residual heads");
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    f.flush();
    if (!f) {
      std::remove(tmp.c_str());
      return IoError(tmp + ": write failed");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return IoError(path + ": cannot rename " + tmp + " into place");
  }
  return Status::Ok();
}

Result<ResidualHeads> ResidualHeads::Load(const std::string& path, std::optional<uint64_t> expected_model_hash) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return NotFound(path + ": cannot read residual heads");
  std::stringstream ss;
  ss << f.rdbuf();
  PW_ASSIGN_OR_RETURN(ResidualHeads r, Parse(ss.str(), path));
  if (expected_model_hash && r.model_hash() != *expected_model_hash) {
    char buf[96];
    std::snprintf(buf, sizeof buf, " (heads %016llx, store %016llx)", static_cast<unsigned long long>(r.model_hash()),
                  static_cast<unsigned long long>(*expected_model_hash));
    return InvalidArgument(path + ": residual heads were trained for another model" + std::string(buf));
  }
  return r;
}

}  // namespace pw
