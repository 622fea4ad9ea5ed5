// The HLO lowering of a rule (XLA:GPU; TF 2.15; FUSEDOPT_XLA_LOWERING=hlo): the rule's own
// Prepare()/Update() on XlaValue (xla_value.h), and the row gather/scatter, scans and chunk
// lengths of the sparse form.
#pragma once

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

// ---------------------------------------------------------------------------------------
// Slot stores (numeric.h): to nearest even (XLA's conversion) or, stochastic_rounding of a
// 16-bit slot, numeric.h's StoreSlot<true> in U32 bit operations, so that every element
// gets the CPU engine's bits: the same hash of the value and the salt, the same add and
// truncation, the same Inf/NaN and (half) out-of-range fallbacks to nearest.

inline bool IsCompactType(xla::PrimitiveType type) {
  return type == xla::BF16 || type == xla::F16;
}

inline xla::XlaOp U32Const(xla::XlaBuilder* b, uint32_t v) {
  return xla::ConstantR0<uint32_t>(b, v);
}

// numeric.h MixBits on U32 (XLA's U32 arithmetic wraps, as uint32_t's does).
inline xla::XlaOp MixBitsHlo(xla::XlaOp x) {
  xla::XlaBuilder* b = x.builder();
  x = xla::Xor(x, xla::ShiftRightLogical(x, U32Const(b, 16)));
  x = xla::Mul(x, U32Const(b, 0x85ebca6bu));
  x = xla::Xor(x, xla::ShiftRightLogical(x, U32Const(b, 13)));
  x = xla::Mul(x, U32Const(b, 0xc2b2ae35u));
  return xla::Xor(x, xla::ShiftRightLogical(x, U32Const(b, 16)));
}

// numeric.h CallSalt of an S64 scalar seed: U32.
inline xla::XlaOp CallSaltHlo(xla::XlaOp seed) {
  xla::XlaBuilder* b = seed.builder();
  const xla::XlaOp u = xla::BitcastConvertType(seed, xla::U64);
  const xla::XlaOp low =
      xla::ConvertElementType(xla::And(u, xla::ConstantR0<uint64_t>(b, 0xffffffffu)), xla::U32);
  const xla::XlaOp high =
      xla::ConvertElementType(xla::ShiftRightLogical(u, xla::ConstantR0<uint64_t>(b, 32)), xla::U32);
  return MixBitsHlo(xla::Xor(low, MixBitsHlo(xla::Add(high, U32Const(b, 0x9e3779b9u)))));
}

// numeric.h RoundingNoise: `bits` the stored value's float bits, `salt_bits` U32 of its shape.
inline xla::XlaOp RoundingNoiseHlo(xla::XlaOp bits, xla::XlaOp salt_bits, int slot) {
  xla::XlaBuilder* b = bits.builder();
  const uint32_t step = 0x9e3779b9u * static_cast<uint32_t>(slot + 1);
  return MixBitsHlo(xla::Xor(bits, MixBitsHlo(xla::Add(salt_bits, U32Const(b, step)))));
}

// numeric.h ToBfloat16Stochastic on the float bits u: bfloat16 bits in U32.
inline xla::XlaOp Bfloat16StochasticBits(xla::XlaOp u, xla::XlaOp noise) {
  xla::XlaBuilder* b = u.builder();
  const xla::XlaOp high = xla::ShiftRightLogical(u, U32Const(b, 16));
  // Inf and NaN as ToBfloat16: Inf's dropped bits are 0; NaN stays a quiet NaN, sign kept.
  const xla::XlaOp exponent = U32Const(b, 0x7f800000u);
  const xla::XlaOp special = xla::Eq(xla::And(u, exponent), exponent);
  const xla::XlaOp nan = xla::Gt(xla::And(u, U32Const(b, 0x7fffffffu)), exponent);
  const xla::XlaOp nearest = xla::Select(nan, xla::Or(high, U32Const(b, 0x0040u)), high);
  const xla::XlaOp rounded = xla::ShiftRightLogical(
      xla::Add(u, xla::And(noise, U32Const(b, 0xffffu))), U32Const(b, 16));
  return xla::Select(special, nearest, rounded);
}

