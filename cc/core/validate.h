// Shape validation shared by the TF binding and the pybind11 module, so both reject
// the same inputs with the same words. Everything here runs before any write.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cc/core/rule.h"

namespace fusedopt {

using Shape = std::vector<int64_t>;

// Most indices one sparse call takes, on every device: the CUDA engine sorts (row,
// position) pairs with 32-bit positions and CUB's int item counts (plus one for its scan).
// 2^31 ids are 8-16 GB of indices alone; split such a batch into several calls.
constexpr int64_t kMaxSparseIndices = 2147483646;

inline std::string ShapeString(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ",";
    out += std::to_string(s[i]);
  }
  return out + "]";
}

// The shape a slot of `layout` has beside a variable of shape `var`: var's, or one value
// per row, var.shape[:1] ([] for a scalar var: one row).
inline Shape SlotShape(SlotLayout layout, const Shape& var) {
  if (layout == SlotLayout::kPerElement || var.empty()) return var;
  return Shape{var[0]};
}

// Checks the slots against var and the hyper-parameters for scalars. Returns "" when
// fine, else the message. `slots` has NumSlots<Rule>() shapes, `hyper` NumHyper<Rule>().
template <typename Rule>
std::string ValidateStateAndHyper(const Shape& var, const Shape* slots, const Shape* hyper) {
  for (int i = 0; i < NumSlots<Rule>(); ++i) {
    if (IsPerRowSlot<Rule>(i)) {
      const Shape want = SlotShape(SlotLayout::kPerRow, var);
      if (slots[i] != want) {
        return std::string(Rule::kSlots[i]) + " holds one value per row of var: shape " +
               (var.empty() ? std::string("[] for a scalar var") : "var.shape[:1] = " + ShapeString(want)) +
               ", got " + ShapeString(slots[i]) + " (var " + ShapeString(var) + ")";
      }
    } else if (slots[i] != var) {
      return std::string(Rule::kSlots[i]) + " must have the same shape as var: " +
             ShapeString(var) + " vs " + ShapeString(slots[i]);
    }
  }
  for (int i = 0; i < NumHyper<Rule>(); ++i) {
    if (!hyper[i].empty()) {
      return std::string(Rule::kHyper[i]) + " must be a scalar, got shape " +
             ShapeString(hyper[i]);
    }
  }
  return "";
}

template <typename Rule>
std::string ValidateDense(const Shape& var, const Shape* slots, const Shape* hyper,
                          const Shape& grad) {
  std::string error = ValidateStateAndHyper<Rule>(var, slots, hyper);
  if (error.empty() && grad != var) {
    error = "grad must have the same shape as var: " + ShapeString(var) + " vs " +
            ShapeString(grad);
  }
  return error;
}

template <typename Rule>
std::string ValidateSparse(const Shape& var, const Shape* slots, const Shape* hyper,
                           const Shape& grad, const Shape& indices) {
  std::string error = ValidateStateAndHyper<Rule>(var, slots, hyper);
  if (!error.empty()) return error;
  if (var.empty()) return "var must be at least 1-D, got shape []";
  if (indices.size() != 1) return "indices must be 1-D, got shape " + ShapeString(indices);
  if (indices[0] > kMaxSparseIndices) {
    return "sparse updates take at most " + std::to_string(kMaxSparseIndices) +
           " indices per call, got " + std::to_string(indices[0]);
  }
  Shape expected = var;
  expected[0] = indices[0];
  if (grad.size() != var.size() || !std::equal(grad.begin() + 1, grad.end(), var.begin() + 1)) {
    expected[0] = grad.empty() ? indices[0] : grad[0];
    return "grad must have shape [N] + var.shape[1:] = " + ShapeString(expected) + ", got " +
           ShapeString(grad);
  }
  if (grad[0] != indices[0]) {
    return "grad and indices must have the same first dimension: " + std::to_string(grad[0]) +
           " vs " + std::to_string(indices[0]);
  }
  return "";
}

}  // namespace fusedopt
