// Row-wise Adagrad (FBGEMM / TorchRec EXACT_ROWWISE_ADAGRAD): one accumulator per row of
// the table instead of one per element, 1/D of Adagrad's state:
//   accum[r] += mean over the row of g^2
//   var[r]   -= (lr / (sqrt(accum[r]) + eps)) * g[r]
// (FBGEMM's order of operations: the row's multiplier first, then one product per
// element). No TF, Keras or tensorflow-addons class has it.
#pragma once

#include "cc/core/rule.h"
#include "cc/core/rules/adagrad.h"

namespace fusedopt {

struct RowWiseAdagradRule : RowMeanOfSquares {  // RowTerm(g) = g*g
  static constexpr const char* kOpName = "RowWiseAdagrad";
  static constexpr std::array<SlotDecl, 1> kSlots = {PerRow("accum")};
  static constexpr auto kHyper = AdagradRule::kHyper;  // Adagrad's lr and epsilon
  static constexpr std::array<RuleOption, 0> kOptions = {};

  template <typename C>
  struct Params {
    C lr, epsilon;
  };

  template <typename C>
  static Params<C> Prepare(const C* h, const bool*) {
    constexpr int lr = Index(kHyper, "lr"), epsilon = Index(kHyper, "epsilon");
    return {h[lr], h[epsilon]};
  }

  // Returns the row's multiplier lr / (sqrt(accum) + eps).
  template <typename C>
  FO_HOST_DEVICE static C UpdateRow(const Params<C>& p, C* slot, C row_sum, C row_size) {
    constexpr int accum_slot = Index(kSlots, "accum");
    C& accum = slot[accum_slot];
    accum += row_sum / row_size;
    return p.lr / (Sqrt(accum) + p.epsilon);
  }

  template <typename C>
  FO_HOST_DEVICE static void Update(const Params<C>&, C& var, C*, C g, C multiplier) {
    var -= multiplier * g;
  }
};

}  // namespace fusedopt
