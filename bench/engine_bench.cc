// pw-bench-engine: prefill and decode throughput of the CPU engine at batch 1, 8 and 32, next to
// the floor that memory bandwidth sets for a decode step.
//
//   pw-bench-engine [--model DIR]... [--threads N] [--runs 5] [--warmups 0] [--prompt-len 64]
//                   [--decode-steps 16] [--batches 1,8,32] [--bw-gib 1.5]
//                   [--bw-streams 1,2,4,8,16] [--bw-passes 5]
//                   [--store STORE.apw [--bits 3,4,8,16] [--bits-map MAP.json]]
//                   [--kernel-path fast|exact] [--dense bf16|bf16-packed|int8|ap3..ap8] [--bf16-experts plain|packed|auto] [--lm-head FORMAT] [--same-prompts] [--block-times]
//                   [--floor-pairs N]
//                   [--lynx [--lynx-rule lynx|piggyback] [--lynx-alpha A --lynx-beta B]
//                           [--lynx-gate-weights renorm|mass] [--lynx-exempt L,..]
//                           [--lynx-keep K'] [--lynx-config FILE]]
//
// Models: every --model given; by default models/tiny-moe and the synthetic checkpoint named
// by $PW_SYNTHETIC_MODEL (default build/synthetic-olmoe, written by make_synthetic_moe); a
// model directory that does not exist is skipped with a note.
//
// One run at batch B: B sequences of `prompt-len` random token ids (fixed seed) are added
// together; prefill time = from AddSequence until every sequence has its first token (chunked
// prefill through Engine::Step); decode time = the next `decode-steps` Steps, each giving every
// sequence one token (greedy, eos ignored). `warmups` untimed runs come first at each point (the
// first run of a process otherwise pays the first touch of every mapped weight page in its
// prefill). Reported: median over `runs` runs of
//   prefill tok/s = B * prompt_len / prefill time
//   decode  tok/s = B * decode_steps / decode time
// --same-prompts gives every sequence of a batch the same prompt (a run's first), so greedy
// decoding keeps them identical and every token of a step selects the same experts: the input
// llama.cpp's llama-batched-bench decodes (token 0 at every position of every sequence). A
// batch then reads the experts of one sequence, not of B (the `distinct` column says so).
//
// Any-precision experts. With --store, the one model (--model, default the synthetic one) runs
// its routed experts from the .apw store through anyprec::ApwExpertProvider (as pw-eval does),
// once per width in --bits (3..8, or 16 = the checkpoint's bf16 block through the provider's
// reference path) and once for the width map of --bits-map, one set of rows per width.
// --kernel-path picks the provider's kernels: fast (int8 LUT and activations, the default) or
// exact (fp16 LUT, fp32 activations).
//
// Floor. Before the models, the benchmark measures read bandwidth with the shared probe
// (bench/bandwidth_probe.h) on 1 thread and on `threads` threads: a buffer larger than the
// last-level cache, read with 1, 2, 4, 8 and 16 interleaved streams per thread and 64-byte
// loads (AVX-512, else AVX2), median of `bw-passes` passes per stream count; the best stream
// count's rate on `threads` threads is the bandwidth every floor and ratio uses (the probe
// prints which count won). For each decode step it counts the bytes the step cannot avoid
// moving (bench/decode_bytes.h, from the loaded model and its per-layer KV specs, so every
// family is counted by what it holds):
//   per layer: every non-expert matrix (attention of the layer's kind, router, shared expert,
//     dense MLP), norms/biases, the distinct experts the batch's tokens selected (counted from
//     the router's actual choices), and the KV of every sequence up to its position (the last
//     `window` positions of a sliding layer, a latent per position for MLA) or, for a
//     linear-attention layer, its recurrent state read and written once;
//   once: lm_head, final norm, and B embedding rows.
// Matrices count 2 bytes a weight, or what the engine's copy reads (--dense, --lm-head: 1 a
// weight for int8, bits/8 plus the int8 table for ap3..ap8); KV elements 4 bytes (fp32 KV).
// A distinct expert counts 3 * H * I bf16 in the `floor` columns; with --store the `@ width`
// columns count it at the width the provider runs each of its two blocks at: b planes of
// rows * PlaneRowBytes(cols) bytes plus the block's LUT_b (rows * 2^b fp16), or bf16 at 16.
// floor time = bytes / bandwidth; floor tok/s = B / floor time; ratio = decode time per step /
// floor time (1.0 = bandwidth-bound, at the floor). --floor-pairs N measures the same ratio
// where the memory rate moves within seconds: after a point's runs, N more decode steps, each
// followed, once the pool's workers have stopped polling (about a millisecond), by a timed read
// of the bytes it moved (bench/bandwidth_probe.h ReadTimer, the probe's best stream count), so
// each pair's two times see the same rate; reported per point: the median step / read ratio
// with its spread. On a machine shared with other jobs wall
// times measure the other jobs too, so a second table normalises by CPU time: the decode step
// as CPU seconds / threads, the bandwidth as bytes per (CPU seconds / threads) of the reading
// threads; time spent spinning counts as CPU, so these figures err on the slow side.
// `experts %` is the share of decode time spent inside expert matmuls (timed by wrapping the
// expert provider). `CPU %` is the process's CPU time during decode over wall time x threads:
// well under 100 means the threads waited for cores (a busy machine) or idled, and the figures
// understate the engine.
//
// Block times. With --block-times the runner times each layer block of the prefill (attention
// of the layer's kind, then its MLP: engine/runner/block_times.h) and a table gives, per kind,
// the time per layer and prompt tokens per second per layer: a hybrid's linear-attention layers
// against its full-attention ones at the --prompt-len given.
//
// LYNX. With --lynx every point runs twice, without and then with the remap rule the --lynx
// flags name (tools/lynx_cli.h) as the engine's routing hook, on the same prompts; a last table
// pairs them: distinct experts per MoE layer per decode step before (the router's choice) and
// after the remap, decode step time off and on (wall and CPU / threads), the floor of each
// (experts counted after the remap), and the remap's own time as a share of the decode step.
// The tables above it then list the runs without the remap only.
#include <CLI/CLI.hpp>
#include <algorithm>
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
#include <tuple>
#include <vector>

