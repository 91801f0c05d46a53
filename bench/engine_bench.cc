// pw-bench-engine: prefill and decode throughput of the CPU engine at batch 1, 8 and 32, next to
// the floor that memory bandwidth sets for a decode step.
//
//   pw-bench-engine [--model DIR]... [--threads N] [--runs 5] [--prompt-len 64]
//                   [--decode-steps 16] [--batches 1,8,32] [--bw-gib 1.5]
//
// Models: every --model given; by default models/tiny-moe and the synthetic checkpoint named
// by $PW_SYNTHETIC_MODEL (default build/synthetic-olmoe, written by make_synthetic_moe); a
// model directory that does not exist is skipped with a note.
//
// One run at batch B: B sequences of `prompt-len` random token ids (fixed seed) are added
// together; prefill time = from AddSequence until every sequence has its first token (chunked
// prefill through Engine::Step); decode time = the next `decode-steps` Steps, each giving every
// sequence one token (greedy, eos ignored). Reported: median over `runs` runs of
//   prefill tok/s = B * prompt_len / prefill time
//   decode  tok/s = B * decode_steps / decode time
//
// Floor. Before the models, the benchmark measures read bandwidth with `threads` threads over
// a buffer larger than the last-level cache (median of 5 passes). For each decode step it counts
// the bytes the step cannot avoid reading:
//   per layer: q/k/v/o weights, router, the distinct experts the batch's tokens selected
//     (3 * H * I bf16 each, counted from the router's actual choices), the shared expert,
//     norms/biases, and the KV cache of every sequence up to its position (fp32);
//   once: lm_head, final norm, and B embedding rows.
// floor time = bytes / bandwidth; floor tok/s = B / floor time; ratio = decode time per step /
// floor time (1.0 = bandwidth-bound, at the floor). On a machine shared with other jobs wall
// times measure the other jobs too, so a second table normalises by CPU time: the decode step
// as CPU seconds / threads, the bandwidth as bytes per (CPU seconds / threads) of the reading
// threads; time spent spinning counts as CPU, so these figures err on the slow side.
// `experts %` is the share of decode time
// spent inside expert matmuls (timed by wrapping the bf16 expert provider). `CPU %` is the
// process's CPU time during decode over wall time x threads: well under 100 means the threads
// waited for cores (a busy machine) or idled, and the figures understate the engine.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/logging.h"
#include "common/model_config.h"
#include "services/engine/engine.h"
#include "services/engine/model.h"
#include "services/engine/moe_layer.h"

namespace pw::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// CPU seconds this process has used (all threads).
double ProcessCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Bandwidth {
  double wall = 0;  // bytes / wall seconds
  double cpu = 0;   // bytes / (thread CPU seconds / threads): what the threads read while on a core
};

// Read bandwidth: `threads` threads each sum their slice of a `bytes` buffer (64-bit loads,
// vectorised by the compiler), median of `passes` passes after one warm-up.
Bandwidth MeasureReadBandwidth(size_t bytes, int threads, int passes) {
  const size_t words = bytes / sizeof(uint64_t);
  std::unique_ptr<uint64_t[]> buf(new uint64_t[words]);
  for (size_t i = 0; i < words; ++i) buf[i] = i * 0x9e3779b97f4a7c15ull;  // touch every page
  std::atomic<uint64_t> sink{0};
  std::vector<double> cpu(threads);
  auto pass = [&]() {
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t) {
      ts.emplace_back([&, t] {
        timespec c0, c1;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
        size_t begin = words * t / threads, end = words * (t + 1) / threads;
        uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
        const uint64_t* p = buf.get();
        size_t i = begin;
        for (; i + 4 <= end; i += 4) {
          a0 += p[i];
          a1 += p[i + 1];
          a2 += p[i + 2];
          a3 += p[i + 3];
        }
        for (; i < end; ++i) a0 += p[i];
        sink += a0 + a1 + a2 + a3;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
        cpu[t] = static_cast<double>(c1.tv_sec - c0.tv_sec) +
                 1e-9 * static_cast<double>(c1.tv_nsec - c0.tv_nsec);
      });
    }
    for (auto& th : ts) th.join();
  };
  pass();  // warm-up
  std::vector<double> wall_bw, cpu_bw;
  const double total = static_cast<double>(words * sizeof(uint64_t));
  for (int i = 0; i < passes; ++i) {
    auto t0 = Clock::now();
    pass();
    wall_bw.push_back(total / Seconds(t0, Clock::now()));
    double cpu_sum = 0;
    for (double c : cpu) cpu_sum += c;
    cpu_bw.push_back(total / (cpu_sum / threads));
  }
  if (sink.load() == 42) std::printf(" ");  // keep the sums alive
  return {Median(wall_bw), Median(cpu_bw)};
}

