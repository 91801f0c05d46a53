#include "quant/residual_train.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <span>
#include <sstream>

#include "common/formats/apw_store.h"
#include "common/dtype.h"
#include "kernels/anyprec/pack.h"
#include "engine/experts/apw_expert_provider.h"
#include "quant/calibration_tokens.h"
#include "engine/engine.h"
#include "engine/experts/calibration_recorder.h"
#include "engine/experts/bf16_expert_provider.h"
#include "common/formats/checkpoint_experts.h"

namespace pw::anyprec {
namespace {

using Clock = std::chrono::steady_clock;

// Solves A x = b (A symmetric positive definite, n x n row-major) by Gaussian elimination with
// partial pivoting; false when singular.
bool Solve(std::vector<double> a, std::vector<double> b, int n, std::vector<double>* x) {
  for (int c = 0; c < n; ++c) {
    int piv = c;
    for (int r = c + 1; r < n; ++r)
      if (std::fabs(a[r * n + c]) > std::fabs(a[piv * n + c])) piv = r;
    if (std::fabs(a[piv * n + c]) < 1e-300) return false;
    if (piv != c) {
      for (int k = 0; k < n; ++k) std::swap(a[c * n + k], a[piv * n + k]);
      std::swap(b[c], b[piv]);
    }
    for (int r = c + 1; r < n; ++r) {
      const double f = a[r * n + c] / a[c * n + c];
      if (f == 0) continue;
      for (int k = c; k < n; ++k) a[r * n + k] -= f * a[c * n + k];
      b[r] -= f * b[c];
    }
  }
  x->assign(n, 0.0);
  for (int r = n - 1; r >= 0; --r) {
    double s = b[r];
    for (int k = r + 1; k < n; ++k) s -= a[r * n + k] * (*x)[k];
    (*x)[r] = s / a[r * n + r];
  }
  return true;
}

// err_b[j] - err_hi[j] for b = lo: per column, sum over rows of the squared error at the
// lowest width minus that at the highest, the weights from the checkpoint, the codes and LUTs
// from the store.
std::vector<double> ColumnErrorSpan(const apw::BlockData& b, const std::vector<float>& w, int lo, int hi) {
  const int rows = static_cast<int>(b.rows), cols = static_cast<int>(b.cols);
  const size_t plane = PlaneBytes(rows, cols);
  std::vector<uint8_t> planes(plane * kNumPlanes);
  for (int p = 0; p < kNumPlanes; ++p) std::copy(b.planes[p], b.planes[p] + plane, planes.data() + p * plane);
  std::vector<double> out(static_cast<size_t>(cols), 0.0);
  for (int r = 0; r < rows; ++r) {
    const uint16_t* lut_lo = b.luts[lo] + (static_cast<size_t>(r) << lo);
    const uint16_t* lut_hi = b.luts[hi] + (static_cast<size_t>(r) << hi);
    for (int c = 0; c < cols; ++c) {
      const uint8_t code = UnpackCode(planes.data(), rows, cols, r, c);
      const double x = w[static_cast<size_t>(r) * cols + c];
      const double el = x - F16ToF32(lut_lo[code >> (kMaxBits - lo)]);
      const double eh = x - F16ToF32(lut_hi[code >> (kMaxBits - hi)]);
      out[static_cast<size_t>(c)] += el * el - eh * eh;
    }
  }
  return out;
}

}  // namespace

Result<std::vector<double>> FitRidgeHead(const std::vector<std::vector<double>>& x, const std::vector<double>& y,
                                         double ridge) {
  if (x.empty() || x.size() != y.size()) return InvalidArgument("ridge fit needs as many feature rows as targets (> 0)");
  const int n = static_cast<int>(x[0].size());
  const double m = static_cast<double>(x.size());
  std::vector<double> mean(n, 0.0);
  double ym = 0;
  for (size_t s = 0; s < x.size(); ++s) {
    if (static_cast<int>(x[s].size()) != n) return InvalidArgument("ridge fit: ragged feature rows");
    for (int k = 0; k < n; ++k) mean[k] += x[s][k] / m;
    ym += y[s] / m;
  }
  std::vector<double> a(static_cast<size_t>(n) * n, 0.0), b(n, 0.0);
  for (size_t s = 0; s < x.size(); ++s) {
    for (int i = 0; i < n; ++i) {
      const double xi = x[s][i] - mean[i];
      b[i] += xi * (y[s] - ym);
      for (int k = 0; k < n; ++k) a[i * n + k] += xi * (x[s][k] - mean[k]);
    }
  }
  double trace = 0;
  for (int i = 0; i < n; ++i) trace += a[i * n + i];
  const double lambda = std::max(ridge * (trace > 0 ? trace / n : 1.0), 1e-12);
  for (int i = 0; i < n; ++i) a[i * n + i] += lambda;
  std::vector<double> w;
  if (!Solve(std::move(a), std::move(b), n, &w)) return InvalidArgument("ridge fit: singular system");
  std::vector<double> out(1 + static_cast<size_t>(n));
  out[0] = ym;
  for (int i = 0; i < n; ++i) {
    out[1 + i] = w[i];
    out[0] -= w[i] * mean[i];
  }
  return out;
}

Result<ResidualTrainReport> FitResidualHeads(const std::vector<ResidualSample>& samples, double ridge,
                                             ResidualHeads* heads) {
  ResidualTrainReport rep;
  const int L = heads->num_layers(), E = heads->num_experts();
  std::vector<int> prompts_train, prompts_held;
  struct Group {
    std::vector<std::vector<double>> x;
    std::vector<double> y;
  };
  std::vector<Group> train(static_cast<size_t>(L) * kProjsPerExpert);
  for (const ResidualSample& s : samples) {
    if (s.layer < 0 || s.layer >= L || static_cast<int>(s.feature.size()) != E || !std::isfinite(s.target)) {
      return InvalidArgument("residual sample of prompt " + std::to_string(s.prompt) + " does not fit the heads");
    }
    (s.heldout ? prompts_held : prompts_train).push_back(s.prompt);
    if (s.heldout) continue;
    Group& g = train[static_cast<size_t>(s.layer) * kProjsPerExpert + static_cast<int>(s.proj)];
    g.x.push_back(s.feature);
    g.y.push_back(s.target);
  }
  for (auto* v : {&prompts_train, &prompts_held}) {
    std::sort(v->begin(), v->end());
    v->erase(std::unique(v->begin(), v->end()), v->end());
  }
  rep.train_prompts = static_cast<int>(prompts_train.size());
  rep.heldout_prompts = static_cast<int>(prompts_held.size());
  rep.prompts = rep.train_prompts + rep.heldout_prompts;
  rep.samples = static_cast<int>(samples.size());
  for (int l = 0; l < L; ++l) {
    for (auto proj : {ExpertProj::kGateUp, ExpertProj::kDown}) {
      Group& g = train[static_cast<size_t>(l) * kProjsPerExpert + static_cast<int>(proj)];
      if (g.y.size() < 2) continue;
      PW_ASSIGN_OR_RETURN(heads->head(l, proj), FitRidgeHead(g.x, g.y, ridge));
    }
  }
  // Fit quality: R^2 about each head's own mean (of the samples scored), and the correlation
  // of predicted vs measured over all of them.
  auto score = [&](bool heldout, double* r2, double* corr, double* sd) {
    std::vector<double> mean(static_cast<size_t>(L) * kProjsPerExpert, 0.0), count(mean.size(), 0.0);
    for (const auto& s : samples) {
      if (s.heldout != heldout) continue;
      const size_t h = static_cast<size_t>(s.layer) * kProjsPerExpert + static_cast<int>(s.proj);
      mean[h] += s.target;
      count[h] += 1;
    }
    for (size_t h = 0; h < mean.size(); ++h)
      if (count[h] > 0) mean[h] /= count[h];
    double ss_res = 0, ss_tot = 0, n = 0, sp = 0, sm = 0, spp = 0, smm = 0, spm = 0;
    for (const auto& s : samples) {
      if (s.heldout != heldout) continue;
      const size_t h = static_cast<size_t>(s.layer) * kProjsPerExpert + static_cast<int>(s.proj);
      const double p = heads->Predict(s.layer, s.proj, s.feature.data());
      ss_res += (s.target - p) * (s.target - p);
      ss_tot += (s.target - mean[h]) * (s.target - mean[h]);
      n += 1;
      sp += p;
      sm += s.target;
      spp += p * p;
      smm += s.target * s.target;
      spm += p * s.target;
    }
    *r2 = ss_tot > 0 ? 1 - ss_res / ss_tot : 0;
    const double cov = spm - sp * sm / std::max(n, 1.0);
    const double vp = spp - sp * sp / std::max(n, 1.0), vm = smm - sm * sm / std::max(n, 1.0);
    *corr = vp > 0 && vm > 0 ? cov / std::sqrt(vp * vm) : 0;
    if (sd) *sd = n > 0 ? std::sqrt(ss_tot / n) : 0;
  };
  double unused_corr;
  score(false, &rep.train_r2, &unused_corr, nullptr);
  score(true, &rep.heldout_r2, &rep.heldout_corr, &rep.target_sd);
  heads->fit().train_prompts = static_cast<uint32_t>(rep.train_prompts);
  heads->fit().heldout_prompts = static_cast<uint32_t>(rep.heldout_prompts);
  heads->fit().ridge = ridge;
  heads->fit().heldout_r2 = rep.heldout_r2;
  heads->fit().heldout_corr = rep.heldout_corr;
  return rep;
}

Result<ResidualTrainReport> TrainResidualHeads(const ResidualTrainOptions& o) {
  const auto t0 = Clock::now();
  if (o.prompt_tokens < 2) return InvalidArgument("--prompt-tokens must be at least 2");
  if (o.holdout_every < 2) return InvalidArgument("--holdout-every must be at least 2");
  if (!std::isfinite(o.ridge) || o.ridge < 0) return InvalidArgument("--ridge must be finite and >= 0");
  if (!std::isfinite(o.clamp) || o.clamp <= 0) return InvalidArgument("--clamp must be > 0");
  engine::EngineOptions eo;
  eo.num_threads = o.threads;
  eo.max_batch_tokens = std::max(o.prompt_tokens, 16);
  eo.num_kv_blocks = (o.prompt_tokens + eo.block_size - 1) / eo.block_size + 4;
  PW_ASSIGN_OR_RETURN(auto eng, engine::Engine::Create(o.model_dir, eo));
  const engine::Model& model = eng->model();
  const ModelConfig& cfg = model.config();
  const int L = static_cast<int>(cfg.num_layers), E = static_cast<int>(cfg.num_experts);
  const int H = static_cast<int>(cfg.hidden_size), I = static_cast<int>(cfg.moe_intermediate_size);
  for (const auto& layer : model.layers()) {
    if (!layer.is_moe) return Unsupported(o.model_dir + ": dense (non-MoE) layers have no residual heads");
  }
  PW_ASSIGN_OR_RETURN(uint64_t hash, ModelHash(model.dir()));
  apw::ApwStore::Options so;
  so.expected_model_hash = hash;
  PW_ASSIGN_OR_RETURN(auto store, apw::ApwStore::Open(o.store_path, so));

  // Prompts.
  PW_ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                      CalibrationTokens(CalibrationSourceOf(o), eng->vocab_size()));
  const int whole = static_cast<int>(ids.size() / static_cast<size_t>(o.prompt_tokens));
  const int num_prompts = o.max_prompts > 0 ? std::min(whole, o.max_prompts) : whole;
  // Prompt p starts at whole prompt floor(p * whole / num_prompts): spread over the text.
  auto start = [&](int p) {
    return static_cast<size_t>(static_cast<int64_t>(p) * whole / std::max(num_prompts, 1)) * o.prompt_tokens;
  };
  if (num_prompts < 2 * o.holdout_every) {
    return InvalidArgument("residual training needs at least " + std::to_string(2 * o.holdout_every) +
                           " prompts of " + std::to_string(o.prompt_tokens) + " tokens; the calibration has " +
                           std::to_string(num_prompts));
  }

