// The registry of rules. Adding an optimizer: write rules/<name>.h, list it here,
// add a one-line cc/tf/<name>.cc registration and its Python class.
#pragma once

#include "cc/core/rules/adagrad.h"
#include "cc/core/rules/lazy_adam.h"
#include "cc/core/rules/partial_row_wise_adam.h"
#include "cc/core/rules/adamax.h"
#include "cc/core/rules/rms_prop.h"
#include "cc/core/rules/row_wise_adagrad.h"

namespace fusedopt {

template <typename... Rules>
struct RuleList {
  // Calls fn(Rule{}) for every rule, in order.
  template <typename Fn>
  static void ForEach(Fn&& fn) {
    (fn(Rules{}), ...);
  }
};

using AllRules = RuleList<LazyAdamRule, AdamaxRule, AdagradRule, RmsPropRule, RowWiseAdagradRule,
                          PartialRowWiseAdamRule, CenteredRmsPropRule>;

}  // namespace fusedopt
