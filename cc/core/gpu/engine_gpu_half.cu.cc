// The CUDA engine for half variables, and float
// variables with half (compact) slots: every rule, both index types. The kernels,
// and why the (var, slot) type pairs are split over files: engine_gpu_kernels.cuh.
#include "cc/core/gpu/engine_gpu_kernels.cuh"

namespace fusedopt {
namespace gpu {
namespace instantiation {

template struct InstantiateAll<AllRules, Pair<half_t, half_t>, Pair<float, half_t>>;

}  // namespace instantiation
}  // namespace gpu
}  // namespace fusedopt
