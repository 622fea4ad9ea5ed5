// Op definitions for any rule: four ops per rule, built from the rule's declared
// slots, hyper-parameters and options, so no optimizer writes REGISTER_OP by hand.
//
//   FusedOpt>Apply<Rule>                 ref variables, returns the var ref
//   FusedOpt>ResourceApply<Rule>         resource variables
//   FusedOpt>SparseApply<Rule>           ref, (grad [N]+var.shape[1:], indices [N])
//   FusedOpt>ResourceSparseApply<Rule>   resource, sparse
//
// The shape functions run the same validation as the kernels whenever the shapes
// are fully known (same message, at graph-construction time); otherwise they merge
// what is known, like TF's own training ops.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "cc/core/rule.h"
#include "cc/core/validate.h"
#include "cc/tf/tf_types.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace fusedopt {
namespace tf {

enum class Variant { kApply, kResourceApply, kSparseApply, kResourceSparseApply };
constexpr Variant kAllVariants[] = {Variant::kApply, Variant::kResourceApply,
                                    Variant::kSparseApply, Variant::kResourceSparseApply};

constexpr bool IsResource(Variant v) {
  return v == Variant::kResourceApply || v == Variant::kResourceSparseApply;
}
constexpr bool IsSparse(Variant v) {
  return v == Variant::kSparseApply || v == Variant::kResourceSparseApply;
}

inline std::string OpName(const char* rule_op_name, Variant v) {
  static const char* const kPrefix[] = {"Apply", "ResourceApply", "SparseApply",
                                        "ResourceSparseApply"};
  return std::string("FusedOpt>") + kPrefix[static_cast<int>(v)] + rule_op_name;
}

namespace detail {

using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

// The variable's shape: from the resource handle's data when there is one.
inline ShapeHandle VariableShape(InferenceContext* c, int input) {
  const auto* handle_data = c->input_handle_shapes_and_types(input);
  if (handle_data != nullptr && !handle_data->empty() &&
      (*handle_data)[0].dtype != ::tensorflow::DT_INVALID) {
    return (*handle_data)[0].shape;
  }
  return c->input(input);
}

inline bool KnownShape(InferenceContext* c, ShapeHandle h, Shape* out) {
  if (!c->FullyDefined(h)) return false;
  out->clear();
  for (int i = 0; i < c->Rank(h); ++i) out->push_back(c->Value(c->Dim(h, i)));
  return true;
}

// "" when per-row slot k's (partly known) shape can be var's rows (var.shape[:1], [] for
// a scalar var), else the kernels' message with the shapes as far as they are known.
template <typename Rule>
std::string CheckRowSlot(InferenceContext* c, int k, ShapeHandle var, ShapeHandle slot) {
  if (!c->RankKnown(var)) return "";
  const ShapeHandle rows = c->Rank(var) == 0 ? c->Scalar() : c->Vector(c->Dim(var, 0));
  ShapeHandle unused;
  if (c->Merge(rows, slot, &unused).ok()) return "";
  return std::string(Rule::kSlots[k]) + " holds one value per row of var: shape " +
         c->DebugString(rows) + ", got " + c->DebugString(slot) + " (var " + c->DebugString(var) +
         ")";
}

template <typename Rule>
absl::Status InferShapes(InferenceContext* c, bool sparse, bool ref_output) {
  constexpr int kSlots = NumSlots<Rule>(), kHyper = NumHyper<Rule>();
  const int grad_input = 1 + kSlots + kHyper;
  // Fully known: the kernels' own validation, word for word.
  std::vector<ShapeHandle> handles;
  for (int i = 0; i <= kSlots; ++i) handles.push_back(VariableShape(c, i));
  for (int i = 0; i < kHyper; ++i) handles.push_back(c->input(1 + kSlots + i));
  handles.push_back(c->input(grad_input));
  if (sparse) handles.push_back(c->input(grad_input + 1));
  std::vector<Shape> known(handles.size());
  bool all_known = true;
  for (size_t i = 0; i < handles.size(); ++i) all_known &= KnownShape(c, handles[i], &known[i]);
  if (all_known) {
    const Shape* slots = &known[1];
    const Shape* hyper = &known[1 + kSlots];
    const std::string error =
        sparse ? ValidateSparse<Rule>(known[0], slots, hyper, known[grad_input], known.back())
               : ValidateDense<Rule>(known[0], slots, hyper, known[grad_input]);
    if (!error.empty()) return absl::InvalidArgumentError(error);
  }
  // Partly known: merge what we can; where it cannot fit, the kernels' words with the
  // shapes as far as they are known ("?" for the rest), in the kernels' order of checks.
  // (A failed Merge/WithRank clears its output handle: merge into a separate one.)
  const auto text = [c](ShapeHandle h) { return c->DebugString(h); };
  ShapeHandle var = handles[0], merged;
  for (int i = 1; i <= kSlots; ++i) {
    if (IsPerRowSlot<Rule>(i - 1)) continue;  // below, against var's rows
    if (!c->Merge(var, handles[i], &merged).ok()) {
      return absl::InvalidArgumentError(std::string(Rule::kSlots[i - 1]) +
                                        " must have the same shape as var: " + text(var) +
                                        " vs " + text(handles[i]));
    }
    var = merged;
  }
  for (int i = 1; i <= kSlots; ++i) {
    if (!IsPerRowSlot<Rule>(i - 1)) continue;
    const std::string error = CheckRowSlot<Rule>(c, i - 1, var, handles[i]);
    if (!error.empty()) return absl::InvalidArgumentError(error);
  }
  ShapeHandle unused;
  for (int i = 0; i < kHyper; ++i) {
    const ShapeHandle h = handles[1 + kSlots + i];
    if (!c->WithRank(h, 0, &unused).ok()) {
      return absl::InvalidArgumentError(std::string(Rule::kHyper[i]) +
                                        " must be a scalar, got shape " + text(h));
    }
  }
  ShapeHandle grad = handles[grad_input];
  if (sparse) {
    if (!c->WithRankAtLeast(var, 1, &merged).ok()) {
      return absl::InvalidArgumentError("var must be at least 1-D, got shape " + text(var));
    }
    var = merged;
    ShapeHandle indices;
    if (!c->WithRank(handles.back(), 1, &indices).ok()) {
      return absl::InvalidArgumentError("indices must be 1-D, got shape " +
                                        text(handles.back()));
    }
    // [N] + var.shape[1:] with N = grad's first dimension if known, else indices' (as the
    // kernel reports it).
    ShapeHandle var_inner, expected;
    TF_RETURN_IF_ERROR(c->Subshape(var, 1, &var_inner));
    const bool grad_n =
        c->RankKnown(grad) && c->Rank(grad) >= 1 && c->ValueKnown(c->Dim(grad, 0));
    const auto n = grad_n ? c->Dim(grad, 0) : c->Dim(indices, 0);
    TF_RETURN_IF_ERROR(c->Concatenate(c->Vector(n), var_inner, &expected));
    ShapeHandle grad_inner;
    if (!c->WithRankAtLeast(grad, 1, &unused).ok() || !c->Subshape(grad, 1, &grad_inner).ok() ||
        !c->Merge(var_inner, grad_inner, &unused).ok()) {
      return absl::InvalidArgumentError("grad must have shape [N] + var.shape[1:] = " +
                                        text(expected) + ", got " + text(grad));
    }
    ::tensorflow::shape_inference::DimensionHandle unused_dim;
    if (!c->Merge(c->Dim(grad, 0), c->Dim(indices, 0), &unused_dim).ok()) {
      return absl::InvalidArgumentError(
          "grad and indices must have the same first dimension: " +
          c->DebugString(c->Dim(grad, 0)) + " vs " + c->DebugString(c->Dim(indices, 0)));
    }
  } else if (c->Merge(var, grad, &merged).ok()) {
    var = merged;
  } else {
    return absl::InvalidArgumentError("grad must have the same shape as var: " + text(var) +
                                      " vs " + text(grad));
  }
  if (ref_output) c->set_output(0, var);
  return absl::OkStatus();
}

}  // namespace detail

// Every op's attributes past its types: stochastic_rounding (of 16-bit slots: numeric.h),
// then the rule's options.
template <typename Rule>
void AddCommonAttrs(::tensorflow::register_op::OpDefBuilderWrapper& op) {
  op.Attr("stochastic_rounding: bool = false");
  for (const RuleOption& option : Rule::kOptions) {
    op.Attr(std::string(option.name) + ": bool = " + (option.default_value ? "true" : "false"));
  }
}

// Every op's last input: the seed of stochastic rounding (numeric.h's CallSalt), a list of
// at most one int64 scalar. Given with stochastic_rounding, which needs one (the step
// number, or anything else that changes every call); none otherwise, so graphs written
// before the input existed still load and run as they did.
constexpr const char* kRoundingSeedInput = "rounding_seed";
constexpr const char* kRoundingSeedCount = "NSeed";

inline void AddRoundingSeed(::tensorflow::register_op::OpDefBuilderWrapper& op) {
  op.Input(std::string(kRoundingSeedInput) + ": " + kRoundingSeedCount + " * int64");
  op.Attr(std::string(kRoundingSeedCount) + ": int >= 0 = 0");
}

// "" when the op's attributes agree with its rounding seeds, else the refusal.
inline std::string RoundingSeedAttrError(bool stochastic_rounding, int64_t seeds) {
  if (seeds > 1) {
    return "rounding_seed takes at most one value (the call's seed), got " + std::to_string(seeds);
  }
  if (stochastic_rounding && seeds == 0) {
    return "stochastic_rounding needs a rounding_seed: an int64 scalar that changes every call "
           "(e.g. the step number); without one an element that does not change would round "
           "the same way every step, a bias";
  }
  return "";
}

// The attributes every kernel of a rule reads past its types (the op kernels and the XLA
// kernels alike): stochastic_rounding, the rule's options, and the count of rounding seeds
// checked against stochastic_rounding. Read() reports to ctx.
template <typename Rule>
struct UpdateAttrs {
  bool stochastic = false;
  std::array<bool, NumOptions<Rule>()> options{};