#include "bench/bandwidth_probe.h"
#include "bench/decode_bytes.h"
#include "common/formats/apw_store.h"
#include "common/logging.h"
#include "common/formats/model_config.h"
#include "kernels/anyprec/anyprec.h"
#include "engine/experts/apw_expert_provider.h"
#include "engine/engine.h"
#include "engine/runner/block_times.h"
#include "kernels/cpu/thread_pool.h"
#include "engine/hooks/lynx_routing_hook.h"
#include "engine/models/model.h"
#include "engine/layers/moe_layer.h"
#include "tools/dense_cli.h"
#include "tools/lynx_cli.h"
#include "engine/experts/kernel_path.h"
#include "engine/experts/bf16_expert_provider.h"
#include "common/formats/width_map.h"

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

// Times expert matmuls by wrapping the provider the engine runs its experts through.
class TimingProvider final : public engine::ExpertWeightProvider {
 public:
  explicit TimingProvider(engine::ExpertWeightProvider* inner) : inner_(inner) {}
  Status RunExperts(const engine::ExpertLayerCall& call) override {
    auto t0 = Clock::now();
    Status s = inner_->RunExperts(call);
    seconds_ += Seconds(t0, Clock::now());
    return s;
  }
  int Bits(int layer, int expert, engine::ExpertProj proj) const override {
    return inner_->Bits(layer, expert, proj);
  }
  double seconds_ = 0;

 private:
  engine::ExpertWeightProvider* inner_;
};

// Bytes a rows x cols expert block must read at `bits`: b bit-planes plus the block's LUT_b
// (rows * 2^b fp16 centroids), or the bf16 matrix at 16 (kernels/anyprec/anyprec.h layout).
double BlockBytes(int64_t rows, int64_t cols, int bits) {
  if (bits >= anyprec::kBf16Bits) return 2.0 * static_cast<double>(rows) * static_cast<double>(cols);
  return static_cast<double>(bits) * static_cast<double>(rows) *
             static_cast<double>(anyprec::PlaneRowBytes(static_cast<int>(cols))) +
         static_cast<double>(rows) * static_cast<double>(int64_t{1} << bits) * 2.0;
}

// Counts, for pure-decode batches, the distinct experts each layer's tokens selected and the
// bytes they read: as bf16, and at the widths `widths` runs each block at.
class DistinctExpertCounter final : public engine::RouterLogitsRecorder {
 public:
  DistinctExpertCounter(const ModelConfig& c, const engine::ExpertWeightProvider* widths)
      : hidden_(c.hidden_size), ffn_(c.moe_intermediate_size), widths_(widths) {}
  void Record(const engine::RoutingContext& ctx,
              const std::vector<engine::ExpertAssignment>& selected) override {
    if (!ctx.pure_decode || !enabled_) return;
    std::set<int32_t> experts;
    for (const auto& a : selected) experts.insert(a.expert);
    distinct_sum_ += static_cast<double>(experts.size());
    for (int32_t e : experts) {
      bf16_bytes_sum_ += BlockBytes(2 * ffn_, hidden_, anyprec::kBf16Bits) +
                         BlockBytes(hidden_, ffn_, anyprec::kBf16Bits);
      width_bytes_sum_ += WidthBytes(ctx.layer, e);
    }
    ++layer_calls_;
  }
  // The assignments after the routing hook (with --lynx): what the step really reads.
  void RecordAfter(const engine::RoutingContext& ctx,
                   const std::vector<engine::ExpertAssignment>& assignments) {
    if (!ctx.pure_decode || !enabled_) return;
    std::set<int32_t> experts;
    for (const auto& a : assignments) experts.insert(a.expert);
    after_distinct_sum_ += static_cast<double>(experts.size());
    for (int32_t e : experts) {
      after_bf16_bytes_sum_ += BlockBytes(2 * ffn_, hidden_, anyprec::kBf16Bits) +
                               BlockBytes(hidden_, ffn_, anyprec::kBf16Bits);
      after_width_bytes_sum_ += WidthBytes(ctx.layer, e);
    }
  }
  // An expert's bytes at the provider's widths, a bf16 block's scaled by bf16_scale_.
  double WidthBytes(int layer, int32_t e) const {
    double b = 0;
    for (auto [rows, cols, proj] : {std::tuple{2 * ffn_, hidden_, engine::ExpertProj::kGateUp},
                                    std::tuple{hidden_, ffn_, engine::ExpertProj::kDown}}) {
      const int bits = widths_->Bits(layer, e, proj);
      b += BlockBytes(rows, cols, bits) * (bits >= anyprec::kBf16Bits ? bf16_scale_ : 1.0);
    }
    return b;
  }
  void Reset() {
    distinct_sum_ = bf16_bytes_sum_ = width_bytes_sum_ = 0;
    after_distinct_sum_ = after_bf16_bytes_sum_ = after_width_bytes_sum_ = 0;
    layer_calls_ = 0;
  }
  bool enabled_ = false;
  // The packed experts' bytes over their bf16 bytes (Model::PackExperts), 1 when not packed.
  double bf16_scale_ = 1;
  double distinct_sum_ = 0;     // sum over (decode step, layer) of distinct experts
  double bf16_bytes_sum_ = 0;   // ... of their bytes as bf16
  double width_bytes_sum_ = 0;  // ... of their bytes at the provider's widths
  double after_distinct_sum_ = 0, after_bf16_bytes_sum_ = 0, after_width_bytes_sum_ = 0;
  int64_t layer_calls_ = 0;

 private:
  int64_t hidden_, ffn_;
  const engine::ExpertWeightProvider* widths_;
};

