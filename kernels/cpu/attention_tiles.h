// The inner products of attention over a tile of queries and a block of keys: each result is
// the bits of the table's own dot / axpy for that pair, in the same order, so a query's
// attention does not depend on how many queries were tiled with it (decode's one query, a
// prompt chunk's sixteen). Where the table's dot and axpy are the AVX-512 or AVX2 ones and the
// head dimension is a multiple of 16, several pairs run at once (independent accumulators,
// the output row held in registers across the keys); otherwise one call per pair.
#pragma once

#include <cstddef>

#include "kernels/dense_ops.h"

namespace pw::cpu {

// scores[i * lds + s] = k.dot(q + i * ldq, keys + s * D, D) * scale for i < nq, s < ns.
void AttentionDots(const kernels::DenseKernels& k, const float* q, size_t ldq, size_t nq,
                   const float* keys, size_t ns, size_t D, float scale, float* scores, size_t lds);

// For s = 0 .. ns - 1 in order: k.axpy(a[s], values + s * D, D, out).
void AttentionAxpys(const kernels::DenseKernels& k, const float* a, size_t ns, const float* values,
                    size_t D, float* out);

}  // namespace pw::cpu
