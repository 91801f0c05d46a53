#include "quant/quantize_model.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <sstream>
#include <vector>

#include "common/formats/apw_store.h"
#include "common/dtype.h"
#include "engine/experts/apw_expert_provider.h"
#include "quant/calibration_tokens.h"
#include "kernels/anyprec/quantizer.h"
#include "engine/engine.h"
#include "engine/experts/calibration_recorder.h"
#include "engine/experts/bf16_expert_provider.h"
#include "common/formats/checkpoint_experts.h"
#include "common/formats/model_hash_cache.h"
#include "common/expert_block.h"
#include "quant/block_write_queue.h"
#include "quant/store_build_dir.h"

namespace pw::anyprec {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// One-line progress bar with ETA on stderr.
class Progress {
 public:
  Progress(const char* what, double total, bool enabled)
      : what_(what), total_(total), enabled_(enabled), start_(Clock::now()) {}
  void Update(double done) {
    if (!enabled_) return;
    const auto now = Clock::now();
    if (done < total_ && Seconds(last_, now) < 0.5) return;
    last_ = now;
    const double frac = total_ > 0 ? std::min(1.0, done / total_) : 1.0;
    const double elapsed = Seconds(start_, now);
    const double eta = frac > 0 ? elapsed * (1 - frac) / frac : 0;
    const int width = 30, filled = static_cast<int>(frac * width);
    std::fprintf(stderr, "\r%-10s [%s%s] %5.1f%%  %6.1fs elapsed  ETA %6.1fs", what_,
                 std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(),
                 100 * frac, elapsed, eta);
    if (done >= total_) std::fprintf(stderr, "\n");
  }

 private:
  const char* what_;
  double total_;
  bool enabled_;
  Clock::time_point start_, last_{};
};

// What the bytes of a store depend on besides the checkpoint: a resume directory holding parts
// of another build is emptied (store_build_dir.h).
std::string BuildDescription(const QuantizeModelOptions& o, const CalibrationSource& calib, uint64_t model_hash) {
  char line[512];
  std::snprintf(line, sizeof(line),
                "pagedweight store build 2\nmodel_hash %016llx\nseed_bits %d\nmax_bits %d\nthreads %d\nctx %d\n"
                "max_calib_tokens %lld\nprior_tokens %d\nfloor_rel %.17g\n",
                static_cast<unsigned long long>(model_hash), o.seed_bits, o.max_bits, o.threads, o.ctx,
                static_cast<long long>(o.max_calib_tokens), o.prior_tokens, o.floor_rel);
  std::string s = line;
  if (calib.random_tokens > 0) {
    s += "calib random " + std::to_string(calib.random_tokens) + " seed " + std::to_string(calib.seed) + "\n";
  } else if (calib.bundled_text) {
    s += "calib " + DescribeCalibration(calib) + "\n";
  } else {
    std::error_code ec;
    const auto size = std::filesystem::file_size(calib.text_path, ec);
    s += "calib text " + calib.text_path + " bytes " + std::to_string(ec ? 0 : size) + " tokenizer " +
         calib.tokenizer_path + "\n";
  }
  return s;
}

}  // namespace

