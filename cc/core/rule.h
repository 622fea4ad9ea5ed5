// What every update rule declares, so the engine, the TF binding and the pybind11
// module can drive any rule without knowing it.
//
// A rule is a struct with:
//   kOpName     "LazyAdam"   -> ops FusedOpt>{,Resource}{,Sparse}ApplyLazyAdam; its
//                               snake case, PyName<Rule>() "lazy_adam", is the Python-side
//                               name (fusedopt.ops.resource_apply_lazy_adam,
//                               python/fusedopt/rules/lazy_adam.py)
//   kSlots      slots in op-input order (after var): name and layout, PerElement("m")
//               (var's shape) or PerRow("accum") (one value per row of var: shape
//               var.shape[:1], [] for a scalar var)
//   kHyper      scalar hyper-parameter names, in op-input order (after the slots)
//   kOptions    boolean attributes with defaults
//   Params<C>   what Prepare() precomputes once per call from the hyper-parameters
//   Update()    the per-element math, host and device, on compute type C.
// The sparse engine applies Update() to every element of each touched row with the
// duplicate-summed gradient, so a rule never sees indices.
//
// A rule with a per-row slot also has a per-row phase, run once per row before the
// row's element updates:
//   RowTerm(g)                         what each element adds to the row's sum (g*g);
//                                      summed in the order of row_sum.h
//   UpdateRow(p, slot, row_sum, D)     updates the per-row slots in slot[] from the sum
//                                      over the row's D elements; returns one value,
//   Update(p, var, slot, g, row)       which every element update of the row receives.
// In UpdateRow only the per-row entries of slot[] are loaded; in Update the per-row
// entries hold the row's new values (read-only: the engines store them once per row).
#pragma once

#include <array>
#include <string>

#include "cc/core/numeric.h"

namespace fusedopt {

struct RuleOption {
  const char* name;
  bool default_value;
};

enum class SlotLayout { kPerElement, kPerRow };

struct SlotDecl {
  const char* name;
  SlotLayout layout;
  // A slot reads as its name wherever names are listed (messages, op inputs).
  constexpr operator const char*() const { return name; }
};

constexpr SlotDecl PerElement(const char* name) { return {name, SlotLayout::kPerElement}; }
constexpr SlotDecl PerRow(const char* name) { return {name, SlotLayout::kPerRow}; }

// Position of `name` in a rule's list of names, for use in constant expressions:
//   constexpr int lr = Index(kHyper, "lr");     // h[lr] rather than h[2]
// A name that is not in the list does not compile (NameNotInList is not constexpr).
inline int NameNotInList() { return -1; }

constexpr bool SameName(const char* a, const char* b) {
  while (*a != '\0' && *a == *b) {
    ++a;
    ++b;
  }
  return *a == *b;
}

template <size_t N>
constexpr int Index(const std::array<const char*, N>& names, const char* name) {
  for (size_t i = 0; i < N; ++i) {
    if (SameName(names[i], name)) return static_cast<int>(i);
  }
  return NameNotInList();
}

// The same for options and slots: anything with a `name`.
template <typename Named, size_t N>
constexpr int Index(const std::array<Named, N>& list, const char* name) {
  for (size_t i = 0; i < N; ++i) {
    if (SameName(list[i].name, name)) return static_cast<int>(i);
  }
  return NameNotInList();
}

// "RMSProp" -> "rms_prop", "LazyAdam" -> "lazy_adam": a word starts at an upper-case
// letter after a lower-case one, or at the last capital of an acronym.
inline std::string SnakeCase(const char* camel) {
  std::string out;
  for (const char* c = camel; *c != '\0'; ++c) {
    const auto upper = [](char x) { return x >= 'A' && x <= 'Z'; };
    const auto lower = [](char x) { return x >= 'a' && x <= 'z'; };
    const bool starts_word = c != camel && upper(*c) &&
                             (lower(c[-1]) || (upper(c[-1]) && lower(c[1])));
    if (starts_word) out += '_';
    out += upper(*c) ? static_cast<char>(*c - 'A' + 'a') : *c;
  }
  return out;
}

// The rule's Python-side name, derived so that the op name is stated once.
template <typename Rule>
const std::string& PyName() {
  static const std::string name = SnakeCase(Rule::kOpName);
  return name;
}

template <typename Rule>
constexpr int NumSlots() {
  return static_cast<int>(Rule::kSlots.size());
}
template <typename Rule>
constexpr int NumHyper() {
  return static_cast<int>(Rule::kHyper.size());
}
template <typename Rule>
constexpr int NumOptions() {
  return static_cast<int>(Rule::kOptions.size());
}

template <typename Rule>
constexpr bool IsPerRowSlot(int k) {
  return Rule::kSlots[k].layout == SlotLayout::kPerRow;
}

// Whether the rule has per-row slots, hence a per-row phase (UpdateRow).
template <typename Rule>
constexpr bool HasRowPhase() {
  for (int k = 0; k < NumSlots<Rule>(); ++k) {
    if (IsPerRowSlot<Rule>(k)) return true;
  }
  return false;
}

// The per-row phase's term of the row-wise rules that average g^2 over a row (row-wise
// Adagrad's accumulator, partial row-wise Adam's second moment): inherit it.
struct RowMeanOfSquares {
  template <typename C>
  FO_HOST_DEVICE static C RowTerm(C g) {
    return g * g;
  }
};

}  // namespace fusedopt