// Runs the LYNX hook, then counts what the step will read (RecordAfter).
class CountingHook final : public engine::RoutingHook {
 public:
  CountingHook(engine::LynxRoutingHook* inner, DistinctExpertCounter* counter)
      : inner_(inner), counter_(counter) {}
  Status Rewrite(const engine::RoutingContext& ctx,
                 std::vector<engine::ExpertAssignment>* assignments) override {
    PW_RETURN_IF_ERROR(inner_->Rewrite(ctx, assignments));
    counter_->RecordAfter(ctx, *assignments);
    return Status::Ok();
  }

 private:
  engine::LynxRoutingHook* inner_;
  DistinctExpertCounter* counter_;
};

struct Row {
  std::string model;
  std::string experts;          // "bf16", "3-bit", ..., or the width map
  int batch = 0;
  double prefill_tps = 0, decode_tps = 0;
  double floor_bytes = 0;       // per decode step, experts as bf16
  double floor_bytes_width = 0; // per decode step, experts at the provider's widths
  double distinct = 0;          // mean distinct experts per MoE layer per decode step
  double expert_share = 0;      // fraction of decode time in expert matmuls
  double step_seconds = 0;      // median decode step time
  double cpu_util = 0;          // decode CPU time / (wall time * threads): < 1 = CPU shared/idle
  double step_cpu_seconds = 0;  // median decode step CPU time / threads
  double prefill_cpu_tps = 0;   // prompt tokens per (prefill CPU seconds / threads)
  // With --lynx (lynx = true: the run with the remap; the others leave these as before):
  bool lynx = false;
  std::string rule;                  // the remap's description
  double distinct_after = 0;         // mean distinct experts per MoE layer after the hook
  double floor_bytes_after = 0;      // floor_bytes with the experts after the hook
  double floor_bytes_width_after = 0;
  double remap_share = 0;            // hook time / decode time
  StepBytes floor_parts;             // floor_bytes by part (experts as bf16)
  engine::BlockTimes prefill_blocks; // with --block-times: the prefill's blocks, mean of the runs
  // With --floor-pairs: each decode step's wall time over the wall time of a read of its bytes
  // (floor_bytes_width) right after it, and the medians of the two times.
  std::vector<double> pair_ratios;
  double pair_step_seconds = 0, pair_read_seconds = 0;
};

// Bytes one decode step of `batch` sequences at mean context `ctx` must move (see top and
// bench/decode_bytes.h), with the routed experts' bytes given: their mean per MoE layer per step.
StepBytes FloorParts(const engine::Engine& eng, int batch, double expert_bytes_per_layer,
                     double ctx) {
  const double kv_elem = eng.options().kv_dtype == memory::KvDtype::kBf16 ? 2 : 4;
  return bench::DecodeStepBytes(eng.model(), batch, ctx, kv_elem, expert_bytes_per_layer);
}
double FloorBytes(const engine::Engine& eng, int batch, double expert_bytes_per_layer,
                  double ctx) {
  return FloorParts(eng, batch, expert_bytes_per_layer, ctx).total();
}

// --block-times: per model and batch, where the prefill went by block kind (wall time, mean
// of the timed runs): the kind's layers, its time per layer, prompt tokens per second per layer
// (batch x prompt over the time of one such layer), and its share of the prefill.
void PrintBlockTimes(const std::vector<Row>& rows, int prompt_len) {
  std::printf(
      "\nPrefill by layer block (wall time inside each block kind, mean of the runs; tok/s per "
      "layer = prompt tokens over one layer's time):\n\n"
      "| model | experts | batch | prompt | block | layers | ms per layer | tok/s per layer "
      "| share of blocks |\n|---|---|---:|---:|---|---:|---:|---:|---:|\n");
  for (const auto& r : rows) {
    if (r.lynx) continue;
    double all = 0;
    for (double s : r.prefill_blocks.seconds) all += s;
    for (int k = 0; k < engine::kNumBlockKinds; ++k) {
      const engine::BlockKind kind = static_cast<engine::BlockKind>(k);
      const int64_t layers = r.prefill_blocks.Layers(kind);
      if (layers == 0) continue;
      const double per_layer = r.prefill_blocks.seconds[k] / static_cast<double>(layers);
      std::printf("| %s | %s | %d | %d | %s | %lld | %.2f | %.0f | %.1f %% |\n", r.model.c_str(),
                  r.experts.c_str(), r.batch, prompt_len, engine::BlockKindName(kind),
                  static_cast<long long>(layers),
                  per_layer * 1e3, r.batch * prompt_len / per_layer,
                  100 * r.prefill_blocks.seconds[k] / all);
    }
  }
}

// One set of expert weights to benchmark: bf16 from the checkpoint (no store), a uniform width
// from the store, or a width map from a file.
struct ExpertConfig {
  std::string label;
  int bits = anyprec::kBf16Bits;  // uniform width (3..8 or 16) when map_path is empty
  std::string map_path;
};

struct Options {
  tools::LynxFlags lynx;
  std::vector<std::string> models;
  int threads = 2;
  // --dense / --lm-head: how attention, lm_head and dense MLPs are held (EngineOptions).
  DenseFormat dense = DenseFormat::kBf16;
  DenseFormat lm_head = DenseFormat::kAsDense;
  engine::Bf16ExpertForm bf16_experts = engine::Bf16ExpertForm::kPlain;  // --bf16-experts
  bool no_mmap = false;     // --no-mmap: the checkpoint copied into the process (EngineOptions)
  int runs = 5;
  int warmups = 0;
  int prompt_len = 64;
  int decode_steps = 16;
  std::vector<int> batches = {1, 8, 32};
  bench::ProbeOptions probe;
  std::string store;                  // empty: bf16 experts from the checkpoint
  std::vector<ExpertConfig> configs;  // with a store: one per --bits entry, then --bits-map
  anyprec::KernelPath kernel_path = anyprec::KernelPath::kFast;
  bool same_prompts = false;  // every sequence of a batch decodes the same prompt
  bool block_times = false;   // time the prefill's layer blocks by kind (engine/runner/block_times.h)
  int floor_pairs = 0;        // decode steps each timed beside a read of its bytes (0: none)
  int floor_streams = 1;      // the probe's best stream count on `threads` threads (wall)
};