  void Read(::tensorflow::OpKernelConstruction* ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("stochastic_rounding", &stochastic));
    for (int i = 0; i < NumOptions<Rule>(); ++i) {
      OP_REQUIRES_OK(ctx, ctx->GetAttr(Rule::kOptions[i].name, &options[i]));
    }
    int64_t seeds = 0;
    OP_REQUIRES_OK(ctx, ctx->GetAttr(kRoundingSeedCount, &seeds));
    const std::string error = RoundingSeedAttrError(stochastic, seeds);
    OP_REQUIRES(ctx, error.empty(), absl::InvalidArgumentError(error));
  }
};

namespace detail {

// The rounding seed's checks at graph construction: the attributes, and a scalar.
inline absl::Status InferRoundingSeed(InferenceContext* c) {
  bool stochastic = false;
  int64_t seeds = 0;
  TF_RETURN_IF_ERROR(c->GetAttr("stochastic_rounding", &stochastic));
  TF_RETURN_IF_ERROR(c->GetAttr(kRoundingSeedCount, &seeds));
  const std::string error = RoundingSeedAttrError(stochastic, seeds);
  if (!error.empty()) return absl::InvalidArgumentError(error);
  std::vector<ShapeHandle> shapes;
  TF_RETURN_IF_ERROR(c->input(kRoundingSeedInput, &shapes));
  for (const ShapeHandle& h : shapes) {
    ShapeHandle unused;
    if (!c->WithRank(h, 0, &unused).ok()) {
      return absl::InvalidArgumentError("rounding_seed must be a scalar, got shape " +
                                        c->DebugString(h));
    }
  }
  return absl::OkStatus();
}

}  // namespace detail