  // The store's per-column error span of every block (lowest vs highest width) and its table's.
  const int lo = kMinBits, hi = kMaxBits;
  std::vector<std::vector<double>> span(static_cast<size_t>(L) * E * kProjsPerExpert);
  std::vector<double> table_span(span.size(), 0.0);
  std::vector<float> w;
  for (int l = 0; l < L; ++l) {
    if (!store->info().HasLayer(static_cast<uint32_t>(l))) continue;  // dense: no blocks, no routed tokens
    for (int e = 0; e < E; ++e) {
      for (auto proj : {ExpertProj::kGateUp, ExpertProj::kDown}) {
        const apw::BlockData* b = store->Find(static_cast<uint32_t>(l), static_cast<uint32_t>(e), proj);
        if (b == nullptr || b->luts[lo] == nullptr || b->luts[hi] == nullptr) {
          return InvalidArgument(o.store_path + ": no block (layer " + std::to_string(l) + ", expert " +
                                 std::to_string(e) + ", " + ExpertProjName(proj) + ") at widths " +
                                 std::to_string(lo) + ".." + std::to_string(hi));
        }
        const engine::MlpWeights& mw = model.layers()[l].experts[e];
        if (proj == ExpertProj::kGateUp) {
          w.resize(static_cast<size_t>(2 * I) * H);
          for (size_t k = 0; k < static_cast<size_t>(I) * H; ++k) w[k] = Bf16ToF32(mw.gate.data[k]);
          for (size_t k = 0; k < static_cast<size_t>(I) * H; ++k) w[static_cast<size_t>(I) * H + k] = Bf16ToF32(mw.up.data[k]);
        } else {
          w.resize(static_cast<size_t>(H) * I);
          for (size_t k = 0; k < static_cast<size_t>(H) * I; ++k) w[k] = Bf16ToF32(mw.down.data[k]);
        }
        const size_t i = ExpertBlockIndex(l, e, proj, E);
        span[i] = ColumnErrorSpan(*b, w, lo, hi);
        table_span[i] = b->damage[lo] - b->damage[hi];
      }
    }
  }

