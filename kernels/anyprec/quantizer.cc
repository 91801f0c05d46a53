#include "kernels/anyprec/quantizer.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <thread>

#include "common/dtype.h"
#include "kernels/anyprec/quantizer_rows.h"

namespace pw::anyprec {
namespace {

// Per-row results summed (in row order) into the block's tables.
struct RowTotals {
  double damage[kMaxBits + 1] = {};
  double damage_fp64[kMaxBits + 1] = {};
  double split_gain[kMaxBits + 1] = {};
};

// Scratch of one worker thread, reused across rows.
struct RowScratch {
  std::vector<int> order, order_tmp;
  std::vector<uint32_t> keys, keys_tmp;      // radix sort scratch
  std::vector<double> sv, sh, s0, s1;        // sorted values, sensitivities, prefix sums
  std::vector<uint8_t> leaf;                 // [sorted idx] 8-bit code
  std::vector<uint8_t> starts;               // [sorted idx, n] leaves starting there (255 at most)
  std::vector<uint8_t> codes;                // [col] 8-bit code
  std::vector<int> bounds[kMaxBits + 1];     // [level][2^level + 1] interval bounds (sorted idx)
  std::vector<double> mu[kMaxBits + 1];      // [level][2^level] weighted means
  std::vector<double> lut[kMaxBits + 1];     // [level][2^level] fp16-rounded means, as doubles