Result<QuantizeModelReport> QuantizeModel(const QuantizeModelOptions& o) {
  const auto t_start = Clock::now();
  if (o.ctx < 2) return InvalidArgument("--ctx must be at least 2");
  if (o.threads < 1) return InvalidArgument("--threads must be at least 1");
  engine::EngineOptions eo;
  eo.num_threads = o.threads;
  eo.max_batch_tokens = std::max(o.ctx, 16);
  eo.num_kv_blocks = (o.ctx + eo.block_size - 1) / eo.block_size + 4;
  QuantizeModelReport report;
  PW_ASSIGN_OR_RETURN(auto eng, engine::Engine::Create(o.model_dir, eo));
  const auto t_loaded = Clock::now();
  report.load_seconds = Seconds(t_start, t_loaded);
  const engine::Model& model = eng->model();
  const ModelConfig& cfg = model.config();
  const int L = static_cast<int>(cfg.num_layers), E = static_cast<int>(cfg.num_experts);
  // Dense layers (GLM-4.5's and DeepSeek-V3's first_k_dense_replace, Qwen3-Next's
  // mlp_only_layers) have no routed experts: the store holds the MoE layers' blocks, numbered by
  // the model's layers, and calibration statistics exist only for them.
  std::vector<uint32_t> moe_layers;
  for (int l = 0; l < L; ++l) {
    if (model.layers()[l].is_moe) moe_layers.push_back(static_cast<uint32_t>(l));
  }
  if (moe_layers.empty()) return InvalidArgument(o.model_dir + ": the model has no MoE layers to store");
  const int moe_count = static_cast<int>(moe_layers.size());
  const int H = static_cast<int>(cfg.hidden_size), I = static_cast<int>(cfg.moe_intermediate_size);
  // The model hash reads every expert byte in one serial stream (FNV-1a: about 2 s at OLMoE's
  // size). It runs on a thread of its own beside the calibration's forward passes, which use the
  // other cores' time it leaves, unless the resume directory may hold saved statistics: whether
  // they are this build's is known from the hash, so then it comes first.
  auto hash_model = [&]() -> Result<CachedModelHash> {
    const auto t0 = Clock::now();
    CachedModelHash h;
    if (o.model_hash_cache.empty()) {
      PW_ASSIGN_OR_RETURN(h.hash, ModelHash(model.dir()));
    } else {
      PW_ASSIGN_OR_RETURN(h, ModelHashCached(model.dir(), o.model_hash_cache));
    }
    report.hash_seconds = Seconds(t0, Clock::now());
    return h;
  };
  std::future<Result<CachedModelHash>> hashing = std::async(std::launch::async, hash_model);
  uint64_t hash = 0;
  CalibrationSource calib = ResolveDefaultCalibration(CalibrationSourceOf(o));
  calib.max_tokens = o.max_calib_tokens;
  report.calibration = DescribeCalibration(calib);
  std::optional<StoreBuildDir> parts;
  auto open_parts = [&]() -> Status {
    PW_ASSIGN_OR_RETURN(CachedModelHash h, hashing.get());
    hash = h.hash;
    report.hash_remembered = h.from_cache;
    if (!o.resume_dir.empty()) {
      PW_ASSIGN_OR_RETURN(StoreBuildDir d, StoreBuildDir::Open(o.resume_dir, BuildDescription(o, calib, hash)));
      parts = std::move(d);
    }
    return Status::Ok();
  };
  report.hash_beside_forward = !StoreBuildDir::MayHoldCalibration(o.resume_dir);
  if (!report.hash_beside_forward) PW_RETURN_IF_ERROR(open_parts());

  // 1. Calibration (or its statistics from an earlier, interrupted build).
  CalibrationStats stats;
  if (parts) {
    PW_ASSIGN_OR_RETURN(auto saved, parts->LoadCalibration(L, E, H, I));
    if (saved) {
      stats = std::move(*saved);
      report.calibration_reused = true;
      if (o.progress) std::fprintf(stderr, "calibrate: reused the statistics in %s\n", parts->dir().c_str());
    }
  }
  if (!report.calibration_reused) {
    const auto t_tokens = Clock::now();
    PW_ASSIGN_OR_RETURN(std::vector<int32_t> ids, CalibrationTokens(calib, eng->vocab_size()));
    const auto t_forward = Clock::now();
    report.tokens_seconds = Seconds(t_tokens, t_forward);
    engine::Bf16ExpertProvider bf16(model);
    CalibrationRecorder recorder(&bf16, L, E, H, I);
    engine::MoeHooks hooks;
    hooks.provider = &recorder;
    eng->SetMoeHooks(hooks);
    {
      // Each window is a prefill into leased KV blocks: the experts see what ForwardLogits
      // would give them, but the lm_head runs for the last position only (the statistics need
      // no logits; at OLMoE's dimensions the lm_head is most of a token's work outside them).
      PW_ASSIGN_OR_RETURN(std::vector<int32_t> blocks, eng->LeaseKvBlocks(engine::BlocksForTokens(o.ctx, eo.block_size)));
      Progress bar("calibrate", static_cast<double>(ids.size()), o.progress);
      Status st;
      for (size_t at = 0; at < ids.size() && st.ok(); at += o.ctx) {
        const size_t n = std::min<size_t>(o.ctx, ids.size() - at);
        auto r = eng->Prefill(std::span<const int32_t>(ids.data() + at, n), blocks, engine::SamplingParams{});
        if (!r.ok()) st = r.status().WithContext("calibration window at token " + std::to_string(at));
        bar.Update(static_cast<double>(at + n));
      }
      PW_RETURN_IF_ERROR(eng->ReturnKvBlocks(blocks));
      PW_RETURN_IF_ERROR(st);
    }
    eng->SetMoeHooks({});
    report.forward_seconds = Seconds(t_forward, Clock::now());
    report.calib_tokens = static_cast<int64_t>(ids.size());
    stats.num_layers = L;
    stats.num_experts = E;
    stats.hidden = H;
    stats.ffn = I;
    const size_t blocks = static_cast<size_t>(L) * E * kProjsPerExpert;
    stats.tokens.resize(blocks);
    stats.sums.resize(blocks);
    for (size_t i = 0; i < blocks; ++i) {
      const ExpertBlock b = ExpertBlockAt(i, E);
      stats.tokens[i] = recorder.Tokens(static_cast<int>(b.layer), static_cast<int>(b.expert), b.proj);
      stats.sums[i] = recorder.SumSquares(static_cast<int>(b.layer), static_cast<int>(b.expert), b.proj);
    }
    if (report.hash_beside_forward) PW_RETURN_IF_ERROR(open_parts());
    if (parts) PW_RETURN_IF_ERROR(parts->SaveCalibration(stats));
  }
  const auto t_calib = Clock::now();
  report.calib_seconds = Seconds(t_start, t_calib);

  // 2 + 3. Sensitivities, quantization, store: layer l's blocks, gate_up of every expert then
  // down of every expert, added to `writer`.
  QuantizeOptions qo;
  qo.seed_bits = o.seed_bits;
  qo.max_bits = o.max_bits;
  qo.threads = o.threads;
  std::vector<float> h;
  // The writes run behind the fit (block_write_queue.h): a block's Add runs on the queue's
  // thread, in block order, with the fitted block it owns.
  double check_seconds = 0;  // an earlier build's blocks checked before they are kept
  BlockWriteQueue writes(/*capacity=*/2);
  auto quantize_layer = [&](int l, const std::shared_ptr<apw::ApwWriter>& writer,
                            const std::function<void(double)>& on_block) -> Status {
    for (auto proj : {engine::ExpertProj::kGateUp, engine::ExpertProj::kDown}) {
      const int cols = proj == engine::ExpertProj::kGateUp ? H : I;
      // The layer's mean input statistics over every routed token of this projection.
      std::vector<double> layer_sum(cols, 0.0);
      uint64_t layer_tokens = 0;
      for (int e = 0; e < E; ++e) {
        const auto& s = stats.sums[ExpertBlockIndex(l, e, proj, E)];
        for (int j = 0; j < cols; ++j) layer_sum[j] += s[j];
        layer_tokens += stats.tokens[ExpertBlockIndex(l, e, proj, E)];
      }
      std::vector<double> hbar(cols, 1.0);
      double hbar_mean = 1.0;
      if (layer_tokens > 0) {
        hbar_mean = 0;
        for (int j = 0; j < cols; ++j) hbar_mean += (hbar[j] = layer_sum[j] / layer_tokens) / cols;
        if (!(hbar_mean > 0)) hbar_mean = 1.0;
      }
      const double floor = o.floor_rel * hbar_mean;
      for (int e = 0; e < E; ++e) {
        const auto t_prepare = Clock::now();
        const auto& s = stats.sums[ExpertBlockIndex(l, e, proj, E)];
        const uint64_t tokens = stats.tokens[ExpertBlockIndex(l, e, proj, E)];
        const double n = static_cast<double>(tokens);
        h.resize(cols);
        for (int j = 0; j < cols; ++j) {
          const double v = (s[j] + o.prior_tokens * hbar[j]) / (n + o.prior_tokens);
          h[j] = static_cast<float>(std::max(v, floor));
        }
        const engine::MlpWeights& mw = model.layers()[l].experts[e];
        const int rows = proj == engine::ExpertProj::kGateUp ? 2 * I : H;
        // gate_up: the gate's I rows, then the up's; each row converted on the thread fitting it.
        auto row_of = [&mw, proj, I, cols](int r, float* out) {
          const uint16_t* src = proj == engine::ExpertProj::kDown ? mw.down.data + static_cast<size_t>(r) * cols
                                : r < I ? mw.gate.data + static_cast<size_t>(r) * cols
                                        : mw.up.data + static_cast<size_t>(r - I) * cols;
          for (int j = 0; j < cols; ++j) out[j] = Bf16ToF32(src[j]);
        };
        const auto t_fit = Clock::now();
        report.prepare_seconds += Seconds(t_prepare, t_fit);
        auto q = QuantizeBlock(row_of, rows, cols, h.data(), qo);
        report.fit_seconds += Seconds(t_fit, Clock::now());
        if (!q.ok()) {
          return q.status().WithContext("layer " + std::to_string(l) + ", expert " + std::to_string(e) +
                                        (proj == engine::ExpertProj::kGateUp ? ", gate_up" : ", down"));
        }
        auto fitted = std::make_shared<QuantizedBlock>(std::move(*q));
        const apw::BlockKind kind = proj == engine::ExpertProj::kGateUp ? apw::BlockKind::kGateUp : apw::BlockKind::kDown;
        PW_RETURN_IF_ERROR(writes.Push([fitted, writer, l, e, kind, rows, cols, tokens]() -> Status {
          apw::BlockData b;
          b.layer = static_cast<uint32_t>(l);
          b.expert = static_cast<uint32_t>(e);
          b.kind = kind;
          b.rows = static_cast<uint32_t>(rows);
          b.cols = static_cast<uint32_t>(cols);
          for (int p = 0; p < kNumPlanes; ++p) b.planes[p] = fitted->block.Plane(p);
          for (int bits = kMinBits; bits <= kMaxBits; ++bits) {
            b.luts[bits] = fitted->block.luts[bits].data();
            b.damage[bits] = fitted->damage[bits];
          }
          b.damage[0] = fitted->damage[0];
          b.calib_tokens = tokens;
          return writer->Add(b);
        }));
        ++report.num_blocks;
        on_block(proj == engine::ExpertProj::kGateUp ? 2 : 1);
      }
    }
    return Status::Ok();
  };

  const apw::StoreInfo info{static_cast<uint32_t>(L), static_cast<uint32_t>(E), static_cast<uint32_t>(H),
                            static_cast<uint32_t>(I), hash, moe_layers};
  if (!parts) {
    PW_ASSIGN_OR_RETURN(std::shared_ptr<apw::ApwWriter> writer, apw::ApwWriter::Create(o.out_path, info));
    Progress bar("quantize", 3.0 * moe_count * E, o.progress);
    double done = 0;
    for (const uint32_t ml : moe_layers) {
      const int l = static_cast<int>(ml);
      PW_RETURN_IF_ERROR(quantize_layer(l, writer, [&](double units) { bar.Update(done += units); }));
    }
    PW_RETURN_IF_ERROR(writes.Drain());
    PW_RETURN_IF_ERROR(writer->Finish());
  } else {
    // The store is written once, to its .tmp; after each layer the .tmp is flushed and the
    // resume directory's progress lists its blocks (on the write queue's thread, behind the
    // fit), so a killed build continues the .tmp after the last layer listed. A progress that
    // does not check out (another --out, a damaged .tmp) starts the store over, saying why.
    std::shared_ptr<apw::ApwWriter> store;
    PW_ASSIGN_OR_RETURN(std::optional<apw::ApwWriter::Progress> saved, parts->LoadStoreProgress());
    if (saved) {
      const auto t_check = Clock::now();
      auto resumed = apw::ApwWriter::Resume(o.out_path, info, *saved);
      check_seconds += Seconds(t_check, Clock::now());
      if (resumed.ok()) {
        store = std::move(*resumed);
      } else {
        std::fprintf(stderr, "quantize: starting the store over: %s\n", resumed.status().message().c_str());
      }
    }
    if (!store) {
      PW_ASSIGN_OR_RETURN(store, apw::ApwWriter::Create(o.out_path, info, /*keep_unfinished=*/true));
    }
    const StoreBuildDir dir = *parts;
    for (int k = 0; k < moe_count; ++k) {
      const int l = static_cast<int>(moe_layers[k]);
      if (store->LayerComplete(static_cast<uint32_t>(l))) {
        ++report.layers_reused;
        continue;
      }
      const auto t_layer = Clock::now();
      PW_RETURN_IF_ERROR(quantize_layer(l, store, [](double) {}));
      // The layer is recorded (and the progress line printed) once its last block is written.
      const int reused = report.layers_reused;
      PW_RETURN_IF_ERROR(writes.Push([store, dir, t_layer, t_calib, l, k, moe_count, reused,
                                      progress = o.progress]() -> Status {
        PW_ASSIGN_OR_RETURN(apw::ApwWriter::Progress p, store->Flush());
        PW_RETURN_IF_ERROR(dir.SaveStoreProgress(p));
        if (progress) {
          const double elapsed = Seconds(t_calib, Clock::now());
          const int done_now = k + 1 - reused;
          const double eta = done_now > 0 ? elapsed / done_now * (moe_count - k - 1) : 0;
          std::fprintf(stderr, "quantize: layer %d (%d/%d) done (%.1fs; %.1fs elapsed, ETA %.1fs; %d reused)\n", l,
                       k + 1, moe_count, Seconds(t_layer, Clock::now()), elapsed, eta, reused);
        }
        return Status::Ok();
      }));
    }
    PW_RETURN_IF_ERROR(writes.Drain());
    report.assemble_seconds += check_seconds;
    const auto t_publish = Clock::now();
    PW_RETURN_IF_ERROR(store->Finish());
    PW_RETURN_IF_ERROR(parts->Remove());
    report.assemble_seconds += Seconds(t_publish, Clock::now());
  }
  report.write_seconds = writes.busy_seconds();
  report.num_blocks = moe_count * E * kProjsPerExpert;  // reused layers' blocks included
  const auto t_end = Clock::now();
  report.quantize_seconds = Seconds(t_calib, t_end);
  report.total_seconds = Seconds(t_start, t_end);
  return report;
}

}  // namespace pw::anyprec
