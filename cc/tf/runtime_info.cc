// What the op library's CPU engine decided at run time, for Python through ctypes: its
// huge-page counts (cc/core/huge_pages.h; fusedopt.runtime.huge_page_stats()), the buffers
// it moved apart (cc/core/cache_alias.h; fusedopt.runtime.buffer_separation_stats()) and the
// vector instruction set of its element loops (cc/core/cpu_isa.h; fusedopt.runtime.cpu_isa()),
// shown by `python -m fusedopt.info`. Plain C, so no TF or pybind11 type crosses the boundary.
#include <cstdint>
#include <initializer_list>

#include "cc/core/cache_alias.h"
#include "cc/core/cpu_isa.h"
#include "cc/core/huge_pages.h"

namespace {

// Writes `values` to out[0..] for Python (fusedopt/runtime.py names them); returns how many.
int WriteCounters(int64_t* out, std::initializer_list<int64_t> values) {
  int written = 0;
  for (int64_t value : values) out[written++] = value;
  return written;
}

}  // namespace

// enabled, advised_calls, collapsed_buffers, collapsed_bytes, collapse_failures, pending_bytes.
extern "C" __attribute__((visibility("default"))) int fusedopt_huge_page_stats(int64_t* out) {
  const fusedopt::HugePageCounters c = fusedopt::HugePageStats();
  return WriteCounters(out, {c.enabled ? 1 : 0, c.advised_calls, c.collapsed_buffers,
                             c.collapsed_bytes, c.collapse_failures, c.pending_bytes});
}

// enabled, moved_buffers, moved_bytes, failures.
extern "C" __attribute__((visibility("default"))) int fusedopt_separation_stats(int64_t* out) {
  const fusedopt::SeparationCounters c = fusedopt::SeparationStats();
  return WriteCounters(out, {c.enabled ? 1 : 0, c.moved_buffers, c.moved_bytes, c.failures});
}

// "avx2" or "baseline".
extern "C" __attribute__((visibility("default"))) const char* fusedopt_cpu_isa() {
  return fusedopt::VectorIsaName(fusedopt::CpuVectorIsa());
}
