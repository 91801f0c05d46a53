// Tests that compare what a cluster serves with an in-process engine, token for token.
// In tests/support/ because tests in two folders use it: tests/integration/ and tests/anyprec/
// (the failover replay).
#pragma once

#include <cstdlib>

namespace pw::testing {

// Makes this process and the processes it starts from now on use the batch-invariant dense
// kernels (PW_BATCH_INVARIANT=1, kernels/cpu/dense.h): a request's numerics then do not depend
// on what it was batched with, so served greedy outputs equal the reference's bit for bit
// whatever the served batches were. Call before anything in this process runs a kernel (the
// table is chosen once) and before starting the processes.
inline void UseBatchInvariantKernels() { setenv("PW_BATCH_INVARIANT", "1", /*overwrite=*/1); }

}  // namespace pw::testing