// Decode steps (and sequences) one run of the options needs room for.
int MaxGenerated(const Options& o) { return std::max(o.decode_steps, o.floor_pairs) + 64; }

// The store-backed provider for one configuration.
Result<std::unique_ptr<anyprec::ApwExpertProvider>> MakeApwProvider(
    std::shared_ptr<const apw::ApwStore> store, const engine::Model& model, anyprec::WidthMap widths,
    anyprec::KernelPath path) {
  PW_ASSIGN_OR_RETURN(auto provider,
                      anyprec::ApwExpertProvider::Create(std::move(store), model, std::move(widths)));
  provider->set_kernel_path(path);
  return provider;
}

// Runs every batch size with the engine's experts behind `provider`; rows labelled `experts`.
// `lynx`: null runs the router's choice; otherwise the remap runs as the routing hook.
Result<std::vector<Row>> BenchExperts(engine::Engine& eng, const std::string& model_name,
                                      const std::string& experts,
                                      engine::ExpertWeightProvider* provider, const Options& o,
                                      uint64_t* next_id, engine::LynxRoutingHook* lynx = nullptr,
                                      const std::string& rule = "") {
  TimingProvider timing(provider);
  DistinctExpertCounter counter(eng.model().config(), provider);
  if (eng.model().packed_expert_bytes() > 0) {
    double plain = 0;
    for (const engine::LayerWeights& w : eng.model().layers()) {
      for (const engine::MlpWeights& e : w.experts) {
        for (const engine::Bf16Matrix* m : {&e.gate, &e.up, &e.down}) {
          if (m->packed != nullptr) plain += static_cast<double>(m->packed->PlainBytes());
        }
      }
    }
    counter.bf16_scale_ = static_cast<double>(eng.model().packed_expert_bytes()) / plain;
  }
  CountingHook counting(lynx, &counter);
  eng.SetMoeHooks({.provider = &timing,
                   .residency = nullptr,
                   .routing_hook = lynx ? &counting : nullptr,
                   .recorder = &counter});
  struct Unhook {  // the hooks point at locals: the engine must not keep them
    engine::Engine& e;
    ~Unhook() { e.SetMoeHooks({}); }
  } unhook{eng};
  const int vocab = eng.vocab_size();
  const int max_gen = MaxGenerated(o);
  std::mt19937 rng(1234);  // the same prompts for every set of experts
  auto random_prompt = [&] {
    std::vector<int32_t> prompt(o.prompt_len);
    for (auto& t : prompt) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
    return prompt;
  };
  // Adds `batch` sequences (one prompt for all with --same-prompts), their ids to *ids.
  auto add_batch = [&](int batch, std::vector<uint64_t>* ids) -> Status {
    engine::SamplingParams sp;
    sp.max_tokens = max_gen;
    sp.ignore_eos = true;
    std::vector<int32_t> first;
    for (int b = 0; b < batch; ++b) {
      std::vector<int32_t> prompt = o.same_prompts && b > 0 ? first : random_prompt();
      first = prompt;
      ids->push_back(*next_id);
      PW_RETURN_IF_ERROR(eng.AddSequence((*next_id)++, std::move(prompt), sp));
    }
    return Status::Ok();
  };
  // Steps the engine until no sequence is still prefilling.
  auto prefill_all = [&]() -> Status {
    for (;;) {
      auto infos = eng.Sequences();
      if (std::none_of(infos.begin(), infos.end(),
                       [](const engine::SequenceInfo& i) { return i.prefilling; })) {
        return Status::Ok();
      }
      PW_ASSIGN_OR_RETURN(auto step, eng.Step());
      (void)step;
    }
  };

  std::vector<Row> rows;
  for (int batch : o.batches) {
    std::vector<double> prefill_tps, decode_tps, step_s, expert_share, cpu_util, step_cpu;
    std::vector<double> prefill_cpu_tps, remap_share;
    double distinct_sum = 0, bf16_bytes_sum = 0, width_bytes_sum = 0;
    double after_distinct_sum = 0, after_bf16_sum = 0, after_width_sum = 0;
    int64_t distinct_calls = 0;
    engine::BlockTimes run_blocks, prefill_blocks;
    for (int run = -o.warmups; run < o.runs; ++run) {
      std::vector<uint64_t> ids;
      auto t0 = Clock::now();
      const double cpu0 = ProcessCpuSeconds();
      PW_RETURN_IF_ERROR(add_batch(batch, &ids));
      run_blocks.Reset();
      if (o.block_times) eng.SetBlockTimes(&run_blocks);
      PW_RETURN_IF_ERROR(prefill_all());
      auto t1 = Clock::now();
      const double cpu1 = ProcessCpuSeconds();
      eng.SetBlockTimes(nullptr);
      counter.enabled_ = true;
      counter.Reset();
      timing.seconds_ = 0;
      if (lynx) lynx->ResetStats();
      for (int s = 0; s < o.decode_steps; ++s) {
        PW_ASSIGN_OR_RETURN(auto step, eng.Step());
        if (step.num_decode_tokens != batch) {
          return Internal("decode step ran " + std::to_string(step.num_decode_tokens) +
                          " tokens, expected " + std::to_string(batch));
        }
      }
      auto t2 = Clock::now();
      const double cpu2 = ProcessCpuSeconds();
      counter.enabled_ = false;
      for (uint64_t id : ids) (void)eng.RemoveSequence(id);
      if (run < 0) continue;  // a warm-up: first touches of the mapped weights, scratch growth
      const double pre = Seconds(t0, t1), dec = Seconds(t1, t2);
      prefill_tps.push_back(batch * o.prompt_len / pre);
      decode_tps.push_back(batch * o.decode_steps / dec);
      step_s.push_back(dec / o.decode_steps);
      expert_share.push_back(timing.seconds_ / dec);
      cpu_util.push_back((cpu2 - cpu1) / (dec * o.threads));
      step_cpu.push_back((cpu2 - cpu1) / o.threads / o.decode_steps);
      prefill_cpu_tps.push_back(batch * o.prompt_len / ((cpu1 - cpu0) / o.threads));
      distinct_sum += counter.distinct_sum_;
      bf16_bytes_sum += counter.bf16_bytes_sum_;
      width_bytes_sum += counter.width_bytes_sum_;
      distinct_calls += counter.layer_calls_;
      after_distinct_sum += counter.after_distinct_sum_;
      after_bf16_sum += counter.after_bf16_bytes_sum_;
      after_width_sum += counter.after_width_bytes_sum_;
      if (lynx) remap_share.push_back(lynx->stats().seconds / dec);
      for (int k = 0; k < engine::kNumBlockKinds; ++k) {
        prefill_blocks.seconds[k] += run_blocks.seconds[k] / o.runs;
        prefill_blocks.blocks[k] += run_blocks.blocks[k];
      }
      prefill_blocks.passes += run_blocks.passes;
    }
    Row r;
    r.model = model_name;
    r.experts = experts;
    r.batch = batch;
    r.prefill_tps = Median(prefill_tps);
    r.decode_tps = Median(decode_tps);
    r.step_seconds = Median(step_s);
    r.expert_share = Median(expert_share);
    r.cpu_util = Median(cpu_util);
    r.step_cpu_seconds = Median(step_cpu);
    r.prefill_cpu_tps = Median(prefill_cpu_tps);
    const double calls = distinct_calls ? static_cast<double>(distinct_calls) : 1;
    r.distinct = distinct_sum / calls;
    const double mean_ctx = o.prompt_len + 0.5 * o.decode_steps;
    r.floor_parts = FloorParts(eng, batch, bf16_bytes_sum / calls, mean_ctx);
    r.floor_bytes = r.floor_parts.total();
    r.prefill_blocks = prefill_blocks;
    r.floor_bytes_width = FloorBytes(eng, batch, width_bytes_sum / calls, mean_ctx);
    if (lynx) {
      r.lynx = true;
      r.rule = rule;
      r.distinct_after = after_distinct_sum / calls;
      r.floor_bytes_after = FloorBytes(eng, batch, after_bf16_sum / calls, mean_ctx);
      r.floor_bytes_width_after =
          FloorBytes(eng, batch, after_width_sum / calls, mean_ctx);
      r.remap_share = Median(remap_share);
    }
    if (o.floor_pairs > 0) {
      // New sequences, prefilled, then each decode step followed by a read of its bytes.
      std::vector<uint64_t> ids;
      PW_RETURN_IF_ERROR(add_batch(batch, &ids));
      PW_RETURN_IF_ERROR(prefill_all());
      const auto bytes = static_cast<size_t>(r.floor_bytes_width);
      bench::ReadTimer reader(bytes, o.threads, o.floor_streams);
      reader.ReadSeconds(bytes);  // first touch of the timer's threads and pages
      std::vector<double> steps, reads;
      for (int i = 0; i < o.floor_pairs; ++i) {
        const auto t0 = Clock::now();
        PW_ASSIGN_OR_RETURN(auto step, eng.Step());
        const double dt = Seconds(t0, Clock::now());
        if (step.num_decode_tokens != batch) {
          return Internal("paired decode step ran " + std::to_string(step.num_decode_tokens) +
                          " tokens, expected " + std::to_string(batch));
        }
        // The pool's workers poll for a next job after the step: a read beside them shares
        // their cores (read 10 % slower at the default 500 us on an AMD Zen 4). The step after
        // this wait may pay their wake-up (tens of microseconds): it errs on the slow side.
        std::this_thread::sleep_for(std::chrono::microseconds(cpu::ThreadPool::SpinMicros() + 1000));
        const double rt = reader.ReadSeconds(bytes);
        steps.push_back(dt);
        reads.push_back(rt);
        r.pair_ratios.push_back(dt / rt);
      }
      for (uint64_t id : ids) (void)eng.RemoveSequence(id);
      r.pair_step_seconds = Median(steps);
      r.pair_read_seconds = Median(reads);
    }
    rows.push_back(r);
    std::fprintf(stderr, "  %s %s%s batch %d done (decode step %.2f ms)\n", r.model.c_str(),
                 r.experts.c_str(), lynx ? " +remap" : "", batch, r.step_seconds * 1e3);
  }
  return rows;
}

