// The CUDA backend of the dense op table (kernels/dense_ops.h): the same ops, the same
// signatures and the same results as the CPU tables (the scalar CPU table defines correct;
// tests/gpu/op_backend_cuda_test.cc checks every op against it on a machine with a GPU).
//
// Contract of cuda::Kernels(), beyond the table's:
// - Every pointer is device memory (cudaMalloc or managed); sizes and strides as on the CPU.
// - Entries are queued on the calling thread's stream (SetStream; the legacy default stream
//   until a thread sets one) and return without waiting for the work, except dot: its result
//   is a host value, so it copies it back and waits for the stream before returning.
// - The table's types carry no status: a launch the runtime refuses (no device, sizes past the
//   grid's limits) is a broken invariant and aborts with file:line and the CUDA error.
// - Kernels never allocate, except dot's one float of device scratch per thread (allocated at the
//   thread's first dot, on the device current then, and freed when the thread exits).
// Kernels are plain (one warp per output row and token for the matmuls, one block per row for
// the reductions): correct at any size and alignment, not tuned.
#pragma once

#include <cuda_runtime.h>

#include "kernels/dense_ops.h"

namespace pw::cuda {

// The stream the calling thread's table entries are queued on (nullptr: the legacy default
// stream). Per thread, so threads driving different streams do not share one setting.
void SetStream(cudaStream_t stream);
cudaStream_t Stream();

// The CUDA backend's table. Requires DevicePresent() (kernels::BackendSupported(kCuda)).
const kernels::DenseKernels& Kernels();

// True when the CUDA runtime finds at least one device. kernels::BackendSupported(kCuda) asks
// this when the binary links these kernels (kernels/backend.h).
bool DevicePresent();

}  // namespace pw::cuda
