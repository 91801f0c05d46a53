#include "kernels/cpu/kernel_settings.h"

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

namespace pw::cpu {
namespace {

std::mutex mu;

// `s` in the variables' form into `k`.
void WriteKnobs(const KernelSettings& s, std::map<std::string, std::string>* k) {
  (*k)["PW_CPU_ISA"] = s.cpu_isa;
  (*k)["PW_BATCH_INVARIANT"] = s.batch_invariant ? "1" : "";
  (*k)["PW_BF16_ACTIVATIONS"] = s.bf16_activations ? "1" : "0";
  (*k)["PW_ANYPREC_BACKEND"] = s.anyprec_backend;
  (*k)["PW_PREFETCH_BYTES"] = s.prefetch_bytes >= 0 ? std::to_string(s.prefetch_bytes) : "";
  (*k)["PW_PREFETCH_LEVEL"] = s.prefetch_level;
  (*k)["PW_POOL_SPIN_US"] = s.pool_spin_us >= 0 ? std::to_string(s.pool_spin_us) : "";
  (*k)["PW_DENSE_Q8_MAX"] = s.dense_q8_max >= 0 ? std::to_string(s.dense_q8_max) : "";
}

// The settings in the variables' form, by variable, the defaults until SetKernelSettings;
// entries are never erased, so a returned pointer stays valid.
std::map<std::string, std::string>& Knobs() {
  static std::map<std::string, std::string> knobs = [] {
    std::map<std::string, std::string> k;
    WriteKnobs(KernelSettings{}, &k);
    return k;
  }();
  return knobs;
}

}  // namespace

void SetKernelSettings(const KernelSettings& s) {
  std::lock_guard<std::mutex> lock(mu);
  WriteKnobs(s, &Knobs());
}

const char* KernelKnob(const char* env_name) {
  if (const char* env = std::getenv(env_name)) return env;
  std::lock_guard<std::mutex> lock(mu);
  auto it = Knobs().find(env_name);
  return it == Knobs().end() || it->second.empty() ? nullptr : it->second.c_str();
}

KernelSettings EffectiveKernelSettings() {
  KernelSettings s;
  auto str = [](const char* name) {
    const char* v = KernelKnob(name);
    return v == nullptr ? std::string() : std::string(v);
  };
  auto num = [](const char* name) -> int64_t {
    const char* v = KernelKnob(name);
    if (v == nullptr || *v == '\0') return -1;
    char* end = nullptr;
    const long long n = std::strtoll(v, &end, 10);
    return *end == '\0' && n >= 0 ? n : -1;
  };
  s.cpu_isa = str("PW_CPU_ISA");
  s.batch_invariant = str("PW_BATCH_INVARIANT") == "1";
  s.bf16_activations = str("PW_BF16_ACTIVATIONS") == "1";
  s.anyprec_backend = str("PW_ANYPREC_BACKEND");
  s.prefetch_bytes = num("PW_PREFETCH_BYTES");
  s.prefetch_level = str("PW_PREFETCH_LEVEL");
  s.pool_spin_us = num("PW_POOL_SPIN_US");
  s.dense_q8_max = num("PW_DENSE_Q8_MAX");
  return s;
}

}  // namespace pw::cpu
