// The CUDA engine for float and double variables
// with slots of their own type: every rule, both index types. The kernels,
// and why the (var, slot) type pairs are split over files: engine_gpu_kernels.cuh.
#include "cc/core/gpu/engine_gpu_kernels.cuh"

namespace fusedopt {
namespace gpu {
namespace instantiation {

template struct InstantiateAll<AllRules, Pair<float, float>, Pair<double, double>>;

}  // namespace instantiation
}  // namespace gpu
}  // namespace fusedopt
