// LazyAdam: Adam's update (TF ApplyAdam / Keras Adam), applied lazily by the sparse
// engine, i.e. only touched rows of var, m and v change.
#ifndef FUSEDOPT_CC_CORE_RULES_LAZY_ADAM_H_
#define FUSEDOPT_CC_CORE_RULES_LAZY_ADAM_H_

#include "cc/core/rule.h"

namespace fusedopt {

struct LazyAdamRule {
  static constexpr const char* kOpName = "LazyAdam";
  static constexpr const char* kPyName = "lazy_adam";
  static constexpr std::array<const char*, 2> kSlots = {"m", "v"};
  static constexpr std::array<const char*, 6> kHyper = {
      "beta1_power", "beta2_power", "lr", "beta1", "beta2", "epsilon"};
  static constexpr std::array<RuleOption, 1> kOptions = {{{"use_nesterov", false}}};

  template <typename C>
  struct Params {
    C alpha;  // lr * sqrt(1 - beta2^t) / (1 - beta1^t): bias correction folded in once.
    C beta1, one_minus_beta1, one_minus_beta2, epsilon;
    bool use_nesterov;
  };

  template <typename C>
  static Params<C> Prepare(const C* h, const bool* options) {
    const C beta1_power = h[0], beta2_power = h[1], lr = h[2];
    return {lr * Sqrt(C(1) - beta2_power) / (C(1) - beta1_power), h[3], C(1) - h[3],
            C(1) - h[4], h[5], options[0]};
  }

  template <typename C>
  FO_HOST_DEVICE static void Update(const Params<C>& p, C& var, C* slot, C g) {
    C& m = slot[0];
    C& v = slot[1];
    m += (g - m) * p.one_minus_beta1;
    v += (g * g - v) * p.one_minus_beta2;
    const C direction = p.use_nesterov ? g * p.one_minus_beta1 + p.beta1 * m : m;
    var -= (direction * p.alpha) / (Sqrt(v) + p.epsilon);
  }
};

}  // namespace fusedopt

#endif  // FUSEDOPT_CC_CORE_RULES_LAZY_ADAM_H_
