// The CUDA engine for bfloat16 variables, and float
// variables with bfloat16 (compact) slots: every rule, both index types. The kernels,
// and why the (var, slot) type pairs are split over files: engine_gpu_kernels.cuh.
#include "cc/core/gpu/engine_gpu_kernels.cuh"

namespace fusedopt {
namespace gpu {
namespace instantiation {

template struct InstantiateAll<AllRules, Pair<bfloat16_t, bfloat16_t>, Pair<float, bfloat16_t>>;

}  // namespace instantiation
}  // namespace gpu
}  // namespace fusedopt
