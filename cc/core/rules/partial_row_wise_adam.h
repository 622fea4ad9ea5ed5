// Partial row-wise Adam (FBGEMM / TorchRec PARTIAL_ROWWISE_ADAM): Adam's first moment per
// element, its second moment per row (the mean of the row's g^2), so an embedding table
// of D columns keeps 1 + 1/D values of state per parameter instead of Adam's 2:
//   v[r]  = beta2 * v[r] + (1 - beta2) * mean over the row of g^2
//   m     = beta1 * m + (1 - beta1) * g
//   var  -= lr / (1 - beta1^t) / (sqrt(v[r] / (1 - beta2^t)) + eps) * m
// FBGEMM's bias correction and epsilon placement (eps added to the corrected sqrt(v)),
// the row's multiplier computed once. FBGEMM has it on GPU only; no TF, Keras or
// tensorflow-addons class has it. Hyper-parameters are Adam's (LazyAdamRule's list).
#pragma once

#include "cc/core/rule.h"
#include "cc/core/rules/lazy_adam.h"

namespace fusedopt {

struct PartialRowWiseAdamRule : RowMeanOfSquares {  // RowTerm(g) = g*g
  static constexpr const char* kOpName = "PartialRowWiseAdam";
  static constexpr std::array<SlotDecl, 2> kSlots = {PerElement("m"), PerRow("v")};
  static constexpr auto kHyper = LazyAdamRule::kHyper;  // Adam's six
  static constexpr std::array<RuleOption, 0> kOptions = {};

  template <typename C>
  struct Params {
    C step_size;     // lr / (1 - beta1^t)
    C v_correction;  // 1 / (1 - beta2^t)
    C beta1, one_minus_beta1, beta2, one_minus_beta2, epsilon;
  };

  template <typename C>
  static Params<C> Prepare(const C* h, const bool*) {
    constexpr int beta1_power = Index(kHyper, "beta1_power"), beta2_power = Index(kHyper, "beta2_power"),
                  lr = Index(kHyper, "lr"), beta1 = Index(kHyper, "beta1"),
                  beta2 = Index(kHyper, "beta2"), epsilon = Index(kHyper, "epsilon");
    return {h[lr] / (C(1) - h[beta1_power]), C(1) / (C(1) - h[beta2_power]), h[beta1],
            C(1) - h[beta1], h[beta2], C(1) - h[beta2], h[epsilon]};
  }

  // Updates v[r]; returns the row's multiplier of m.
  template <typename C>
  FO_HOST_DEVICE static C UpdateRow(const Params<C>& p, C* slot, C row_sum, C row_size) {
    constexpr int v_slot = Index(kSlots, "v");
    C& v = slot[v_slot];
    v = p.beta2 * v + p.one_minus_beta2 * (row_sum / row_size);
    return p.step_size / (Sqrt(v * p.v_correction) + p.epsilon);
  }

  template <typename C>
  FO_HOST_DEVICE static void Update(const Params<C>& p, C& var, C* slot, C g, C multiplier) {
    constexpr int m_slot = Index(kSlots, "m");
    C& m = slot[m_slot];
    m = p.beta1 * m + p.one_minus_beta1 * g;
    var -= multiplier * m;
  }
};

}  // namespace fusedopt
