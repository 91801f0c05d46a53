#include "quant/quantize_model.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
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

}  // namespace

Result<QuantizeModelReport> QuantizeModel(const QuantizeModelOptions& o) {
  const auto t_start = Clock::now();
  if (o.ctx < 2) return InvalidArgument("--ctx must be at least 2");
  if (o.threads < 1) return InvalidArgument("--threads must be at least 1");
  engine::EngineOptions eo;
  eo.num_threads = o.threads;
  eo.max_batch_tokens = std::max(o.ctx, 16);
  eo.num_kv_blocks = (o.ctx + eo.block_size - 1) / eo.block_size + 4;
  PW_ASSIGN_OR_RETURN(auto eng, engine::Engine::Create(o.model_dir, eo));
  const engine::Model& model = eng->model();
  const ModelConfig& cfg = model.config();
  for (const auto& layer : model.layers()) {
    if (!layer.is_moe) return Unsupported(o.model_dir + ": dense (non-MoE) layers are not supported by .apw stores");
  }
  const int L = static_cast<int>(cfg.num_layers), E = static_cast<int>(cfg.num_experts);
  const int H = static_cast<int>(cfg.hidden_size), I = static_cast<int>(cfg.moe_intermediate_size);

  // 1. Calibration.
  CalibrationSource calib = CalibrationSourceOf(o);
  calib.max_tokens = o.max_calib_tokens;
  PW_ASSIGN_OR_RETURN(std::vector<int32_t> ids, CalibrationTokens(calib, eng->vocab_size()));
  engine::Bf16ExpertProvider bf16(model);
  CalibrationRecorder recorder(&bf16, L, E, H, I);
  engine::MoeHooks hooks;
  hooks.provider = &recorder;
  eng->SetMoeHooks(hooks);
  QuantizeModelReport report;
  {
    Progress bar("calibrate", static_cast<double>(ids.size()), o.progress);
    for (size_t at = 0; at < ids.size(); at += o.ctx) {
      const size_t n = std::min<size_t>(o.ctx, ids.size() - at);
      auto logits = eng->ForwardLogits(std::span<const int32_t>(ids.data() + at, n));
      if (!logits.ok()) return logits.status().WithContext("calibration window at token " + std::to_string(at));
      bar.Update(static_cast<double>(at + n));
    }
  }
  eng->SetMoeHooks({});
  report.calib_tokens = static_cast<int64_t>(ids.size());
  const auto t_calib = Clock::now();
  report.calib_seconds = Seconds(t_start, t_calib);

  // 2 + 3. Sensitivities, quantization, store.
  PW_ASSIGN_OR_RETURN(uint64_t hash, ModelHash(model.dir()));
  apw::StoreInfo info{static_cast<uint32_t>(L), static_cast<uint32_t>(E), static_cast<uint32_t>(H),
                      static_cast<uint32_t>(I), hash};
  PW_ASSIGN_OR_RETURN(auto writer, apw::ApwWriter::Create(o.out_path, info));
  QuantizeOptions qo;
  qo.seed_bits = o.seed_bits;
  qo.max_bits = o.max_bits;
  qo.threads = o.threads;
  Progress bar("quantize", 3.0 * L * E, o.progress);
  double done = 0;
  std::vector<float> w, h;
  for (int l = 0; l < L; ++l) {
    for (auto proj : {engine::ExpertProj::kGateUp, engine::ExpertProj::kDown}) {
      const int cols = proj == engine::ExpertProj::kGateUp ? H : I;
      // The layer's mean input statistics over every routed token of this projection.
      std::vector<double> layer_sum(cols, 0.0);
      uint64_t layer_tokens = 0;
      for (int e = 0; e < E; ++e) {
        const auto& s = recorder.SumSquares(l, e, proj);
        for (int j = 0; j < cols; ++j) layer_sum[j] += s[j];
        layer_tokens += recorder.Tokens(l, e, proj);
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
        const auto& s = recorder.SumSquares(l, e, proj);
        const double n = static_cast<double>(recorder.Tokens(l, e, proj));
        h.resize(cols);
        for (int j = 0; j < cols; ++j) {
          const double v = (s[j] + o.prior_tokens * hbar[j]) / (n + o.prior_tokens);
          h[j] = static_cast<float>(std::max(v, floor));
        }
        const engine::MlpWeights& mw = model.layers()[l].experts[e];
        const int rows = proj == engine::ExpertProj::kGateUp ? 2 * I : H;
        w.resize(static_cast<size_t>(rows) * cols);
        if (proj == engine::ExpertProj::kGateUp) {
          for (size_t i = 0; i < static_cast<size_t>(I) * H; ++i) w[i] = Bf16ToF32(mw.gate.data[i]);
          for (size_t i = 0; i < static_cast<size_t>(I) * H; ++i) w[static_cast<size_t>(I) * H + i] = Bf16ToF32(mw.up.data[i]);
        } else {
          for (size_t i = 0; i < static_cast<size_t>(H) * I; ++i) w[i] = Bf16ToF32(mw.down.data[i]);
        }
        auto q = QuantizeBlock(w.data(), rows, cols, h.data(), qo);
        if (!q.ok()) {
          return q.status().WithContext("layer " + std::to_string(l) + ", expert " + std::to_string(e) +
                                        (proj == engine::ExpertProj::kGateUp ? ", gate_up" : ", down"));
        }
        apw::BlockData b;
        b.layer = static_cast<uint32_t>(l);
        b.expert = static_cast<uint32_t>(e);
        b.kind = proj == engine::ExpertProj::kGateUp ? apw::BlockKind::kGateUp : apw::BlockKind::kDown;
        b.rows = static_cast<uint32_t>(rows);
        b.cols = static_cast<uint32_t>(cols);
        for (int p = 0; p < kNumPlanes; ++p) b.planes[p] = q->block.Plane(p);
        for (int bits = kMinBits; bits <= kMaxBits; ++bits) {
          b.luts[bits] = q->block.luts[bits].data();
          b.damage[bits] = q->damage[bits];
        }
        b.damage[0] = q->damage[0];
        b.calib_tokens = recorder.Tokens(l, e, proj);
        PW_RETURN_IF_ERROR(writer->Add(b));
        ++report.num_blocks;
        done += proj == engine::ExpertProj::kGateUp ? 2 : 1;
        bar.Update(done);
      }
    }
  }
  PW_RETURN_IF_ERROR(writer->Finish());
  const auto t_end = Clock::now();
  report.quantize_seconds = Seconds(t_calib, t_end);
  report.total_seconds = Seconds(t_start, t_end);
  return report;
}

}  // namespace pw::anyprec