// The sparse ops' attribute: true updates every row, those no index names with a zero
// gradient (Keras's and TF's Adam on a sparse gradient), instead of the named rows only.
// The CPU kernels do it in one pass (engine.h's ApplySparseEveryRow); the GPU and XLA
// kernels refuse it (fusedopt's Python classes give those the dense op on the densified
// gradient instead).
constexpr const char* kEveryRowAttr = "every_row";

inline std::string EveryRowRefused(const char* where) {
  return std::string("every_row=True (a sparse update of every row) runs in the CPU kernels "
                     "only, not ") + where + "; densify the gradient and use the dense op "
                     "(fusedopt's optimizer classes do)";
}

template <typename Rule>
void RegisterOpDef(Variant variant) {
  const std::string name = OpName(Rule::kOpName, variant);
  // Ref slots carry their dtype S (var's, or for a float32 var bfloat16/half: tf_types.h,
  // checked by the kernel); resource slots are found to be of one at run time.
  const bool resource = IsResource(variant);
  ::tensorflow::register_op::OpDefBuilderWrapper op(name.c_str());
  op.Input(std::string("var: ") + (resource ? "resource" : "Ref(T)"));
  for (const char* slot : Rule::kSlots) {
    op.Input(std::string(slot) + ": " + (resource ? "resource" : "Ref(S)"));
  }
  for (const char* hyper : Rule::kHyper) op.Input(std::string(hyper) + ": T");
  op.Input("grad: T");
  if (IsSparse(variant)) {
    op.Input("indices: Tindices");
    op.Attr(TypeAttr("Tindices", IndexDataTypes()));
    op.Attr(std::string(kEveryRowAttr) + ": bool = false");
  }
  AddRoundingSeed(op);
  if (!IsResource(variant)) {
    op.Output("out: Ref(T)");
    // Let the kernel report uninitialized ref inputs in its own words.
    op.SetAllowsUninitializedInput();
  }
  op.Attr(TypeAttr("T", StorageDataTypes()));
  if (!resource) op.Attr(TypeAttr("S", StorageDataTypes()));
  op.Attr("use_locking: bool = false");
  AddCommonAttrs<Rule>(op);
  const bool sparse = IsSparse(variant), ref_output = !IsResource(variant);
  op.SetShapeFn([sparse, ref_output](::tensorflow::shape_inference::InferenceContext* c) {
    TF_RETURN_IF_ERROR(detail::InferRoundingSeed(c));
    return detail::InferShapes<Rule>(c, sparse, ref_output);
  });
  op.Doc(std::string("Fused ") + Rule::kOpName + " update" +
         (sparse ? " of the rows named by indices (duplicates summed first; every_row: of "
                   "every row, the others with a zero gradient)" : "") +
         ". See fusedopt.ops for the Python wrapper.");
  op();  // registers with the global op registry
}