// Times expert matmuls by wrapping the engine's bf16 provider.
class TimingProvider final : public engine::ExpertWeightProvider {
 public:
  explicit TimingProvider(const engine::Model& model) : inner_(model) {}
  Status Apply(int layer, int expert, engine::ExpertProj proj, const float* x, size_t ldx,
               size_t num_tokens, float* y, size_t ldy, cpu::ThreadPool* pool) override {
    auto t0 = Clock::now();
    Status s = inner_.Apply(layer, expert, proj, x, ldx, num_tokens, y, ldy, pool);
    seconds_ += Seconds(t0, Clock::now());
    return s;
  }
  int Bits(int layer, int expert, engine::ExpertProj proj) const override {
    return inner_.Bits(layer, expert, proj);
  }
  double seconds_ = 0;

 private:
  engine::Bf16ExpertProvider inner_;
};

// Counts, for pure-decode batches, the distinct experts each layer's tokens selected.
class DistinctExpertCounter final : public engine::RouterLogitsRecorder {
 public:
  void Record(const engine::RoutingContext& ctx,
              const std::vector<engine::ExpertAssignment>& selected) override {
    if (!ctx.pure_decode || !enabled_) return;
    std::set<int32_t> experts;
    for (const auto& a : selected) experts.insert(a.expert);
    distinct_sum_ += static_cast<double>(experts.size());
    ++layer_calls_;
  }
  bool enabled_ = false;
  double distinct_sum_ = 0;  // sum over (decode step, layer) of distinct experts
  int64_t layer_calls_ = 0;
};

struct Row {
  std::string model;
  int batch = 0;
  double prefill_tps = 0, decode_tps = 0;
  double floor_bytes = 0;       // per decode step
  double distinct = 0;          // mean distinct experts per MoE layer per decode step
  double expert_share = 0;      // fraction of decode time in expert matmuls
  double step_seconds = 0;      // median decode step time
  double cpu_util = 0;          // decode CPU time / (wall time * threads): < 1 = CPU shared/idle
  double step_cpu_seconds = 0;  // median decode step CPU time / threads
  double prefill_cpu_tps = 0;   // prompt tokens per (prefill CPU seconds / threads)
};

// Bytes one decode step of `batch` sequences at mean context `ctx` must read (see top).
double DecodeStepBytes(const engine::Model& model, int batch, double mean_distinct_experts,
                       double ctx) {
  const ModelConfig& c = model.config();
  const double H = static_cast<double>(c.hidden_size), D = static_cast<double>(c.head_dim);
  const double nh = static_cast<double>(c.num_heads), nkv = static_cast<double>(c.num_kv_heads);
  const double bf16 = 2, f32 = 4;
  double bytes = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    bytes += bf16 * (H * nh * D + 2 * H * nkv * D + nh * D * H);  // q, k, v, o
    bytes += f32 * 2 * H;                                         // the two norms
    if (c.qk_norm != QkNorm::kNone) bytes += f32 * 2 * nh * D;
    bytes += f32 * batch * ctx * 2 * nkv * D;  // K and V of every position
    if (c.IsMoeLayer(l)) {
      bytes += bf16 * static_cast<double>(c.num_experts) * H;  // router
      bytes += bf16 * mean_distinct_experts * 3 * H * static_cast<double>(c.moe_intermediate_size);
      if (c.shared_expert_intermediate_size > 0) {
        bytes += bf16 * (3 * H * static_cast<double>(c.shared_expert_intermediate_size) + H);
      }
    } else {
      bytes += bf16 * 3 * H * static_cast<double>(c.intermediate_size);
    }
  }
  bytes += bf16 * static_cast<double>(c.vocab_size) * H;  // lm_head
  bytes += f32 * H + bf16 * batch * H;                    // final norm, embedding rows
  return bytes;
}

struct Options {
  std::vector<std::string> models;
  int threads = 2;
  int runs = 5;
  int prompt_len = 64;
  int decode_steps = 16;
  std::vector<int> batches = {1, 8, 32};
  double bw_gib = 1.5;
};

