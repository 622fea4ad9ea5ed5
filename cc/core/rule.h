// What every update rule declares, so the engine, the TF binding and the pybind11
// module can drive any rule without knowing it.
//
// A rule is a struct with:
//   kOpName     "LazyAdam"   -> ops FusedOpt>{,Resource}{,Sparse}ApplyLazyAdam
//   kPyName     "lazy_adam"  -> Python-side name (fusedopt.ops.resource_apply_lazy_adam,
//                               python/fusedopt/rules/lazy_adam.py)
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

// Position of `name` in a rule's list of names, for use in constant expressions:
//   constexpr int lr = Index(kHyper, "lr");     // h[lr] rather than h[2]
// A name that is not in the list does not compile (NameNotInList is not constexpr).
inline int NameNotInList() { return -1; }

constexpr bool SameName(const char* a, const char* b) {
  while (*a != '\0' && *a == *b) {
    ++a;
    ++b;
  }
  return *a == *b;
}

template <size_t N>
constexpr int Index(const std::array<const char*, N>& names, const char* name) {
  for (size_t i = 0; i < N; ++i) {
    if (SameName(names[i], name)) return static_cast<int>(i);
  }
  return NameNotInList();
}

template <size_t N>
constexpr int Index(const std::array<RuleOption, N>& options, const char* name) {
  for (size_t i = 0; i < N; ++i) {
    if (SameName(options[i].name, name)) return static_cast<int>(i);
  }
  return NameNotInList();
}

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
