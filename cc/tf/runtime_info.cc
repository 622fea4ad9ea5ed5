// What the op library's CPU engine decided at run time, for Python through ctypes: its
// huge-page counts (cc/core/huge_pages.h; fusedopt.ops.huge_page_stats()), the buffers it
// moved apart (cc/core/cache_alias.h; fusedopt.ops.buffer_separation_stats()) and the vector
// instruction set of its element loops (cc/core/cpu_isa.h; fusedopt.ops.cpu_isa()), both
// shown by `python -m fusedopt.info`. Plain C, so no TF or pybind11 type crosses the boundary.
#include <cstdint>

#include "cc/core/cache_alias.h"
#include "cc/core/cpu_isa.h"
#include "cc/core/huge_pages.h"

// out[6]: enabled, advised_calls, collapsed_buffers, collapsed_bytes, collapse_failures,
// pending_bytes.
// Returns the number of values written.
extern "C" __attribute__((visibility("default"))) int fusedopt_huge_page_stats(int64_t* out) {
  const fusedopt::HugePageCounters c = fusedopt::HugePageStats();
  out[0] = c.enabled ? 1 : 0;
  out[1] = c.advised_calls;
  out[2] = c.collapsed_buffers;
  out[3] = c.collapsed_bytes;
  out[4] = c.collapse_failures;
  out[5] = c.pending_bytes;
  return 6;
}

// out[4]: enabled, moved_buffers, moved_bytes, failures. Returns the number written.
extern "C" __attribute__((visibility("default"))) int fusedopt_separation_stats(int64_t* out) {
  const fusedopt::SeparationCounters c = fusedopt::SeparationStats();
  out[0] = c.enabled ? 1 : 0;
  out[1] = c.moved_buffers;
  out[2] = c.moved_bytes;
  out[3] = c.failures;
  return 4;
}

// "avx2" or "baseline".
extern "C" __attribute__((visibility("default"))) const char* fusedopt_cpu_isa() {
  return fusedopt::VectorIsaName(fusedopt::CpuVectorIsa());
}
