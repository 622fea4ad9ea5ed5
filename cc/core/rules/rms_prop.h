// RMSprop with momentum (TF ApplyRMSProp; Keras RMSprop with momentum > 0):
//   ms  += (g^2 - ms)(1 - rho)
//   mom  = momentum*mom + lr*g/sqrt(ms + eps)
//   var -= mom
// Not a `centered` option: that adds a slot (mg), and every engine (vector loads, GPU
// kernel parameters, register arrays) is built on a compile-time slot count; the centered
// form would be a rule of its own, as TF has ApplyCenteredRMSProp beside ApplyRMSProp.
#pragma once

#include "cc/core/rule.h"

namespace fusedopt {

struct RmsPropRule {
  static constexpr const char* kOpName = "RMSProp";
  static constexpr std::array<SlotDecl, 2> kSlots = {PerElement("ms"), PerElement("mom")};
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
    mom = mom * p.momentum + (g * p.lr) / Sqrt(ms + p.epsilon);
    var -= mom;
  }
};

}  // namespace fusedopt