Result<std::vector<Row>> BenchModel(const std::string& dir, const Options& o) {
  const int max_batch = *std::max_element(o.batches.begin(), o.batches.end());
  engine::EngineOptions eo;
  eo.num_threads = o.threads;
  eo.dense = o.dense;
  eo.lm_head = o.lm_head;
  eo.bf16_experts = o.bf16_experts;
  eo.copy_weights = o.no_mmap;
  eo.block_size = 16;
  // Room for the prompt, the timed steps and any tokens decoded while other prompts prefill.
  const int max_gen = MaxGenerated(o);
  const int per_seq = (o.prompt_len + max_gen + eo.block_size - 1) / eo.block_size;
  eo.num_kv_blocks = max_batch * per_seq + 16;
  // Every prompt of the batch fits one step, so prefill is measured without decode mixed in.
  eo.max_batch_tokens = std::max(512, max_batch * o.prompt_len);
  PW_ASSIGN_OR_RETURN(auto eng, engine::Engine::Create(dir, eo));
  const std::string name = std::filesystem::path(dir).filename().string();
  uint64_t next_id = 1;
  std::unique_ptr<lynx::BatchRemapper> remapper;
  std::unique_ptr<engine::LynxRoutingHook> hook;
  std::string rule;
  if (o.lynx.on) {
    const ModelConfig& c = eng->model().config();
    PW_ASSIGN_OR_RETURN(remapper,
                        tools::MakeRemapper(o.lynx, static_cast<int>(c.num_experts),
                                            static_cast<int>(c.num_experts_per_tok), &rule));
    hook = std::make_unique<engine::LynxRoutingHook>(remapper.get());
    hook->Reserve(max_batch, static_cast<int>(c.num_experts), static_cast<int>(c.num_experts_per_tok));
    std::fprintf(stderr, "  %s: remap %s\n", name.c_str(), rule.c_str());
  }
  // Without the remap, then (with --lynx) with it, on the same prompts.
  auto both = [&](const std::string& label,
                  engine::ExpertWeightProvider* provider) -> Result<std::vector<Row>> {
    PW_ASSIGN_OR_RETURN(auto rows, BenchExperts(*eng, name, label, provider, o, &next_id));
    if (hook) {
      PW_ASSIGN_OR_RETURN(auto on, BenchExperts(*eng, name, label, provider, o, &next_id,
                                                hook.get(), rule));
      rows.insert(rows.end(), on.begin(), on.end());
    }
    return rows;
  };
  if (o.store.empty()) {
    engine::Bf16ExpertProvider bf16(eng->model());
    return both("bf16", &bf16);
  }
  PW_ASSIGN_OR_RETURN(std::shared_ptr<const apw::ApwStore> store, apw::ApwStore::Open(o.store));
  const apw::StoreInfo& info = store->info();
  std::vector<Row> rows;
  for (const ExpertConfig& c : o.configs) {
    auto widths = c.map_path.empty()
                      ? anyprec::WidthMap::Uniform(c.bits, info.num_layers, info.num_experts)
                      : anyprec::WidthMap::FromFile(c.map_path, info);
    if (!widths.ok()) return widths.status();
    std::string label = c.label;
    if (!c.map_path.empty()) {
      char avg[32];
      std::snprintf(avg, sizeof avg, " (%.2f bits)", widths->AverageBits(info));
      label += avg;
    }
    PW_ASSIGN_OR_RETURN(auto provider,
                        MakeApwProvider(store, eng->model(), std::move(widths).value(), o.kernel_path));
    std::fprintf(stderr, "  %s: experts %s from %s\n", name.c_str(), label.c_str(), o.store.c_str());
    PW_ASSIGN_OR_RETURN(auto r, both(label, provider.get()));
    rows.insert(rows.end(), r.begin(), r.end());
  }
  return rows;
}