// FusedOpt>ResourceGroupApply<Rule>: one dense update of N resource variables at once
// (var: N * resource, each slot: N * resource, the hyper-parameters once, grad: N * T).
// Every variable, slot and gradient has the same dtype; the per-step scalars are shared.
inline std::string GroupOpName(const char* rule_op_name) {
  return std::string("FusedOpt>ResourceGroupApply") + rule_op_name;
}

// "variable 3 of 10: " + a single-variable message: which member of the group is wrong.
inline std::string GroupMemberError(int64_t i, int64_t n, const std::string& error) {
  return "variable " + std::to_string(i) + " of " + std::to_string(n) + ": " + error;
}

namespace detail {

template <typename Rule>
absl::Status InferGroupShapes(InferenceContext* c) {
  constexpr int kSlots = NumSlots<Rule>(), kHyper = NumHyper<Rule>();
  int64_t n = 0;
  TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
  const int64_t first_hyper = (1 + kSlots) * n, first_grad = first_hyper + kHyper;
  ShapeHandle unused;
  for (int i = 0; i < kHyper; ++i) {
    const ShapeHandle h = c->input(first_hyper + i);
    if (!c->WithRank(h, 0, &unused).ok()) {
      return absl::InvalidArgumentError(std::string(Rule::kHyper[i]) +
                                        " must be a scalar, got shape " + c->DebugString(h));
    }
  }
  for (int64_t v = 0; v < n; ++v) {
    ShapeHandle var = VariableShape(c, v), merged;
    for (int k = 0; k <= kSlots; ++k) {
      const bool grad = k == kSlots;
      if (!grad && IsPerRowSlot<Rule>(k)) continue;  // below, against var's rows
      const ShapeHandle other = grad ? c->input(first_grad + v) : VariableShape(c, (k + 1) * n + v);
      if (c->Merge(var, other, &merged).ok()) {
        var = merged;
        continue;
      }
      const std::string what = grad ? "grad" : Rule::kSlots[k];
      return absl::InvalidArgumentError(GroupMemberError(
          v, n, what + " must have the same shape as var: " + c->DebugString(var) + " vs " +
                    c->DebugString(other)));
    }
    for (int k = 0; k < kSlots; ++k) {
      if (!IsPerRowSlot<Rule>(k)) continue;
      const std::string error = CheckRowSlot<Rule>(c, k, var, VariableShape(c, (k + 1) * n + v));
      if (!error.empty()) return absl::InvalidArgumentError(GroupMemberError(v, n, error));
    }
  }
  return absl::OkStatus();
}

}  // namespace detail

