// A bounded run of a libFuzzer target without libFuzzer, for every build and CI: each built-in
// seed (PwFuzzSeeds), each file given, then random mutations of them (bit flips, byte and
// integer overwrites with boundary values, insertions, deletions, duplicated ranges, splices)
// until the time is up. Deterministic for a given --seed and count; a crash, an ASan/UBSan
// report or a failed PW_CHECK in the target fails the run. `make fuzz` runs the real libFuzzer
// binaries for longer (tools/fuzz.sh).
//
//   <target>_smoke [--seconds S (default 2)] [--seed N] [--write-seeds DIR] [FILE|DIR ...]
#include <dirent.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) __attribute__((weak));
// Seeds a target builds itself (valid inputs the mutations start from); optional.
std::vector<std::string> PwFuzzSeeds() __attribute__((weak));

namespace {

constexpr size_t kMaxLen = 1 << 16;

void AddPath(const std::string& path, std::vector<std::string>* out) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) {
    std::fprintf(stderr, "smoke: cannot read %s\n", path.c_str());
    std::exit(2);
  }
  if (S_ISDIR(st.st_mode)) {
    DIR* d = opendir(path.c_str());
    while (dirent* e = d ? readdir(d) : nullptr) {
      if (e->d_name[0] != '.') AddPath(path + "/" + e->d_name, out);
    }
    if (d) closedir(d);
    return;
  }
  std::ifstream f(path, std::ios::binary);
  out->emplace_back((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

void Mutate(std::string& s, const std::vector<std::string>& corpus, std::mt19937_64& rng) {
  auto pick = [&](size_t n) { return n == 0 ? size_t{0} : static_cast<size_t>(rng() % n); };
  static const uint64_t kInteresting[] = {0, 1, 0x7f, 0x80, 0xff, 0x7fff, 0xffff, 0x7fffffff,
                                          0xffffffff, 0x100000000ull, ~0ull, 4096, 255, 256};
  const int ops = 1 + static_cast<int>(rng() % 8);
  for (int k = 0; k < ops; ++k) {
    switch (rng() % 8) {
      case 0:  // flip a bit
        if (!s.empty()) s[pick(s.size())] ^= static_cast<char>(1u << (rng() % 8));
        break;
      case 1:  // random byte
        if (!s.empty()) s[pick(s.size())] = static_cast<char>(rng());
        break;
      case 2: {  // boundary integer, 1/2/4/8 bytes little-endian
        const size_t w = size_t{1} << (rng() % 4);
        if (s.size() < w) break;
        const uint64_t v = kInteresting[pick(std::size(kInteresting))];
        std::memcpy(&s[pick(s.size() - w + 1)], &v, w);
        break;
      }
      case 3:  // insert random bytes
        s.insert(pick(s.size() + 1), std::string(1 + pick(8), static_cast<char>(rng())));
        break;
      case 4:  // delete a range
        if (!s.empty()) {
          const size_t at = pick(s.size());
          s.erase(at, 1 + pick(std::min<size_t>(64, s.size() - at)));
        }
        break;
      case 5:  // duplicate a range
        if (!s.empty() && s.size() < kMaxLen) {
          const size_t at = pick(s.size());
          const std::string part = s.substr(at, 1 + pick(64));
          s.insert(pick(s.size() + 1), part);
        }
        break;
      case 6: {  // splice with another input
        const std::string& o = corpus[pick(corpus.size())];
        if (o.empty()) break;
        const size_t from = pick(o.size());
        s = s.substr(0, pick(s.size() + 1)) + o.substr(from, 1 + pick(o.size() - from));
        break;
      }
      default:  // truncate
        if (!s.empty()) s.resize(pick(s.size()));
        break;
    }
  }
  if (s.size() > kMaxLen) s.resize(kMaxLen);
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 2;
  uint64_t seed = 20261201;
  std::string write_seeds;
  std::vector<std::string> corpus;
  if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
  if (PwFuzzSeeds) corpus = PwFuzzSeeds();
  const size_t builtin = corpus.size();
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--seconds" && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
    } else if (a == "--seed" && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--write-seeds" && i + 1 < argc) {
      write_seeds = argv[++i];
    } else {
      AddPath(a, &corpus);
    }
  }
  if (!write_seeds.empty()) {
    mkdir(write_seeds.c_str(), 0755);
    for (size_t i = 0; i < builtin; ++i) {
      std::ofstream(write_seeds + "/builtin-" + std::to_string(i), std::ios::binary) << corpus[i];
    }
    std::printf("smoke: wrote %zu seeds to %s\n", builtin, write_seeds.c_str());
    return 0;
  }
  if (corpus.empty()) corpus.emplace_back();
  for (const std::string& s : corpus) {
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  }
  std::mt19937_64 rng(seed);
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  uint64_t runs = corpus.size();
  while (std::chrono::steady_clock::now() < until) {
    for (int k = 0; k < 16; ++k) {
      std::string s = corpus[rng() % corpus.size()];
      Mutate(s, corpus, rng);
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(s.data()), s.size());
      ++runs;
    }
  }
  std::printf("smoke: %llu inputs (%zu seeds, --seed %llu) without a failure\n",
              static_cast<unsigned long long>(runs), corpus.size(),
              static_cast<unsigned long long>(seed));
  return 0;
}
