// What every update rule declares, so the engine, the TF binding and the pybind11
// module can drive any rule without knowing it.
//
// A rule is a struct with:
//   kOpName     "LazyAdam"   -> ops FusedOpt>{,Resource}{,Sparse}ApplyLazyAdam
//   kPyName     "lazy_adam"  -> Python-side name
//   kSlots      slot names, in op-input order (after var)
//   kHyper      scalar hyper-parameter names, in op-input order (after the slots)
//   kOptions    boolean attributes with defaults
//   Params<C>   what Prepare() precomputes once per call from the hyper-parameters
//   Update()    the per-element math, host and device, on compute type C.
// The sparse engine applies Update() to every element of each touched row with the
// duplicate-summed gradient, so a rule never sees indices.
#ifndef FUSEDOPT_CC_CORE_RULE_H_
#define FUSEDOPT_CC_CORE_RULE_H_

#include <array>

#include "cc/core/numeric.h"

namespace fusedopt {

struct RuleOption {
  const char* name;
  bool default_value;
};

template <typename Rule>
constexpr int NumSlots() {
  return static_cast<int>(Rule::kSlots.size());
}
template <typename Rule>
constexpr int NumHyper() {
  return static_cast<int>(Rule::kHyper.size());
}
template <typename Rule>
constexpr int NumOptions() {
  return static_cast<int>(Rule::kOptions.size());
}

}  // namespace fusedopt

#endif  // FUSEDOPT_CC_CORE_RULE_H_