// FusedOpt>ResourcePackedGroupApply<Rule>: the group op on a member pack
// (FusedOpt>VariablePack, cc/tf/variable_pack.h) instead of lists of handles: the same
// update, with one resource input instead of (1 + slots) * N. A step function then
// captures one handle, not thousands (TF's per-call cost grows with its captured inputs).
inline std::string PackedGroupOpName(const char* rule_op_name) {
  return std::string("FusedOpt>ResourcePackedGroupApply") + rule_op_name;
}

namespace detail {

// The packed op's shapes: its hyper-parameters (the members' are known to the kernel only).
template <typename Rule>
absl::Status InferPackedGroupShapes(InferenceContext* c) {
  for (int i = 0; i < NumHyper<Rule>(); ++i) {
    ShapeHandle unused;
    if (!c->WithRank(c->input(1 + i), 0, &unused).ok()) {
      return absl::InvalidArgumentError(std::string(Rule::kHyper[i]) +
                                        " must be a scalar, got shape " +
                                        c->DebugString(c->input(1 + i)));
    }
  }
  return absl::OkStatus();
}

}  // namespace detail

// The group op (packed: its packed form).
template <typename Rule>
void RegisterGroupOpDef(bool packed) {
  const std::string name = packed ? PackedGroupOpName(Rule::kOpName) : GroupOpName(Rule::kOpName);
  ::tensorflow::register_op::OpDefBuilderWrapper op(name.c_str());
  if (packed) {
    op.Input("pack: resource");
  } else {
    op.Input("var: N * resource");
    for (const char* slot : Rule::kSlots) op.Input(std::string(slot) + ": N * resource");
  }
  for (const char* hyper : Rule::kHyper) op.Input(std::string(hyper) + ": T");
  op.Input("grad: N * T");
  AddRoundingSeed(op);
  op.Attr("N: int >= 1");
  op.Attr(TypeAttr("T", StorageDataTypes()));
  op.Attr("use_locking: bool = false");
  AddCommonAttrs<Rule>(op);
  op.SetShapeFn([packed](::tensorflow::shape_inference::InferenceContext* c) {
    TF_RETURN_IF_ERROR(detail::InferRoundingSeed(c));
    return packed ? detail::InferPackedGroupShapes<Rule>(c) : detail::InferGroupShapes<Rule>(c);
  });
  op.Doc(std::string("Fused dense ") + Rule::kOpName +
         (packed ? " update of the N variables of a member pack (their slots too) in one pass"
                 : " update of N resource variables in one pass (same dtype, shared "
                   "hyper-parameters)") +
         ". See fusedopt.ops for the Python wrapper.");
  op();
}

}  // namespace tf
}  // namespace fusedopt