Result<std::vector<Row>> BenchModel(const std::string& dir, const Options& o) {
  const int max_batch = *std::max_element(o.batches.begin(), o.batches.end());
  engine::EngineOptions eo;
  eo.num_threads = o.threads;
  eo.block_size = 16;
  // Room for the prompt, the timed steps and any tokens decoded while other prompts prefill.
  const int max_gen = o.decode_steps + 64;
  const int per_seq = (o.prompt_len + max_gen + eo.block_size - 1) / eo.block_size;
  eo.num_kv_blocks = max_batch * per_seq + 16;
  // Every prompt of the batch fits one step, so prefill is measured without decode mixed in.
  eo.max_batch_tokens = std::max(512, max_batch * o.prompt_len);
  PW_ASSIGN_OR_RETURN(auto eng, engine::Engine::Create(dir, eo));
  TimingProvider timing(eng->model());
  DistinctExpertCounter counter;
  eng->SetMoeHooks(
      {.provider = &timing, .residency = nullptr, .routing_hook = nullptr, .recorder = &counter});
  const int vocab = eng->vocab_size();
  std::mt19937 rng(1234);

  std::vector<Row> rows;
  uint64_t next_id = 1;
  for (int batch : o.batches) {
    std::vector<double> prefill_tps, decode_tps, step_s, expert_share, cpu_util, step_cpu;
    std::vector<double> prefill_cpu_tps;
    double distinct_sum = 0;
    int64_t distinct_calls = 0;
    for (int run = 0; run < o.runs; ++run) {
      engine::SamplingParams sp;
      sp.max_tokens = max_gen;
      sp.ignore_eos = true;
      std::vector<uint64_t> ids;
      auto t0 = Clock::now();
      const double cpu0 = ProcessCpuSeconds();
      for (int b = 0; b < batch; ++b) {
        std::vector<int32_t> prompt(o.prompt_len);
        for (auto& t : prompt) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
        ids.push_back(next_id);
        PW_RETURN_IF_ERROR(eng->AddSequence(next_id++, std::move(prompt), sp));
      }
      // Prefill: until no sequence is still prefilling.
      for (;;) {
        auto infos = eng->Sequences();
        bool prefilling = std::any_of(infos.begin(), infos.end(),
                                      [](const engine::SequenceInfo& i) { return i.prefilling; });
        if (!prefilling) break;
        PW_ASSIGN_OR_RETURN(auto step, eng->Step());
        (void)step;
      }
      auto t1 = Clock::now();
      const double cpu1 = ProcessCpuSeconds();
      counter.enabled_ = true;
      counter.distinct_sum_ = 0;
      counter.layer_calls_ = 0;
      timing.seconds_ = 0;
      for (int s = 0; s < o.decode_steps; ++s) {
        PW_ASSIGN_OR_RETURN(auto step, eng->Step());
        if (step.num_decode_tokens != batch) {
          return Internal("decode step ran " + std::to_string(step.num_decode_tokens) +
                          " tokens, expected " + std::to_string(batch));
        }
      }
      auto t2 = Clock::now();
      const double cpu2 = ProcessCpuSeconds();
      counter.enabled_ = false;
      for (uint64_t id : ids) (void)eng->RemoveSequence(id);
      const double pre = Seconds(t0, t1), dec = Seconds(t1, t2);
      prefill_tps.push_back(batch * o.prompt_len / pre);
      decode_tps.push_back(batch * o.decode_steps / dec);
      step_s.push_back(dec / o.decode_steps);
      expert_share.push_back(timing.seconds_ / dec);
      cpu_util.push_back((cpu2 - cpu1) / (dec * o.threads));
      step_cpu.push_back((cpu2 - cpu1) / o.threads / o.decode_steps);
      prefill_cpu_tps.push_back(batch * o.prompt_len / ((cpu1 - cpu0) / o.threads));
      distinct_sum += counter.distinct_sum_;
      distinct_calls += counter.layer_calls_;
    }
    Row r;
    r.model = std::filesystem::path(dir).filename().string();
    r.batch = batch;
    r.prefill_tps = Median(prefill_tps);
    r.decode_tps = Median(decode_tps);
    r.step_seconds = Median(step_s);
    r.expert_share = Median(expert_share);
    r.cpu_util = Median(cpu_util);
    r.step_cpu_seconds = Median(step_cpu);
    r.prefill_cpu_tps = Median(prefill_cpu_tps);
    r.distinct = distinct_calls ? distinct_sum / static_cast<double>(distinct_calls) : 0;
    const double mean_ctx = o.prompt_len + 0.5 * o.decode_steps;
    r.floor_bytes = DecodeStepBytes(eng->model(), batch, r.distinct, mean_ctx);
    rows.push_back(r);
    std::fprintf(stderr, "  %s batch %d done (decode step %.2f ms)\n", r.model.c_str(), batch,
                 r.step_seconds * 1e3);
  }
  return rows;
}

std::vector<int> ParseList(const std::string& s) {
  std::vector<int> out;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t comma = s.find(',', pos);
    if (comma == std::string::npos) comma = s.size();
    out.push_back(std::atoi(s.substr(pos, comma - pos).c_str()));
    pos = comma + 1;
  }
  return out;
}

