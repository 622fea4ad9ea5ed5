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
#ifndef FUSEDOPT_CC_TF_VARIABLE_PACK_H_
#define FUSEDOPT_CC_TF_VARIABLE_PACK_H_

#include <string>
#include <vector>

#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"

namespace fusedopt {
namespace tf {

class VariablePack : public ::tensorflow::ResourceBase {
 public:
  explicit VariablePack(std::vector<::tensorflow::core::RefCountPtr<::tensorflow::Var>> members)
      : members_(std::move(members)) {}

  // In the op's input order: every var, then each slot's N variables.
  const std::vector<::tensorflow::core::RefCountPtr<::tensorflow::Var>>& members() const {
    return members_;
  }

  std::string DebugString() const override {
    return "fusedopt VariablePack of " + std::to_string(members_.size()) + " variables";
  }

 private:
  const std::vector<::tensorflow::core::RefCountPtr<::tensorflow::Var>> members_;
};

}  // namespace tf
}  // namespace fusedopt

#endif  // FUSEDOPT_CC_TF_VARIABLE_PACK_H_
