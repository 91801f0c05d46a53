// Whether this process may use the AMX tile state. For the run-time dispatchers, which are
// built without ISA flags; AMX kernels themselves never include it.
#pragma once

#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace pw::cpu {

// The OS side of AMX: it saves the tile state (OSXSAVE, XCR0 bits 17 and 18) and Linux grants
// this process the tile data (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA; asking again
// is harmless). The CPUID feature bits (AMX-TILE and -BF16 or -INT8) are the caller's to check.
inline bool AmxTileStatePermitted() {
#if defined(__x86_64__)
  unsigned a, b, c, d;
  if (!__get_cpuid_count(1, 0, &a, &b, &c, &d) || ((c >> 27) & 1) == 0) return false;  // OSXSAVE
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if (((lo >> 17) & 3) != 3) return false;
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

}  // namespace pw::cpu