// "1,8,32" -> {1, 8, 32}; false on an empty or non-numeric entry.
bool ParseList(const std::string& s, std::vector<int>* out) {
  out->clear();
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t comma = s.find(',', pos);
    if (comma == std::string::npos) comma = s.size();
    const std::string item = s.substr(pos, comma - pos);
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < INT32_MIN || v > INT32_MAX) return false;
    out->push_back(static_cast<int>(v));
    pos = comma + 1;
  }
  return true;
}

// --floor-pairs: per model, experts and batch, the decode steps each timed beside a read of the
// bytes it moves (the `@ width` bytes with --store, else the bf16-expert bytes), taken right
// after it with the probe's best stream count on the engine's threads.
void PrintPairedFloor(const std::vector<Row>& rows, const Options& o, bool widths) {
  std::printf(
      "\nEach decode step beside a read of its bytes right after it (%d pairs, %d thread%s, %d "
      "stream%s; bytes%s):\n\n",
      o.floor_pairs, o.threads, o.threads == 1 ? "" : "s", o.floor_streams,
      o.floor_streams == 1 ? "" : "s", widths ? " at the experts' widths" : " with experts as bf16");
  std::printf(
      "| model | experts | batch | bytes/step MB | step ms | read ms | read GB/s "
      "| step / read: median (min-max) |\n|---|---|---:|---:|---:|---:|---:|---:|\n");
  for (const Row& r : rows) {
    if (r.pair_ratios.empty()) continue;
    const auto [lo, hi] = std::minmax_element(r.pair_ratios.begin(), r.pair_ratios.end());
    std::printf("| %s | %s%s | %d | %.1f | %.2f | %.2f | %.1f | %.2f (%.2f-%.2f) |\n",
                r.model.c_str(), r.experts.c_str(), r.lynx ? " +remap" : "", r.batch,
                r.floor_bytes_width / 1e6, r.pair_step_seconds * 1e3, r.pair_read_seconds * 1e3,
                r.floor_bytes_width / r.pair_read_seconds / 1e9, Median(r.pair_ratios), *lo, *hi);
  }
}