  // Per prompt: its routing and Hessian diagonal, the measured and table damage, the samples.
  engine::Bf16ExpertProvider bf16(model);
  std::vector<ResidualSample> samples;
  for (int p = 0; p < num_prompts; ++p) {
    CalibrationRecorder rec(&bf16, L, E, H, I);
    engine::MoeHooks hooks;
    hooks.provider = &rec;
    eng->SetMoeHooks(hooks);
    auto logits = eng->ForwardLogits(std::span<const int32_t>(ids.data() + start(p), o.prompt_tokens));
    eng->SetMoeHooks({});
    if (!logits.ok()) return logits.status().WithContext("residual calibration prompt " + std::to_string(p));
    for (int l = 0; l < L; ++l) {
      double routed = 0;
      for (int e = 0; e < E; ++e) routed += static_cast<double>(rec.Tokens(l, e, ExpertProj::kGateUp));
      if (routed <= 0) continue;
      std::vector<double> feature(static_cast<size_t>(E));
      for (int e = 0; e < E; ++e) feature[e] = static_cast<double>(rec.Tokens(l, e, ExpertProj::kGateUp)) / routed;
      for (auto proj : {ExpertProj::kGateUp, ExpertProj::kDown}) {
        double measured = 0, table = 0;
        for (int e = 0; e < E; ++e) {
          const size_t i = ExpertBlockIndex(l, e, proj, E);
          const auto& s = rec.SumSquares(l, e, proj);
          for (size_t j = 0; j < s.size(); ++j) measured += s[j] * span[i][j];
          table += static_cast<double>(rec.Tokens(l, e, proj)) * table_span[i];
        }
        if (!(measured > 0) || !(table > 0)) continue;
        ResidualSample smp;
        smp.prompt = p;
        smp.layer = l;
        smp.proj = proj;
        smp.feature = feature;
        smp.target = std::log(measured / table);
        smp.heldout = p % o.holdout_every == o.holdout_every - 1;
        samples.push_back(std::move(smp));
      }
    }
  }
  ResidualHeads heads(L, E, hash, o.clamp);
  if (!o.evaluate_heads.empty()) {
    // Score existing heads: every prompt is held out, nothing is fitted or written.
    PW_ASSIGN_OR_RETURN(heads, ResidualHeads::Load(o.evaluate_heads, hash));
    for (ResidualSample& smp : samples) smp.heldout = true;
  }
  PW_ASSIGN_OR_RETURN(ResidualTrainReport rep, FitResidualHeads(samples, o.ridge, &heads));
  if (o.evaluate_heads.empty()) PW_RETURN_IF_ERROR(heads.Save(o.out_path));
  rep.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return rep;
}

}  // namespace pw::anyprec
