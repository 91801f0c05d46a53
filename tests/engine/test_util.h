// Helpers shared by the engine tests: fixture locations and reference logits.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/formats/safetensors.h"

namespace pw::engine::testing {

// Directory of the tiny random checkpoint of `type` (tests/fixtures/models/<type>).
// PW_ENGINE_FIXTURES overrides the parent directory.
inline std::string FixtureModelDir(const std::string& type) {
  if (const char* env = std::getenv("PW_ENGINE_FIXTURES")) return std::string(env) + "/" + type;
  return std::string(PW_SOURCE_DIR) + "/tests/fixtures/models/" + type;
}

inline std::string TinyModelDir() { return std::string(PW_SOURCE_DIR) + "/models/tiny-moe"; }

// Asks for the batch-invariant dense kernels (kernels/cpu/dense.h) in this process, for tests
// that compare a batch with each sequence alone (or lockstep with whole windows): that holds to
// the bit only with them, since the default kernels sum a lone token in the one-token GEMV's
// order and the random-weight fixtures have near-tied router choices such a difference flips.
// The table is chosen once per process, at first use: call this from a namespace-scope
// initializer, before any test runs.
inline bool UseBatchInvariantKernels() { return setenv("PW_BATCH_INVARIANT", "1", 1) == 0; }

struct RefPrompt {
  std::vector<int32_t> ids;
  std::vector<float> logits;  // [ids.size(), vocab]
};

// Reads p{i}.ids (I32 [T]) and p{i}.logits (F32 [T, V]) for i = 0, 1, ... from a
// logits.safetensors file. Adds a gtest failure and returns what it has on error.
std::vector<RefPrompt> ReadRefLogits(const std::string& path, int64_t vocab);

// SHA-256 of data as 64 lowercase hex digits (FIPS 180-4), to check that a text is the exact
// one a reference was computed on (the fixtures record sha256 as Python's hashlib writes it).
std::string Sha256Hex(const std::string& data);

// Copies the `fixture` checkpoint into `dir`, leaving out tensor `drop` and applying `edit` to
// config.json (a bad-input case from a fixture). Adds a gtest failure on error.
void WriteFixtureCopy(const std::string& fixture, const std::string& dir, const std::string& drop,
                      const std::function<void(nlohmann::json&)>& edit);

}  // namespace pw::engine::testing