int Main(int argc, char** argv) {
  SetLogProcessTag("pw-bench-engine");
  CLI::App app{"Engine prefill/decode throughput and the memory-bandwidth floor"};
  Options o;
  std::string batches = "1,8,32";
  app.add_option("--model", o.models, "model directory (repeatable)");
  app.add_option("--threads", o.threads, "engine and bandwidth threads")->check(CLI::Range(1, 256));
  app.add_option("--runs", o.runs, "runs per point (median)")->check(CLI::Range(1, 100));
  app.add_option("--prompt-len", o.prompt_len, "prompt tokens per sequence")
      ->check(CLI::Range(1, 8192));
  app.add_option("--decode-steps", o.decode_steps, "decode steps timed per run")
      ->check(CLI::Range(1, 4096));
  app.add_option("--batches", batches, "comma-separated batch sizes");
  app.add_option("--bw-gib", o.bw_gib, "bandwidth buffer size, GiB (> last-level cache)")
      ->check(CLI::Range(0.25, 64.0));
  CLI11_PARSE(app, argc, argv);
  o.batches = ParseList(batches);
  for (int b : o.batches) {
    if (b < 1 || b > 4096) {
      std::fprintf(stderr, "pw-bench-engine: bad --batches entry %d\n", b);
      return 2;
    }
  }
  if (o.models.empty()) {
    o.models.push_back("models/tiny-moe");
    const char* syn = std::getenv("PW_SYNTHETIC_MODEL");
    o.models.push_back(syn ? syn : "build/synthetic-olmoe");
  }

  std::fprintf(stderr, "measuring read bandwidth (%.2f GiB, %d threads)...\n", o.bw_gib, o.threads);
  const Bandwidth bw =
      MeasureReadBandwidth(static_cast<size_t>(o.bw_gib * (1ull << 30)), o.threads, 5);

  std::vector<Row> rows;
  for (const auto& dir : o.models) {
    if (!std::filesystem::exists(dir + "/config.json")) {
      std::fprintf(stderr, "skipping %s: no config.json (make_synthetic_moe --out %s)\n",
                   dir.c_str(), dir.c_str());
      continue;
    }
    std::fprintf(stderr, "benchmarking %s...\n", dir.c_str());
    auto r = BenchModel(dir, o);
    if (!r.ok()) {
      std::fprintf(stderr, "pw-bench-engine: %s: %s\n", dir.c_str(), r.status().ToString().c_str());
      return 1;
    }
    rows.insert(rows.end(), r->begin(), r->end());
  }

  std::printf(
      "read bandwidth: %.1f GB/s wall, %.1f GB/s per CPU second (%d threads, %.2f GiB "
      "buffer, median of 5)\n",
      bw.wall / 1e9, bw.cpu / 1e9, o.threads, o.bw_gib);
  std::printf("prompt %d tokens, %d decode steps, median of %d runs, %d threads\n\n", o.prompt_len,
              o.decode_steps, o.runs, o.threads);
  std::printf("Wall clock:\n\n");
  std::printf(
      "| model | batch | prefill tok/s | decode tok/s | decode step ms | floor tok/s "
      "| step / floor | CPU %% |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const auto& r : rows) {
    const double floor_s = r.floor_bytes / bw.wall;
    std::printf("| %s | %d | %.1f | %.1f | %.2f | %.1f | %.2f | %.0f |\n", r.model.c_str(), r.batch,
                r.prefill_tps, r.decode_tps, r.step_seconds * 1e3, r.batch / floor_s,
                r.step_seconds / floor_s, 100 * r.cpu_util);
  }
  std::printf(
      "\nPer CPU second (step = decode CPU time / threads; floor from the per-CPU-second "
      "bandwidth):\n\n");
  std::printf(
      "| model | batch | prefill tok/s | distinct experts/layer | bytes/step MB "
      "| decode step ms | decode tok/s | floor tok/s | step / floor | experts %% |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const auto& r : rows) {
    const double floor_s = r.floor_bytes / bw.cpu;
    std::printf("| %s | %d | %.1f | %.1f | %.1f | %.2f | %.1f | %.1f | %.2f | %.0f |\n",
                r.model.c_str(), r.batch, r.prefill_cpu_tps, r.distinct, r.floor_bytes / 1e6,
                r.step_cpu_seconds * 1e3, r.batch / r.step_cpu_seconds, r.batch / floor_s,
                r.step_cpu_seconds / floor_s, 100 * r.expert_share);
  }
  return 0;
}

}  // namespace
}  // namespace pw::bench

int main(int argc, char** argv) { return pw::bench::Main(argc, argv); }
