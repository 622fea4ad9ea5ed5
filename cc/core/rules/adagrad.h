// Adagrad in the three forms users migrate from:
//   tf.compat.v1 AdagradOptimizer  var -= lr*g/sqrt(acc)          (epsilon = 0)
//   ApplyAdagradV2 / tf_keras      var -= lr*g/(sqrt(acc)+eps)    (default)
//   Keras >= 2.11, Keras 3         var -= lr*g/sqrt(acc+eps)      (epsilon_inside_sqrt)
// update_slots=false leaves the accumulator as is (TF's attribute of that name).
#pragma once

#include "cc/core/rule.h"

namespace fusedopt {

struct AdagradRule {
  static constexpr const char* kOpName = "Adagrad";
  static constexpr std::array<SlotDecl, 1> kSlots = {PerElement("accum")};
  static constexpr std::array<const char*, 2> kHyper = {"lr", "epsilon"};
  static constexpr std::array<RuleOption, 2> kOptions = {
      {{"update_slots", true}, {"epsilon_inside_sqrt", false}}};

  template <typename C>
  struct Params {
    C lr, epsilon;
    bool update_slots, epsilon_inside_sqrt;
  };

  template <typename C>
  static Params<C> Prepare(const C* h, const bool* options) {
    constexpr int lr = Index(kHyper, "lr"), epsilon = Index(kHyper, "epsilon");
    constexpr int update_slots = Index(kOptions, "update_slots"),
                  epsilon_inside_sqrt = Index(kOptions, "epsilon_inside_sqrt");
    return {h[lr], h[epsilon], options[update_slots], options[epsilon_inside_sqrt]};
  }

  template <typename C>
  FO_HOST_DEVICE static void Update(const Params<C>& p, C& var, C* slot, C g) {
    constexpr int accum_slot = Index(kSlots, "accum");
    C& accum = slot[accum_slot];
    if (p.update_slots) accum += g * g;
    const C denom = p.epsilon_inside_sqrt ? Sqrt(accum + p.epsilon) : Sqrt(accum) + p.epsilon;
    var -= g * p.lr / denom;
  }
};

}  // namespace fusedopt
