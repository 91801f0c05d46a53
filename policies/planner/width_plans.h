// Offline width maps at a target average width, for pw-quantize, the evaluation tools and the
// baselines the planner is compared with.
#pragma once

#include <cstdint>

#include "common/formats/apw_store.h"
#include "common/formats/width_map.h"
#include "common/status.h"

namespace pw::anyprec {

// Width maps at a target average width (bits per expert weight, weighted by block size),
// starting from every block at 8 bits and lowering one block by one bit at a time:
//   - PlanDamageRanked: always the step with the least expected damage per byte freed,
//       cost = f_i * (D_i[b-1] - D_i[b]) / (rows * cols / 8),
//     f_i = (tokens_i + 1) / (tokens of the layer's experts + E) (apw::CalibrationShares / E):
//     the routing frequency from
//     the calibration counts, since D_i is an error per routed token;
//   - PlanRandom: a uniformly random block still above min_bits (seeded, for baselines).
// Stops at the first map whose average is <= avg_bits; errors if avg_bits < min_bits.
Result<WidthMap> PlanDamageRanked(const apw::ApwStore& store, double avg_bits, int min_bits = kMinBits);
Result<WidthMap> PlanRandom(const apw::ApwStore& store, double avg_bits, uint64_t seed,
                            int min_bits = kMinBits);

}  // namespace pw::anyprec
