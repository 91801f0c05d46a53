// The cores a worker's pool is sized to by default: the affinity mask, not the machine.
#include "kernels/cpu/available_cores.h"

#include <gtest/gtest.h>
#include <sched.h>

namespace pw::cpu {
namespace {

TEST(AvailableCores, CountsTheAffinityMask) {
  cpu_set_t all;
  CPU_ZERO(&all);
  ASSERT_EQ(sched_getaffinity(0, sizeof(all), &all), 0);
  EXPECT_EQ(AvailableCores(), CPU_COUNT(&all));

  // Restricted to its first allowed CPU, the thread counts one core.
  int first = 0;
  while (!CPU_ISSET(first, &all)) ++first;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
  EXPECT_EQ(AvailableCores(), 1);
  ASSERT_EQ(sched_setaffinity(0, sizeof(all), &all), 0);
}

}  // namespace
}  // namespace pw::cpu
