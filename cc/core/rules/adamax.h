// Adamax (TF ApplyAdaMax / Keras Adamax): Adam with an infinity-norm second moment.
// TF has no sparse Adamax kernel; ours is lazy (only touched rows change).
#pragma once

#include "cc/core/rule.h"
#include "cc/core/rules/lazy_adam.h"

namespace fusedopt {

struct AdamaxRule {
  static constexpr const char* kOpName = "Adamax";
  static constexpr auto kSlots = LazyAdamRule::kSlots;  // Adam's two moments, m and v
  static constexpr std::array<const char*, 5> kHyper = {"beta1_power", "lr", "beta1", "beta2",
                                                        "epsilon"};
  static constexpr std::array<RuleOption, 0> kOptions = {};

  template <typename C>
  struct Params {
    C step_size;  // lr / (1 - beta1^t)
    C one_minus_beta1, beta2, epsilon;
  };

  template <typename C>
  static Params<C> Prepare(const C* h, const bool*) {
    constexpr int beta1_power = Index(kHyper, "beta1_power"), lr = Index(kHyper, "lr"),
                  beta1 = Index(kHyper, "beta1"), beta2 = Index(kHyper, "beta2"),
                  epsilon = Index(kHyper, "epsilon");
    return {h[lr] / (C(1) - h[beta1_power]), C(1) - h[beta1], h[beta2], h[epsilon]};
  }

  template <typename C>
  FO_HOST_DEVICE static void Update(const Params<C>& p, C& var, C* slot, C g) {
    constexpr int m_slot = Index(kSlots, "m"), v_slot = Index(kSlots, "v");
    C &m = slot[m_slot], &v = slot[v_slot];
    m += (g - m) * p.one_minus_beta1;
    v = MaxPropagateNaN(p.beta2 * v, Abs(g));
    var -= p.step_size * (m / (v + p.epsilon));
  }
};

}  // namespace fusedopt
