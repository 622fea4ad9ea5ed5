// Adam's update (TF ApplyAdam / Keras Adam). Its ops and Python name say LazyAdam: the
// sparse engine applies it lazily (only touched rows of var, m and v change), as every
// rule; the math is plain Adam.
#pragma once

#include "cc/core/rule.h"

namespace fusedopt {

struct LazyAdamRule {
  static constexpr const char* kOpName = "LazyAdam";
  static constexpr std::array<SlotDecl, 2> kSlots = {PerElement("m"), PerElement("v")};
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
    constexpr int beta1_power = Index(kHyper, "beta1_power"), beta2_power = Index(kHyper, "beta2_power"),
                  lr = Index(kHyper, "lr"), beta1 = Index(kHyper, "beta1"),
                  beta2 = Index(kHyper, "beta2"), epsilon = Index(kHyper, "epsilon");
    constexpr int use_nesterov = Index(kOptions, "use_nesterov");
    return {h[lr] * Sqrt(C(1) - h[beta2_power]) / (C(1) - h[beta1_power]), h[beta1],
            C(1) - h[beta1], C(1) - h[beta2], h[epsilon],
            options[use_nesterov]};
  }

  template <typename C>
  FO_HOST_DEVICE static void Update(const Params<C>& p, C& var, C* slot, C g) {
    constexpr int m_slot = Index(kSlots, "m"), v_slot = Index(kSlots, "v");
    C &m = slot[m_slot], &v = slot[v_slot];
    m += (g - m) * p.one_minus_beta1;
    v += (g * g - v) * p.one_minus_beta2;
    const C direction = p.use_nesterov ? g * p.one_minus_beta1 + p.beta1 * m : m;
    var -= (direction * p.alpha) / (Sqrt(v) + p.epsilon);
  }
};

}  // namespace fusedopt
