// A member pack: one resource that holds (references to) the resource variables of a
// group update, so that the packed group op takes one handle instead of (1 + slots) * N.
//
// Why: a tf.function's per-call cost grows with its captured inputs (~2 us each in TF's
// Python call path, BENCHMARKS.md "Steps per call"): a step over 1,000 variables and
// their 2,000 slots spends more time passing 3,000 handles than updating them.
//
// FusedOpt>VariablePack(members: N * resource) -> pack: resource, run once (eagerly, by
// fusedopt._dispatch), checks that every member is a distinct, initialized resource
// variable; the handle it returns owns the pack (ref-counting handle: the pack, and
// with it the members' Vars, live while a handle does). The members keep their own
// locks: the packed group op locks each one exactly as the list op does.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"

namespace fusedopt {
namespace tf {

// The positions 0..n-1 of `vars` sorted by address: the order TF's helpers lock
// variables in (each Var has its own mutex), so locking in it cannot deadlock with them.
// False, with `duplicate` = (a, b), a < b, when vars[a] and vars[b] are the same variable.
inline bool AddressOrder(const std::vector<::tensorflow::Var*>& vars,
                         std::vector<int64_t>* order, std::pair<int64_t, int64_t>* duplicate) {
  order->resize(vars.size());
  std::iota(order->begin(), order->end(), int64_t{0});
  std::sort(order->begin(), order->end(), [&](int64_t a, int64_t b) {
    return vars[a] != vars[b] ? vars[a] < vars[b] : a < b;
  });
  for (size_t i = 1; i < order->size(); ++i) {
    const int64_t a = (*order)[i - 1], b = (*order)[i];
    if (vars[a] == vars[b]) {
      *duplicate = {a, b};
      return false;
    }
  }
  return true;
}

class VariablePack : public ::tensorflow::ResourceBase {
 public:
  // `members` distinct; `lock_order` their AddressOrder.
  VariablePack(std::vector<::tensorflow::core::RefCountPtr<::tensorflow::Var>> members,
               std::vector<int64_t> lock_order)
      : members_(std::move(members)), lock_order_(std::move(lock_order)) {
    for (const auto& member : members_) vars_.push_back(member.get());
  }

  // In the op's input order: every var, then each slot's N variables. The pack holds a
  // reference to each: they live while it does.
  const std::vector<::tensorflow::Var*>& members() const { return vars_; }

  // Positions in members() by address, computed once: each step locks in this order.
  const std::vector<int64_t>& lock_order() const { return lock_order_; }

  std::string DebugString() const override {
    return "fusedopt VariablePack of " + std::to_string(members_.size()) + " variables";
  }

 private:
  const std::vector<::tensorflow::core::RefCountPtr<::tensorflow::Var>> members_;
  const std::vector<int64_t> lock_order_;
  std::vector<::tensorflow::Var*> vars_;
};

}  // namespace tf
}  // namespace fusedopt