// numeric.h ToHalfStochastic on the float bits u: half bits in U32. Outside half's normal
// range, ToHalf's own steps (overflow to Inf, NaN to 0x7e00, below the normal range one
// float add of 0.5 rounding the subnormal).
inline xla::XlaOp HalfStochasticBits(xla::XlaOp u, xla::XlaOp noise) {
  xla::XlaBuilder* b = u.builder();
  const xla::XlaOp magnitude = xla::And(u, U32Const(b, 0x7fffffffu));
  const xla::XlaOp sign =
      xla::And(xla::ShiftRightLogical(u, U32Const(b, 16)), U32Const(b, 0x8000u));
  const xla::XlaOp below = xla::Lt(magnitude, U32Const(b, 113u << 23));
  const xla::XlaOp above = xla::Ge(magnitude, U32Const(b, 143u << 23));
  const xla::XlaOp rebiased = xla::Add(magnitude, U32Const(b, (15u - 127u) << 23));  // wraps
  const xla::XlaOp rounded = xla::ShiftRightLogical(
      xla::Add(rebiased, xla::And(noise, U32Const(b, 0x1fffu))), U32Const(b, 13));
  const xla::XlaOp overflow = xla::Select(xla::Gt(magnitude, U32Const(b, 255u << 23)),
                                          U32Const(b, 0x7e00u), U32Const(b, 0x7c00u));
  const uint32_t magic = ((127u - 15u) + (23u - 10u) + 1u) << 23;  // 0.5f
  const xla::XlaOp sum = xla::Add(xla::BitcastConvertType(magnitude, xla::F32),
                                  xla::BitcastConvertType(U32Const(b, magic), xla::F32));
  const xla::XlaOp subnormal =
      xla::Sub(xla::BitcastConvertType(sum, xla::U32), U32Const(b, magic));
  const xla::XlaOp out = xla::Select(below, subnormal, xla::Select(above, overflow, rounded));
  return xla::Or(out, sign);
}

// A slot value x (F32, or F64 for a double var) stored as `storage`: to nearest even, or
// (stochastic, 16-bit storage) stochastically with the noise of slot number `slot` and
// `salt_bits` (U32 of x's shape: the bits of the var element before the update).
inline xla::XlaOp StoreSlotHlo(xla::XlaOp x, xla::PrimitiveType storage, bool stochastic,
                               xla::XlaOp salt_bits, int slot) {
  if (!stochastic || !IsCompactType(storage)) return xla::ConvertElementType(x, storage);
  const xla::XlaOp u = xla::BitcastConvertType(x, xla::U32);
  const xla::XlaOp noise = RoundingNoiseHlo(u, salt_bits, slot);
  const xla::XlaOp bits = storage == xla::BF16 ? Bfloat16StochasticBits(u, noise)
                                               : HalfStochasticBits(u, noise);
  return xla::BitcastConvertType(xla::ConvertElementType(bits, xla::U16), storage);
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

// Update() over whole arrays (already in the compute type), results in `storage` (var) and
// `slot_storage` (the slots: StoreSlotHlo, stochastically where asked). var and
// grad are [rows, ...] (or a scalar: one row), per-element slots the same, per-row slots
// [rows] ([]); with a per-row phase, UpdateRow() on the row sums first, its results
// broadcast along the rows. The salt of stochastic rounding is var's element before the
// update (a per-row slot: the row's first element; 0 for rows of no elements), each with
// the call's salt `call_salt` (U32 scalar: CallSaltHlo of the seed), as on the CPU.
template <typename Rule>
HloState<Rule> HloUpdate(const typename Rule::template Params<XlaValue>& params, xla::XlaOp var,
                         const std::array<xla::XlaOp, NumSlots<Rule>()>& slots, xla::XlaOp grad,
                         xla::PrimitiveType storage, xla::PrimitiveType slot_storage,
                         bool stochastic, xla::XlaOp call_salt) {
  stochastic = stochastic && IsCompactType(slot_storage);
  xla::XlaOp salt, row_salt;  // U32, with stochastic only
  if (stochastic) salt = xla::Xor(xla::BitcastConvertType(var, xla::U32), call_salt);
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
    if (stochastic && rows * row_size > 0) {  // each row's first element
      row_salt = xla::Reshape(
          xla::SliceInDim(xla::Reshape(salt, {rows, row_size}), 0, 1, 1, 1), slot_dims);
    } else if (stochastic) {
      row_salt = xla::Broadcast(call_salt, slot_dims);
    }
  } else {
    Rule::Update(params, v, s, XlaValue(grad));
  }
  HloState<Rule> out;
  out.var = xla::ConvertElementType(v.op(), storage);
  for (int k = 0; k < NumSlots<Rule>(); ++k) {
    out.slots[k] = StoreSlotHlo(s[k].op(), slot_storage, stochastic,
                                IsPerRowSlot<Rule>(k) ? row_salt : salt, k);
  }
  return out;
}

}  // namespace xla_impl
}  // namespace tf
}  // namespace fusedopt
