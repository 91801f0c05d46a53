// pw-bench-sampler: microseconds per sampled token (engine/sampler SampleToken) at a request's
// temperature and top-p over vocabularies of real sizes, on logits drawn N(0, 2.5) ("flat":
// large top-p nuclei) or the same with 20 tokens far above the rest ("peaked", a language
// model's usual shape: small nuclei).
//
//   pw-bench-sampler [--vocab 50304,151936] [--top-p 1,0.9] [--temperature 1] [--tokens 200]
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "engine/sampler/sampler.h"

int main(int argc, char** argv) {
  CLI::App app{"Sampled-token time of the engine's sampler"};
  std::vector<int> vocabs = {50304, 151936};
  std::vector<float> top_ps = {1.f, 0.9f};
  float temperature = 1.f;
  int tokens = 200;
  app.add_option("--vocab", vocabs, "vocabulary sizes")->delimiter(',')->check(CLI::Range(2, 1 << 22));
  app.add_option("--top-p", top_ps, "top-p values")->delimiter(',')->check(CLI::Range(1e-6, 1.0));
  app.add_option("--temperature", temperature, "temperature (> 0)")->check(CLI::Range(1e-3, 100.0));
  app.add_option("--tokens", tokens, "tokens sampled per case")->check(CLI::Range(1, 1000000));
  CLI11_PARSE(app, argc, argv);
  std::printf("| vocabulary | logits | top-p | us per token |\n|---:|---|---:|---:|\n");
  for (int v : vocabs) {
    for (bool peaked : {false, true}) {
      std::vector<float> logits(static_cast<size_t>(v));
      std::mt19937 rng(1);
      std::normal_distribution<float> nd(0.f, 2.5f);
      for (float& x : logits) x = nd(rng);
      if (peaked) {
        for (int i = 0; i < 20 && i * 97 < v; ++i) logits[static_cast<size_t>(i) * 97] = 14.f + 0.1f * i;
      }
      for (float top_p : top_ps) {
        pw::engine::SamplingParams p;
        p.temperature = temperature;
        p.top_p = top_p;
        p.seed = 1;
        std::vector<std::pair<float, int32_t>> scratch;
        long sink = pw::engine::SampleToken(logits.data(), v, p, 0, &scratch);  // warm-up
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < tokens; ++i) sink += pw::engine::SampleToken(logits.data(), v, p, i, &scratch);
        const double us =
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / tokens;
        std::printf("| %d | %s | %.2f | %.0f |\n", v, peaked ? "peaked" : "flat", top_p, us);
        if (sink == 42) std::fprintf(stderr, " ");
      }
    }
  }
  return 0;
}
