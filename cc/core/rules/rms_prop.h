// RMSprop with momentum, plain and centered, epsilon inside the square root:
//   ms  += (g^2 - ms)(1 - rho)
//   mg  += (g - mg)(1 - rho)                       centered only
//   mom  = momentum*mom + lr*g/sqrt(ms + eps)      centered: sqrt(ms - mg^2 + eps)
//   var -= mom
// RMSProp is TF's ApplyRMSProp (Keras RMSprop with momentum > 0, tf.compat.v1's
// RMSPropOptimizer); CenteredRMSProp is TF's ApplyCenteredRMSProp (centered=True). Two
// rules of one form, as TF has two ops: the centered form's third slot (mg) changes the
// slot count every engine is compiled for.
#pragma once

#include <array>

#include "cc/core/rule.h"

namespace fusedopt {

namespace detail {
template <bool kCentered>
struct RmsPropSlots {
  static constexpr const char* kOpName = "RMSProp";
  static constexpr std::array<SlotDecl, 2> kSlots = {PerElement("ms"), PerElement("mom")};
};
template <>
struct RmsPropSlots<true> {
  static constexpr const char* kOpName = "CenteredRMSProp";
  static constexpr std::array<SlotDecl, 3> kSlots = {PerElement("ms"), PerElement("mom"),
                                                     PerElement("mg")};
};
}  // namespace detail

template <bool kCentered>
struct RmsPropForm : detail::RmsPropSlots<kCentered> {
  using detail::RmsPropSlots<kCentered>::kSlots;
  static constexpr std::array<const char*, 4> kHyper = {"lr", "rho", "momentum", "epsilon"};
  static constexpr std::array<RuleOption, 0> kOptions = {};

  template <typename C>
  struct Params {
    C lr, one_minus_rho, momentum, epsilon;
  };

  template <typename C>
  static Params<C> Prepare(const C* h, const bool*) {
    constexpr int lr = Index(kHyper, "lr"), rho = Index(kHyper, "rho"),
                  momentum = Index(kHyper, "momentum"), epsilon = Index(kHyper, "epsilon");
    return {h[lr], C(1) - h[rho], h[momentum], h[epsilon]};
  }

  template <typename C>
  FO_HOST_DEVICE static void Update(const Params<C>& p, C& var, C* slot, C g) {
    constexpr int ms_slot = Index(kSlots, "ms"), mom_slot = Index(kSlots, "mom");
    C &ms = slot[ms_slot], &mom = slot[mom_slot];
    ms += (g * g - ms) * p.one_minus_rho;
    C denominator = ms + p.epsilon;
    if constexpr (kCentered) {
      // A constexpr index, like the others: computed in the expression, it was left to run
      // time, which kept the element loop from vectorising (2.2x TF's own kernel).
      constexpr int mg_slot = Index(kSlots, "mg");
      C& mg = slot[mg_slot];
      mg += (g - mg) * p.one_minus_rho;
      denominator = (ms - mg * mg) + p.epsilon;
    }
    mom = mom * p.momentum + (g * p.lr) / Sqrt(denominator);
    var -= mom;
  }
};

using RmsPropRule = RmsPropForm<false>;
using CenteredRmsPropRule = RmsPropForm<true>;

}  // namespace fusedopt