int Main(int argc, char** argv) {
  SetLogProcessTag("pw-bench-engine");
  CLI::App app{"Engine prefill/decode throughput and the memory-bandwidth floor"};
  Options o;
  std::string batches = "1,8,32", streams = "1,2,4,8,16", bits, bits_map, kernel_path = "fast";
  double bw_gib = 1.5;
  app.add_option("--model", o.models, "model directory (repeatable)");
  app.add_option("--threads", o.threads, "engine and bandwidth threads")->check(CLI::Range(1, 256));
  app.add_option("--runs", o.runs, "runs per point (median)")->check(CLI::Range(1, 100));
  app.add_option("--warmups", o.warmups, "untimed runs before each point's (as llama-bench's warm-up)")
      ->check(CLI::Range(0, 100));
  app.add_option("--prompt-len", o.prompt_len, "prompt tokens per sequence")
      ->check(CLI::Range(1, 8192));
  app.add_option("--decode-steps", o.decode_steps, "decode steps timed per run")
      ->check(CLI::Range(1, 4096));
  app.add_option("--batches", batches, "comma-separated batch sizes");
  app.add_option("--bw-gib", bw_gib, "bandwidth buffer size, GiB (> last-level cache)")
      ->check(CLI::Range(0.25, 64.0));
  app.add_option("--bw-streams", streams, "interleaved read streams per thread to try (1,2,4,8,16)");
  app.add_option("--bw-passes", o.probe.passes, "timed passes per stream count (median)")
      ->check(CLI::Range(1, 100));
  app.add_option("--store", o.store, "any-precision expert store (.apw) of the one --model");
  app.add_option("--bits", bits, "with --store: comma-separated widths, 3..8 or 16 (bf16)");
  app.add_option("--bits-map", bits_map, "with --store: a width map file (pw-quantize plan)");
  app.add_option("--kernel-path", kernel_path, "any-precision kernels: fast (int8, default) or exact (fp16 LUT)")
      ->check(CLI::IsMember({"exact", "fast"}));
  tools::AddDenseFlags(&app, &o.dense, &o.lm_head);
  tools::AddBf16ExpertsFlag(&app, &o.bf16_experts);
  app.add_flag("--no-mmap", o.no_mmap,
               "read the checkpoint into the process's memory instead of mapping it (llama.cpp's --no-mmap)");
  app.add_flag("--same-prompts", o.same_prompts,
               "every sequence of a batch gets the same prompt (identical routing, as "
               "llama-batched-bench decodes)");
  app.add_flag("--block-times", o.block_times,
               "time the prefill's layer blocks by kind (full, linear or latent attention, "
               "MLP) and print where the prefill went");
  app.add_option("--floor-pairs", o.floor_pairs,
                 "after each point's runs, N decode steps each followed by a read of its bytes "
                 "(the floor measured beside the step it bounds)")
      ->check(CLI::Range(0, 4096));
  tools::AddLynxFlags(&app, &o.lynx);
  CLI11_PARSE(app, argc, argv);
  auto usage = [](const std::string& msg) {
    std::fprintf(stderr, "pw-bench-engine: %s\n", msg.c_str());
    return 2;
  };
  if (!ParseList(batches, &o.batches) || o.batches.empty()) return usage("bad --batches " + batches);
  for (int b : o.batches) {
    if (b < 1 || b > 4096) return usage("bad --batches entry " + std::to_string(b));
  }
  if (!bench::ParseStreamList(streams, &o.probe.streams)) {
    return usage("bad --bw-streams " + streams + " (entries from 1, 2, 4, 8, 16)");
  }
  o.probe.bytes = static_cast<size_t>(bw_gib * (1ull << 30));
  {
    auto path = anyprec::ParseKernelPath(kernel_path);
    if (!path.ok()) return usage(path.status().message());
    o.kernel_path = *path;
  }
  if (o.store.empty()) {
    if (!bits.empty() || !bits_map.empty()) return usage("--bits and --bits-map need --store");
  } else {
    if (bits.empty() && bits_map.empty()) return usage("--store needs --bits and/or --bits-map");
    std::vector<int> widths;
    if (!bits.empty() && !ParseList(bits, &widths)) return usage("bad --bits " + bits);
    for (int b : widths) {
      if (!((b >= anyprec::kMinBits && b <= anyprec::kMaxBits) || b == anyprec::kBf16Bits)) {
        return usage("bad --bits entry " + std::to_string(b) + " (3..8 or 16)");
      }
      o.configs.push_back(
          {b == anyprec::kBf16Bits ? "bf16 (store)" : std::to_string(b) + "-bit", b, ""});
    }
    if (!bits_map.empty()) {
      o.configs.push_back({"map " + std::filesystem::path(bits_map).filename().string(), 0, bits_map});
    }
    if (o.models.size() > 1) return usage("--store goes with one --model");
  }
  if (o.models.empty()) {
    const char* syn = std::getenv("PW_SYNTHETIC_MODEL");
    if (o.store.empty()) o.models.push_back("models/tiny-moe");
    o.models.push_back(syn ? syn : "build/synthetic-olmoe");
  }

  std::vector<int> probe_threads = {1};
  if (o.threads > 1) probe_threads.push_back(o.threads);
  std::fprintf(stderr, "measuring read bandwidth (%.2f GiB, 1 and %d threads, streams %s, %s loads)...\n",
               bw_gib, o.threads, streams.c_str(), bench::ReadIsaName());
  const std::vector<bench::ThreadsRate> probe = bench::ProbeReadBandwidth(o.probe, probe_threads);
  for (const auto& r : probe) std::fprintf(stderr, "  %s\n", bench::DescribeRate(r).c_str());
  const bench::ThreadsRate& bw = probe.back();  // the engine's thread count
  o.floor_streams = bw.best_streams;

  std::vector<Row> rows;
  for (const auto& dir : o.models) {
    if (!std::filesystem::exists(dir + "/config.json")) {
      if (!o.store.empty()) {
        std::fprintf(stderr, "pw-bench-engine: %s: no config.json\n", dir.c_str());
        return 1;
      }
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

  const bool widths = !o.store.empty();
  std::printf("read bandwidth (%.2f GiB buffer, %s 64-byte loads, median of %d passes per stream count):\n",
              bw_gib, bench::ReadIsaName(), o.probe.passes);
  for (const auto& r : probe) std::printf("  %s\n", bench::DescribeRate(r).c_str());
  std::printf("floors use the best rates on %d thread%s: %.1f GB/s wall (%d stream%s), %.1f GB/s "
              "per CPU second (%d stream%s)\n",
              bw.threads, bw.threads == 1 ? "" : "s", bw.wall / 1e9, bw.best_streams,
              bw.best_streams == 1 ? "" : "s", bw.cpu / 1e9, bw.best_cpu_streams,
              bw.best_cpu_streams == 1 ? "" : "s");
  if (widths) std::printf("experts from %s\n", o.store.c_str());
  std::printf("prompt %d tokens%s, %d decode steps, median of %d runs after %d warm-up runs, %d threads\n\n",
              o.prompt_len, o.same_prompts ? " (one prompt for every sequence of a batch)" : "",
              o.decode_steps, o.runs, o.warmups, o.threads);
  std::printf("Wall clock:\n\n");
  if (widths) {
    std::printf(
        "| model | experts | batch | prefill tok/s | decode tok/s | decode step ms | floor tok/s "
        "| step / floor | floor tok/s @ width | step / floor @ width | CPU %% |\n");
    std::printf("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  } else {
    std::printf(
        "| model | batch | prefill tok/s | decode tok/s | decode step ms | floor tok/s "
        "| step / floor | CPU %% |\n");
    std::printf("|---|---:|---:|---:|---:|---:|---:|---:|\n");
  }
  for (const auto& r : rows) {
    if (r.lynx) continue;
    const double floor_s = r.floor_bytes / bw.wall, floor_w = r.floor_bytes_width / bw.wall;
    if (widths) {
      std::printf("| %s | %s | %d | %.1f | %.1f | %.2f | %.1f | %.2f | %.1f | %.2f | %.0f |\n",
                  r.model.c_str(), r.experts.c_str(), r.batch, r.prefill_tps, r.decode_tps,
                  r.step_seconds * 1e3, r.batch / floor_s, r.step_seconds / floor_s,
                  r.batch / floor_w, r.step_seconds / floor_w, 100 * r.cpu_util);
    } else {
      std::printf("| %s | %d | %.1f | %.1f | %.2f | %.1f | %.2f | %.0f |\n", r.model.c_str(),
                  r.batch, r.prefill_tps, r.decode_tps, r.step_seconds * 1e3, r.batch / floor_s,
                  r.step_seconds / floor_s, 100 * r.cpu_util);
    }
  }
  std::printf(
      "\nPer CPU second (step = decode CPU time / threads; floor from the per-CPU-second "
      "bandwidth):\n\n");
  if (widths) {
    std::printf(
        "| model | experts | batch | prefill tok/s | distinct experts/layer | bytes/step MB "
        "| bytes/step MB @ width | decode step ms | decode tok/s | floor tok/s | step / floor "
        "| floor tok/s @ width | step / floor @ width | experts %% |\n");
    std::printf("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  } else {
    std::printf(
        "| model | batch | prefill tok/s | distinct experts/layer | bytes/step MB "
        "| decode step ms | decode tok/s | floor tok/s | step / floor | experts %% |\n");
    std::printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  }
  for (const auto& r : rows) {
    if (r.lynx) continue;
    const double floor_s = r.floor_bytes / bw.cpu, floor_w = r.floor_bytes_width / bw.cpu;
    if (widths) {
      std::printf(
          "| %s | %s | %d | %.1f | %.1f | %.1f | %.1f | %.2f | %.1f | %.1f | %.2f | %.1f | %.2f "
          "| %.0f |\n",
          r.model.c_str(), r.experts.c_str(), r.batch, r.prefill_cpu_tps, r.distinct,
          r.floor_bytes / 1e6, r.floor_bytes_width / 1e6, r.step_cpu_seconds * 1e3,
          r.batch / r.step_cpu_seconds, r.batch / floor_s, r.step_cpu_seconds / floor_s,
          r.batch / floor_w, r.step_cpu_seconds / floor_w, 100 * r.expert_share);
    } else {
      std::printf("| %s | %d | %.1f | %.1f | %.1f | %.2f | %.1f | %.1f | %.2f | %.0f |\n",
                  r.model.c_str(), r.batch, r.prefill_cpu_tps, r.distinct, r.floor_bytes / 1e6,
                  r.step_cpu_seconds * 1e3, r.batch / r.step_cpu_seconds, r.batch / floor_s,
                  r.step_cpu_seconds / floor_s, 100 * r.expert_share);
    }
  }
  std::printf(
      "\nBytes of a decode step (bench/decode_bytes.h; experts as bf16, KV at the mean "
      "context):\n\n| model | batch | weights MB | KV MB | recurrent state MB (read + write) "
      "| experts MB | total MB |\n|---|---:|---:|---:|---:|---:|---:|\n");
  for (const auto& r : rows) {
    if (r.lynx || r.experts != rows.front().experts) continue;
    const StepBytes& p = r.floor_parts;
    std::printf("| %s | %d | %.2f | %.2f | %.2f | %.2f | %.2f |\n", r.model.c_str(), r.batch,
                p.weights / 1e6, p.kv / 1e6, p.state / 1e6, p.experts / 1e6, p.total() / 1e6);
  }
  if (o.block_times) PrintBlockTimes(rows, o.prompt_len);
  if (o.floor_pairs > 0) PrintPairedFloor(rows, o, widths);
  if (o.lynx.on) {
    std::printf(
        "\nRemap (off = the router's choice, on = the remap as routing hook; step CPU = decode "
        "CPU time / threads; floors at the wall bandwidth, experts as bf16%s):\n\n",
        widths ? " and @ width" : "");
    std::printf(
        "| model | experts | batch | remap | distinct/layer off | on | step ms off | on | speed-up "
        "| step CPU ms off | on | floor ms off | on |%s remap %% of step | CPU %% on |\n",
        widths ? " floor ms @ width off | on |" : "");
    std::printf("|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|%s---:|---:|\n",
                widths ? "---:|---:|" : "");
    for (const auto& on : rows) {
      if (!on.lynx) continue;
      const Row* off = nullptr;
      for (const auto& r : rows) {
        if (!r.lynx && r.model == on.model && r.experts == on.experts && r.batch == on.batch) off = &r;
      }
      if (off == nullptr) continue;
      std::printf("| %s | %s | %d | %s | %.1f | %.1f | %.2f | %.2f | %.2fx | %.2f | %.2f | %.2f | %.2f |",
                  on.model.c_str(), on.experts.c_str(), on.batch, on.rule.c_str(), off->distinct,
                  on.distinct_after, off->step_seconds * 1e3, on.step_seconds * 1e3,
                  off->step_seconds / on.step_seconds, off->step_cpu_seconds * 1e3,
                  on.step_cpu_seconds * 1e3, off->floor_bytes / bw.wall * 1e3,
                  on.floor_bytes_after / bw.wall * 1e3);
      if (widths) {
        std::printf(" %.2f | %.2f |", off->floor_bytes_width / bw.wall * 1e3,
                    on.floor_bytes_width_after / bw.wall * 1e3);
      }
      std::printf(" %.2f | %.0f |\n", 100 * on.remap_share, 100 * on.cpu_util);
    }
  }
  return 0;
}

}  // namespace
}  // namespace pw::bench

int main(int argc, char** argv) { return pw::bench::Main(argc, argv); }
