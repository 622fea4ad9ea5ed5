// The HLO lowering of a rule (XLA:GPU; TF 2.15; FUSEDOPT_XLA_LOWERING=hlo): the rule's own
// Prepare()/Update() on XlaValue (xla_value.h), and the row gather/scatter, scans and chunk
// lengths of the sparse form.
#ifndef FUSEDOPT_CC_TF_XLA_HLO_H_
#define FUSEDOPT_CC_TF_XLA_HLO_H_

#include "cc/tf/xla_common.h"

namespace fusedopt {
namespace tf {
namespace xla_impl {

namespace tfw = ::tensorflow;

// ---------------------------------------------------------------------------------------
// HLO lowering.

// Rows `rows` ([n], any integer type) of `table` ([R, ...]): [n, ...]. XLA clamps
// out-of-range rows, so reads are always safe.
inline xla::XlaOp GatherRows(xla::XlaOp table, xla::XlaOp rows) {
  return xla::TorchIndexSelect(table, rows, 0);
}

// Writes (or, with `combiner`, accumulates) updates[k] into row rows[k] of `operand`,
// k = 0, 1, ... in order; a row index outside the operand drops that update.
inline xla::XlaOp ScatterRows(xla::XlaOp operand, xla::XlaOp rows, xla::XlaOp updates,
                       const xla::XlaComputation& combiner, int64_t n, int64_t rank) {
  xla::ScatterDimensionNumbers dims;
  for (int64_t d = 1; d < rank; ++d) dims.add_update_window_dims(d);
  dims.add_inserted_window_dims(0);
  dims.add_scatter_dims_to_operand_dims(0);
  dims.set_index_vector_dim(1);
  return xla::Scatter(operand, xla::Reshape(rows, {n, 1}), updates, combiner, dims);
}

inline xla::XlaComputation ReplaceComputation(xla::XlaBuilder* parent, xla::PrimitiveType type) {
  auto b = parent->CreateSubBuilder("replace");
  const xla::Shape scalar = xla::ShapeUtil::MakeShape(type, {});
  xla::Parameter(b.get(), 0, scalar, "old");
  xla::Parameter(b.get(), 1, scalar, "new");  // the last instruction is the root
  return b->BuildAndNoteError();
}

// Running max (forward) or min (backward) along an S64 vector of n: ceil(log2 n) passes,
// each combining every element with the one `shift` away (doubling). Not a ReduceWindow of
// the whole length: XLA:CPU runs that in O(n^2) (200K ids: minutes per call).
inline xla::XlaOp Scan(xla::XlaOp x, int64_t n, bool forward_max, xla::XlaBuilder* b) {
  const xla::XlaOp identity =
      xla::ConstantR0<int64_t>(b, forward_max ? std::numeric_limits<int64_t>::min()
                                              : std::numeric_limits<int64_t>::max());
  for (int64_t shift = 1; shift < n; shift *= 2) {
    const xla::XlaOp fill = xla::Broadcast(identity, {shift});
    const xla::XlaOp shifted =
        forward_max ? xla::ConcatInDim(b, {fill, xla::SliceInDim(x, 0, n - shift, 1, 0)}, 0)
                    : xla::ConcatInDim(b, {xla::SliceInDim(x, shift, n, 1, 0), fill}, 0);
    x = forward_max ? xla::Max(x, shifted) : xla::Min(x, shifted);
  }
  return x;
}

// DuplicateChunkLength element-wise on S64 counts [n]: 32 up to 1024, else ceil(sqrt(count)).
inline xla::XlaOp ChunkLength(xla::XlaOp count, int64_t n, xla::XlaBuilder* b) {
  auto c = [b](int64_t v) { return xla::ConstantR0<int64_t>(b, v); };
  xla::XlaOp root = xla::ConvertElementType(
      xla::Floor(xla::Sqrt(xla::ConvertElementType(count, xla::F64))), xla::S64);
  // Exactly ceil(sqrt): correct the estimate up, then down.
  root = xla::Select(xla::Lt(xla::Mul(root, root), count), xla::Add(root, c(1)), root);
  const xla::XlaOp below = xla::Sub(root, c(1));
  root = xla::Select(xla::Ge(xla::Mul(below, below), count), below, root);
  return xla::Select(xla::Le(count, c(kSerialSumLength * kSerialSumLength)),
                     xla::Broadcast(c(kSerialSumLength), {n}), root);
}

// The row sums of term ([rows, row_size], compute type) in row_sum.h's order: 32 lanes
// summed block by block left to right (the last block padded with +0), then folded in
// halves. A fixed sequence of slices and adds, never a Reduce (whose order XLA leaves open).
inline xla::XlaOp RowSumHlo(xla::XlaOp term, int64_t rows, int64_t row_size,
                            xla::PrimitiveType compute, xla::XlaBuilder* b) {
  const int64_t lanes = kRowSumLanes, blocks = (row_size + lanes - 1) / lanes;
  xla::PaddingConfig padding = xla::MakeNoPaddingConfig(2);
  padding.mutable_dimensions(1)->set_edge_padding_high(blocks * lanes - row_size);
  const xla::XlaOp x = xla::Reshape(
      xla::Pad(term, xla::ConstantR0WithType(b, compute, 0.0), padding), {rows, blocks, lanes});
  auto block = [&](int64_t j) { return xla::Reshape(xla::SliceInDim(x, j, j + 1, 1, 1), {rows, lanes}); };
  xla::XlaOp sum = block(0);
  for (int64_t j = 1; j < blocks; ++j) sum = xla::Add(sum, block(j));
  for (int64_t w = lanes / 2; w > 0; w /= 2) {
    sum = xla::Add(xla::SliceInDim(sum, 0, w, 1, 1), xla::SliceInDim(sum, w, 2 * w, 1, 1));
  }
  return xla::Reshape(sum, {rows});
}

template <typename Rule>
struct HloState {
  xla::XlaOp var;
  std::array<xla::XlaOp, NumSlots<Rule>()> slots;
};

template <typename Rule>
typename Rule::template Params<XlaValue> HloParams(tfw::XlaOpKernelContext* ctx, int first_hyper,
                                                   xla::PrimitiveType compute,
                                                   const bool* options) {
  std::array<XlaValue, NumHyper<Rule>()> hyper;
  for (int i = 0; i < NumHyper<Rule>(); ++i) {
    hyper[i] = xla::ConvertElementType(ctx->Input(first_hyper + i), compute);
  }
  return Rule::template Prepare<XlaValue>(hyper.data(), options);
}

// Update() over whole arrays (already in the compute type), results in `storage`. var and
// grad are [rows, ...] (or a scalar: one row), per-element slots the same, per-row slots
// [rows] ([]); with a per-row phase, UpdateRow() on the row sums first, its results
// broadcast along the rows.
template <typename Rule>
HloState<Rule> HloUpdate(const typename Rule::template Params<XlaValue>& params, xla::XlaOp var,
                         const std::array<xla::XlaOp, NumSlots<Rule>()>& slots, xla::XlaOp grad,
                         xla::PrimitiveType storage) {
  XlaValue v = var;
  XlaValue s[NumSlots<Rule>()];
  for (int k = 0; k < NumSlots<Rule>(); ++k) s[k] = slots[k];
  if constexpr (HasRowPhase<Rule>()) {
    xla::XlaBuilder* b = var.builder();
    const auto shape = b->GetShape(var);
    if (!shape.ok()) {
      b->ReportError(shape.status());
      return {};
    }
    const std::vector<int64_t> dims(shape->dimensions().begin(), shape->dimensions().end());
    const int64_t rows = dims.empty() ? 1 : dims[0];
    int64_t row_size = 1;
    for (size_t d = 1; d < dims.size(); ++d) row_size *= dims[d];
    const xla::PrimitiveType compute = shape->element_type();
    XlaValue row_slots[NumSlots<Rule>()];
    for (int k = 0; k < NumSlots<Rule>(); ++k) {
      if (IsPerRowSlot<Rule>(k)) row_slots[k] = xla::Reshape(slots[k], {rows});
    }
    XlaValue row;
    if (rows * row_size > 0) {  // rows of no elements: nothing to update (as on the CPU)
      const xla::XlaOp term = xla::Reshape(Rule::RowTerm(XlaValue(grad)).op(), {rows, row_size});
      row = Rule::UpdateRow(params, row_slots, XlaValue(RowSumHlo(term, rows, row_size, compute, b)),
                            XlaValue(static_cast<double>(row_size)));
    } else {
      row = xla::Broadcast(xla::ConstantR0WithType(b, compute, 0.0), {rows});
    }
    const std::vector<int64_t> slot_dims = dims.empty() ? std::vector<int64_t>{}
                                                        : std::vector<int64_t>{rows};
    auto along_rows = [&](xla::XlaOp r) {
      return dims.empty() ? xla::Reshape(r, {}) : xla::BroadcastInDim(r, dims, {0});
    };
    for (int k = 0; k < NumSlots<Rule>(); ++k) {
      if (IsPerRowSlot<Rule>(k)) s[k] = along_rows(row_slots[k].op());
    }
    Rule::Update(params, v, s, XlaValue(grad), XlaValue(along_rows(row.op())));
    for (int k = 0; k < NumSlots<Rule>(); ++k) {
      if (IsPerRowSlot<Rule>(k)) s[k] = xla::Reshape(row_slots[k].op(), slot_dims);
    }
  } else {
    Rule::Update(params, v, s, XlaValue(grad));
  }
  HloState<Rule> out;
  out.var = xla::ConvertElementType(v.op(), storage);
  for (int k = 0; k < NumSlots<Rule>(); ++k) out.slots[k] = xla::ConvertElementType(s[k].op(), storage);
  return out;
}

}  // namespace xla_impl
}  // namespace tf
}  // namespace fusedopt

#endif  // FUSEDOPT_CC_TF_XLA_HLO_H_