  explicit RowScratch(int n)
      : order(n), order_tmp(n), keys(n), keys_tmp(n), sv(n), sh(n), s0(n + 1), s1(n + 1), leaf(n), starts(n + 1), codes(n) {
    for (int l = 0; l <= kMaxBits; ++l) {
      bounds[l].resize((1u << l) + 1);
      mu[l].resize(1u << l);
      lut[l].resize(1u << l);
    }
  }
  double Mass(int a, int b) const { return s0[b] - s0[a]; }
  double Moment(int a, int b) const { return s1[b] - s1[a]; }
};

// Weighted mean of [a, b), or `fallback` when the interval has no mass.
double MeanOr(const RowScratch& s, int a, int b, double fallback) {
  const double m = s.Mass(a, b);
  return (b > a && m > 0) ? s.Moment(a, b) / m : fallback;
}

// Lloyd iterations for k clusters on the sorted row; writes s.bounds[level], s.mu[level].
void SeedKMeans(RowScratch& s, int n, int level, int iters) {
  const int k = 1 << level;
  std::vector<int>& bd = s.bounds[level];
  std::vector<double>& mu = s.mu[level];
  const double total = s.s0[n];
  bd[0] = 0;
  bd[k] = n;
  for (int c = 1; c < k; ++c) {  // weighted quantiles
    const double target = total * c / k;
    bd[c] = static_cast<int>(std::lower_bound(s.s0.begin() + 1, s.s0.end(), target) - s.s0.begin());
    bd[c] = std::clamp(bd[c], bd[c - 1], n);
  }
  std::vector<int> next(k + 1);
  for (int it = 0; it <= iters; ++it) {
    for (int c = 0; c < k; ++c) {
      const double at = s.sv[std::min(bd[c], n - 1)];
      mu[c] = MeanOr(s, bd[c], bd[c + 1], at);
    }
    if (it == iters) break;
    next[0] = 0;
    next[k] = n;
    for (int c = 1; c < k; ++c) {
      // upper_bound(sv, mid), walked from the current bound: bounds move little per iteration.
      const double mid = 0.5 * (mu[c - 1] + mu[c]);
      int j = std::clamp(bd[c], 0, n);
      while (j > 0 && s.sv[j - 1] > mid) --j;
      while (j < n && !(s.sv[j] > mid)) ++j;
      next[c] = std::max(j, next[c - 1]);
    }
    if (next == bd) break;
    bd = next;
  }
}

void QuantizeRow(const float* w, const float* h, int n, const QuantizeOptions& opt,
                 const internal::QuantizerRowFns& fns, RowScratch& s, uint16_t* const* luts, RowTotals* totals) {
  internal::SortOrder(w, n, s.order.data(), s.keys.data(), s.order_tmp.data(), s.keys_tmp.data());
  s.s0[0] = s.s1[0] = 0;
  for (int i = 0; i < n; ++i) {
    s.sv[i] = w[s.order[i]];
    s.sh[i] = h[s.order[i]];
    s.s0[i + 1] = s.s0[i] + s.sh[i];
    s.s1[i + 1] = s.s1[i] + s.sh[i] * s.sv[i];
  }
  const int seed = opt.seed_bits;
  SeedKMeans(s, n, seed, opt.lloyd_iters);
  // Coarser levels merge sibling pairs.
  for (int l = seed - 1; l >= kMinBits; --l) {
    for (int c = 0; c <= (1 << l); ++c) s.bounds[l][c] = s.bounds[l + 1][2 * c];
    for (int c = 0; c < (1 << l); ++c) {
      const double fallback = 0.5 * (s.mu[l + 1][2 * c] + s.mu[l + 1][2 * c + 1]);
      s.mu[l][c] = MeanOr(s, s.bounds[l][c], s.bounds[l][c + 1], fallback);
    }
  }
  // Finer levels split every cluster by its optimal weighted 2-means cut.
  for (int l = seed; l < kMaxBits; ++l) {
    double gain_sum = 0;
    for (int c = 0; c < (1 << l); ++c) {
      const int a = s.bounds[l][c], b = s.bounds[l][c + 1];
      const double parent = s.mu[l][c];
      // default: everything stays in child 2c
      const int cut = (l < opt.max_bits && b - a >= 2) ? fns.best_cut(s.sv.data(), s.s0.data(), s.s1.data(), a, b) : b;
      s.bounds[l + 1][2 * c] = a;
      s.bounds[l + 1][2 * c + 1] = cut;
      s.bounds[l + 1][2 * c + 2] = b;
      const double ml = s.Mass(a, cut), mr = s.Mass(cut, b);
      s.mu[l + 1][2 * c] = MeanOr(s, a, cut, parent);
      s.mu[l + 1][2 * c + 1] = MeanOr(s, cut, b, parent);
      if (ml > 0 && mr > 0) {
        const double d = s.mu[l + 1][2 * c] - s.mu[l + 1][2 * c + 1];
        gain_sum += ml * mr / (ml + mr) * d * d;
      }
    }
    totals->split_gain[l + 1] += gain_sum;
  }
  // Parent codes: sorted position i's code is the number of leaf bounds 1..255 at or before i
  // (an empty leaf's bound counts with the next one's), summed from a count per position.
  const std::vector<int>& leaf = s.bounds[kMaxBits];
  std::fill(s.starts.begin(), s.starts.end(), 0);
  for (int c = 1; c < (1 << kMaxBits); ++c) ++s.starts[leaf[c]];
  uint8_t code = 0;
  for (int i = 0; i < n; ++i) {
    code = static_cast<uint8_t>(code + s.starts[i]);
    s.leaf[i] = code;
    s.codes[s.order[i]] = code;
  }
  internal::RowLuts row_luts{};
  for (int l = kMinBits; l <= kMaxBits; ++l) {
    fns.half_lut(s.mu[l].data(), 1 << l, luts[l], s.lut[l].data());
    row_luts.lut[l] = s.lut[l].data();
    row_luts.lut64[l] = s.mu[l].data();
  }
  double d[kMaxBits + 1] = {}, d64[kMaxBits + 1] = {};
  fns.row_damage(s.sv.data(), s.sh.data(), s.leaf.data(), n, row_luts, d, d64);
  totals->damage[0] += d[0];
  totals->damage_fp64[0] += d64[0];
  for (int l = kMinBits; l <= kMaxBits; ++l) {
    totals->damage[l] += d[l];
    totals->damage_fp64[l] += d64[l];
  }
}

}  // namespace

Result<QuantizedBlock> QuantizeBlock(const float* w, int rows, int cols, const float* h,
                                     const QuantizeOptions& opt) {
  const size_t n = cols > 0 ? static_cast<size_t>(cols) : 0;
  return QuantizeBlock([w, n](int r, float* out) { std::memcpy(out, w + r * n, n * sizeof(float)); }, rows,
                       cols, h, opt);
}

Result<QuantizedBlock> QuantizeBlock(const WeightRowFn& row_of, int rows, int cols, const float* h,
                                     const QuantizeOptions& opt) {
  if (rows < 1 || cols < 1) {
    return InvalidArgument("quantize: block shape " + std::to_string(rows) + "x" + std::to_string(cols));
  }
  if (opt.max_bits < kMinBits || opt.max_bits > kMaxBits || opt.seed_bits < kMinBits ||
      opt.seed_bits > opt.max_bits) {
    return InvalidArgument("quantize: need 3 <= seed_bits (" + std::to_string(opt.seed_bits) +
                           ") <= max_bits (" + std::to_string(opt.max_bits) + ") <= 8");
  }
  for (int c = 0; c < cols; ++c) {
    if (!std::isfinite(h[c]) || h[c] <= 0) {
      return InvalidArgument("quantize: sensitivity of column " + std::to_string(c) +
                             " is not a finite positive number");
    }
  }
  QuantizedBlock out;
  out.block.rows = rows;
  out.block.cols = cols;
  for (int b = kMinBits; b <= kMaxBits; ++b) out.block.luts[b].assign(static_cast<size_t>(rows) << b, 0);
  out.block.planes.resize(kNumPlanes * PlaneBytes(rows, cols));
  const size_t plane_bytes = PlaneBytes(rows, cols), row_bytes = PlaneRowBytes(cols);
  std::vector<RowTotals> per_row(rows);
  const internal::QuantizerRowFns fns = internal::BestQuantizerRowFns();
  // The first non-finite weight in row-major order: the least (row, col) any thread found.
  const int64_t kNone = static_cast<int64_t>(rows) * cols;
  std::atomic<int64_t> first_bad{kNone};
  std::atomic<int> next{0};
  auto worker = [&] {
    RowScratch scratch(cols);
    std::vector<float> w(cols);
    for (int r = next.fetch_add(1); r < rows; r = next.fetch_add(1)) {
      row_of(r, w.data());
      int bad = 0;
      while (bad < cols && std::isfinite(w[bad])) ++bad;
      if (bad < cols) {
        const int64_t at = static_cast<int64_t>(r) * cols + bad;
        int64_t seen = first_bad.load();
        while (at < seen && !first_bad.compare_exchange_weak(seen, at)) {
        }
        continue;
      }
      uint16_t* luts[kMaxBits + 1] = {};
      for (int b = kMinBits; b <= kMaxBits; ++b) luts[b] = out.block.luts[b].data() + (static_cast<size_t>(r) << b);
      QuantizeRow(w.data(), h, cols, opt, fns, scratch, luts, &per_row[r]);
      PackCodeRow(scratch.codes.data(), cols, out.block.planes.data() + r * row_bytes, plane_bytes);
    }
  };
  const int threads = std::clamp(opt.threads, 1, std::max(1, rows));
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  if (const int64_t at = first_bad.load(); at != kNone) {
    return InvalidArgument("quantize: weight (" + std::to_string(at / cols) + ", " + std::to_string(at % cols) +
                           ") is not finite");
  }
  for (const RowTotals& rt : per_row) {  // row order: deterministic whatever the threads
    for (int b = 0; b <= kMaxBits; ++b) {
      out.damage[b] += rt.damage[b];
      out.damage_fp64[b] += rt.damage_fp64[b];
      out.split_gain[b] += rt.split_gain[b];
    }
  }
  return out;
}

}  // namespace pw::anyprec
