// libFuzzer target: the safetensors header parser on arbitrary bytes. Any accepted header must
// satisfy the invariants the reader promises (every tensor inside the image, sizes consistent,
// no overlap); a violation aborts, which libFuzzer reports.
#include <algorithm>
#include <cstring>
#include <string>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/formats/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto r = pw::ParseSafetensorsHeader(data, size, "fuzz.safetensors");
  if (!r.ok()) {
    PW_CHECK(!r.status().message().empty());
    return 0;
  }
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (const auto& t : r->tensors) {
    PW_CHECK(t.offset >= r->data_start);
    PW_CHECK(t.offset <= size && t.nbytes <= size - t.offset);
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      PW_CHECK(d >= 0);
      numel *= static_cast<uint64_t>(d);
    }
    PW_CHECK(numel * pw::DTypeSize(t.dtype) == t.nbytes);
    if (t.nbytes > 0) spans.emplace_back(t.offset, t.offset + t.nbytes);
    // Touch the bytes, as a reader would (ASan catches any out-of-bounds view).
    volatile uint8_t sink = 0;
    if (t.nbytes > 0) sink = data[t.offset] ^ data[t.offset + t.nbytes - 1];
    (void)sink;
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i) PW_CHECK(spans[i].first >= spans[i - 1].second);
  return 0;
}

// A small valid file (two tensors) for the bounded smoke run.
std::vector<std::string> PwFuzzSeeds() {
  const std::string h =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"BF16","shape":[2,3],"data_offsets":[8,20]}})";
  std::string s(8, '\0');
  const uint64_t n = h.size();
  std::memcpy(&s[0], &n, 8);
  return {s + h + std::string(20, '\x01')};
}
