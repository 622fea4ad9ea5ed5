// The XLA op kernels of the resource ops and the group op: validation at compile time,
// then the custom call (XLA:CPU with the typed FFI) or the HLO lowering (xla_hlo.h).
#pragma once

#include "cc/tf/xla_hlo.h"

namespace fusedopt {
namespace tf {
namespace xla_impl {

namespace tfw = ::tensorflow;

// The attributes every XLA op kernel of a rule reads (the op kernels' UpdateAttrs), and
// where it compiles.
template <typename Rule>
struct RuleAttrs : UpdateAttrs<Rule> {
  explicit RuleAttrs(tfw::OpKernelConstruction* ctx)
      : on_cpu(ctx->device_type() == tfw::DeviceType(tfw::DEVICE_CPU_XLA_JIT)) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("T", &dtype));
    this->Read(ctx);
  }

  // The call's rounding salt (U32 scalar: CallSaltHlo of the op's seed; 0 without one).
  // Errors go to ctx (the caller checks ctx->status() before using the result).
  static xla::XlaOp CallSalt(tfw::XlaOpKernelContext* ctx) {
    std::vector<xla::XlaOp> seeds;
    std::vector<tfw::TensorShape> shapes;
    const absl::Status listed = ctx->InputList(kRoundingSeedInput, &seeds, &shapes);
    if (!listed.ok()) {
      ctx->SetStatus(listed);
    } else if (!seeds.empty() && shapes[0].dims() != 0) {
      ctx->SetStatus(absl::InvalidArgumentError("rounding_seed must be a scalar, got shape " +
                                                shapes[0].DebugString()));
    } else if (!seeds.empty()) {
      return CallSaltHlo(seeds[0]);
    }
    return U32Const(ctx->builder(), 0);
  }

  const bool on_cpu;  // compiling for XLA:CPU
  tfw::DataType dtype = tfw::DT_INVALID;
};

// ---------------------------------------------------------------------------------------
// The XLA op kernel.

template <typename Rule, bool kSparse>
class FusedApplyXlaOp : public tfw::XlaOpKernel {
  static constexpr int kSlots = NumSlots<Rule>();
  static constexpr int kHyper = NumHyper<Rule>();
  static constexpr int kGradInput = 1 + kSlots + kHyper;

 public:
  explicit FusedApplyXlaOp(tfw::OpKernelConstruction* ctx)
      : XlaOpKernel(ctx), attrs_(ctx) {
    if constexpr (kSparse) {
      bool every_row = false;
      OP_REQUIRES_OK(ctx, ctx->GetAttr(kEveryRowAttr, &every_row));
      OP_REQUIRES(ctx, !every_row,
                  absl::InvalidArgumentError(EveryRowRefused("in XLA-compiled code")));
    }
  }

  void Compile(tfw::XlaOpKernelContext* ctx) override {
    // The CPU kernel's checks in its order, at compile time: every variable initialized;
    // then for each in turn its dtype (var: T; slots: one storage dtype, T's or for a
    // float32 var bfloat16/half) and that it is none of the ones before it.
    std::array<tfw::DataType, 1 + kSlots> types;
    for (int i = 0; i <= kSlots; ++i) {
      tfw::TensorShape shape;
      OP_REQUIRES_OK(ctx, ctx->GetVariableTypeAndShape(i, &types[i], &shape));
    }
    for (int i = 0; i <= kSlots; ++i) {
      const std::string error =
          i == 0 ? VarDtypeError(attrs_.dtype, StateName(0), types[0])
                 : SlotDtypeError(attrs_.dtype, StateName(i), types[i], StateName(1), types[1]);
      OP_REQUIRES(ctx, error.empty(), absl::InvalidArgumentError(error));
      OP_REQUIRES_OK(ctx, CheckDistinctVariables(ctx, i + 1, StateName));
    }
    std::array<xla::XlaOp, 1 + kSlots> state;
    std::array<Shape, 1 + kSlots> shapes;
    for (int i = 0; i <= kSlots; ++i) {
      tfw::TensorShape shape;
      OP_REQUIRES_OK(ctx, ctx->ReadVariableInput(i, types[i], &shape, &state[i]));
      shapes[i] = ToShape(shape);
    }
    absl::Status type_status;
    const xla::PrimitiveType storage = PrimitiveTypeOf(attrs_.dtype, &type_status);
    const xla::PrimitiveType slot_storage =
        kSlots > 0 ? PrimitiveTypeOf(types[std::min(1, kSlots)], &type_status) : storage;
    OP_REQUIRES_OK(ctx, type_status);
    absl::Status status;
    std::array<Shape, kHyper> hyper_shapes;
    for (int i = 0; i < kHyper; ++i) hyper_shapes[i] = InputShape(ctx, 1 + kSlots + i, &status);
    const Shape grad_shape = InputShape(ctx, kGradInput, &status);
    const Shape indices_shape = kSparse ? InputShape(ctx, kGradInput + 1, &status) : Shape();
    OP_REQUIRES_OK(ctx, status);
    const std::string error =
        kSparse ? ValidateSparse<Rule>(shapes[0], &shapes[1], hyper_shapes.data(), grad_shape,
                                       indices_shape)
                : ValidateDense<Rule>(shapes[0], &shapes[1], hyper_shapes.data(), grad_shape);
    OP_REQUIRES(ctx, error.empty(), absl::InvalidArgumentError(error));

    std::array<xla::XlaOp, 1 + kSlots> updated;
    bool write = true;
    if (UseCustomCall(attrs_.on_cpu)) {
      CompileCustomCall(ctx, state, &updated);
    } else if constexpr (kSparse) {
      write = CompileHloSparse(ctx, state, storage, slot_storage, shapes[0], indices_shape[0],
                               &updated);
    } else {
      CompileHloDense(ctx, state, storage, slot_storage, &updated);
    }
    if (!ctx->status().ok() || !write) return;
    OP_REQUIRES_OK(ctx, ctx->builder()->first_error());
    for (int i = 0; i <= kSlots; ++i) {
      OP_REQUIRES_OK(ctx, ctx->AssignVariable(i, types[i], updated[i]));
    }
  }

 private:
  static const char* StateName(int64_t i) { return i == 0 ? "var" : Rule::kSlots[i - 1]; }

  // var's element type `storage`, the slots' `slot_storage`.
  void CompileHloDense(tfw::XlaOpKernelContext* ctx, const std::array<xla::XlaOp, 1 + kSlots>& state,
                       xla::PrimitiveType storage, xla::PrimitiveType slot_storage,
                       std::array<xla::XlaOp, 1 + kSlots>* updated) {
    xla::XlaBuilder* b = ctx->builder();
    const xla::PrimitiveType compute = ComputeTypeOf(storage);
    XlaValueScope scope(b, compute);
    const auto params = HloParams<Rule>(ctx, 1 + kSlots, compute, attrs_.options.data());
    std::array<xla::XlaOp, kSlots> slots;
    for (int k = 0; k < kSlots; ++k) slots[k] = xla::ConvertElementType(state[k + 1], compute);
    const HloState<Rule> out = HloUpdate<Rule>(
        params, xla::ConvertElementType(state[0], compute), slots,
        xla::ConvertElementType(ctx->Input(kGradInput), compute), storage, slot_storage,
        attrs_.stochastic, RuleAttrs<Rule>::CallSalt(ctx));
    (*updated)[0] = out.var;
    for (int k = 0; k < kSlots; ++k) (*updated)[k + 1] = out.slots[k];
  }

  // Returns false when there is nothing to write (no ids, or rows of no elements).
  bool CompileHloSparse(tfw::XlaOpKernelContext* ctx,
                        const std::array<xla::XlaOp, 1 + kSlots>& state,
                        xla::PrimitiveType storage, xla::PrimitiveType slot_storage,
                        const Shape& var_shape, int64_t n,
                        std::array<xla::XlaOp, 1 + kSlots>* updated) {
    xla::XlaBuilder* b = ctx->builder();
    const xla::PrimitiveType compute = ComputeTypeOf(storage);
    const int64_t num_rows = var_shape[0];
    int64_t row_size = 1;
    for (size_t d = 1; d < var_shape.size(); ++d) row_size *= var_shape[d];
    if (n == 0 || row_size == 0) return false;  // nothing named, or nothing in a row
    const int64_t rank = static_cast<int64_t>(var_shape.size());
    auto c = [b](int64_t v) { return xla::ConstantR0<int64_t>(b, v); };

    // 1. Ids sorted stably with their positions: each row's positions ascend.
    const xla::XlaOp ids = xla::ConvertElementType(ctx->Input(kGradInput + 1), xla::S64);
    const xla::XlaOp all_in_range =
        xla::ReduceAll(xla::And(xla::Ge(ids, c(0)), xla::Lt(ids, c(num_rows))),
                       xla::ConstantR0<bool>(b, true), xla::CreateScalarAndComputation(xla::PRED, b));
    const xla::XlaOp iota = xla::Iota(b, xla::S64, n);
    const xla::XlaOp sorted = xla::Sort({ids, iota},
                                        xla::CreateScalarLtComputation({xla::S64, xla::S64}, b),
                                        0, /*is_stable=*/true);
    const xla::XlaOp rows = xla::GetTupleElement(sorted, 0);
    const xla::XlaOp positions = xla::GetTupleElement(sorted, 1);

    // 2. Runs of equal ids: start, count; each run's slot in the sum buffers is its start.
    const xla::XlaOp next_differs = xla::ConcatInDim(
        b, {xla::Ne(xla::SliceInDim(rows, 0, n - 1, 1, 0), xla::SliceInDim(rows, 1, n, 1, 0)),
            xla::ConstantR1<bool>(b, {true})}, 0);
    const xla::XlaOp head = xla::ConcatInDim(
        b, {xla::ConstantR1<bool>(b, {true}), xla::SliceInDim(next_differs, 0, n - 1, 1, 0)}, 0);
    const xla::XlaOp start = Scan(xla::Select(head, iota, xla::Broadcast(c(0), {n})), n, true, b);
    const xla::XlaOp last =
        Scan(xla::Select(next_differs, iota, xla::Broadcast(c(n - 1), {n})), n, false, b);
    const xla::XlaOp count = xla::Add(xla::Sub(last, start), c(1));

    // 3. Sums in sum_order.h's order: chunks (left to right, by the scatter's order), then
    //    the chunks of a run (left to right). -0.0 is the exact identity of addition.
    const xla::XlaOp length = ChunkLength(count, n, b);
    const xla::XlaOp chunk_slot = xla::Add(start, xla::Div(xla::Sub(iota, start), length));
    const xla::XlaOp chunks = xla::Div(xla::Sub(xla::Add(count, length), c(1)), length);
    const xla::XlaOp is_chunk = xla::Lt(xla::Sub(iota, start), chunks);
    const xla::XlaOp run_slot = xla::Select(is_chunk, start, xla::Broadcast(c(n), {n}));
    std::vector<int64_t> batch_dims(var_shape.begin(), var_shape.end());
    batch_dims[0] = n;
    const xla::XlaOp minus_zero =
        xla::Broadcast(xla::ConstantR0WithType(b, compute, -0.0), batch_dims);
    const xla::XlaComputation add = xla::CreateScalarAddComputation(compute, b);
    const xla::XlaOp grad_rows =
        xla::ConvertElementType(GatherRows(ctx->Input(kGradInput), positions), compute);
    const xla::XlaOp partials = ScatterRows(minus_zero, chunk_slot, grad_rows, add, n, rank);
    const xla::XlaOp sums = ScatterRows(minus_zero, run_slot, partials, add, n, rank);

    // 4. Each run's row updated once; any out-of-range id anywhere: no row written.
    XlaValueScope scope(b, compute);
    const auto params = HloParams<Rule>(ctx, 1 + kSlots, compute, attrs_.options.data());
    std::array<xla::XlaOp, kSlots> slot_rows;
    for (int k = 0; k < kSlots; ++k) {
      slot_rows[k] = xla::ConvertElementType(GatherRows(state[k + 1], rows), compute);
    }
    const HloState<Rule> out = HloUpdate<Rule>(
        params, xla::ConvertElementType(GatherRows(state[0], rows), compute), slot_rows, sums,
        storage, slot_storage, attrs_.stochastic, RuleAttrs<Rule>::CallSalt(ctx));
    const xla::XlaOp write_row = xla::Select(xla::And(head, xla::Broadcast(all_in_range, {n})),
                                             rows, xla::Broadcast(c(num_rows), {n}));
    const xla::XlaComputation replace = ReplaceComputation(b, storage);
    const xla::XlaComputation replace_slot = ReplaceComputation(b, slot_storage);
    (*updated)[0] = ScatterRows(state[0], write_row, out.var, replace, n, rank);
    for (int k = 0; k < kSlots; ++k) {
      (*updated)[k + 1] = ScatterRows(state[k + 1], write_row, out.slots[k], replace_slot, n,
                                      IsPerRowSlot<Rule>(k) ? 1 : rank);
    }
    return true;
  }

  void CompileCustomCall(tfw::XlaOpKernelContext* ctx,
                         const std::array<xla::XlaOp, 1 + kSlots>& state,
                         std::array<xla::XlaOp, 1 + kSlots>* updated) {
    xla::XlaBuilder* b = ctx->builder();
    std::vector<xla::XlaOp> operands(state.begin(), state.end());
    for (int i = 0; i < kHyper; ++i) operands.push_back(ctx->Input(1 + kSlots + i));
    operands.push_back(ctx->Input(kGradInput));
    if (kSparse) operands.push_back(ctx->Input(kGradInput + 1));
    operands.push_back(
        xla::ConstantR1<uint8_t>(b, OptionBytes<Rule>(attrs_.options.data(), attrs_.stochastic)));
    operands.push_back(RuleAttrs<Rule>::CallSalt(ctx));
    std::vector<xla::Shape> shapes;
    std::vector<std::pair<xla::ShapeIndex, std::pair<int64_t, xla::ShapeIndex>>> aliasing;
    for (int i = 0; i <= kSlots; ++i) {
      auto shape = b->GetShape(state[i]);
      OP_REQUIRES_OK(ctx, shape.status());
      shapes.push_back(*shape);
      // Output i is operand i: XLA updates the variable's own buffer, no copy of the table.
      aliasing.push_back({xla::ShapeIndex{i}, {i, xla::ShapeIndex{}}});
    }
    const xla::XlaOp call = xla::CustomCall(
        b, CustomCallTarget(PyName<Rule>(), kSparse), operands, xla::ShapeUtil::MakeTupleShape(shapes),
        /*opaque=*/"", /*has_side_effect=*/true, aliasing, /*literal=*/nullptr,
        xla::CustomCallSchedule::SCHEDULE_NONE, xla::CustomCallApiVersion::API_VERSION_TYPED_FFI);
    for (int i = 0; i <= kSlots; ++i) (*updated)[i] = xla::GetTupleElement(call, i);
  }

  const RuleAttrs<Rule> attrs_;
};

// FusedOpt>ResourceGroupApply<Rule>: N dense updates sharing the hyper-parameters. On
// XLA:CPU one custom call over every buffer (the engine's one pass over the group); in
// HLO each variable's update, which XLA fuses as it likes.
template <typename Rule>
class FusedGroupApplyXlaOp : public tfw::XlaOpKernel {
  static constexpr int kSlots = NumSlots<Rule>();
  static constexpr int kHyper = NumHyper<Rule>();

 public:
  explicit FusedGroupApplyXlaOp(tfw::OpKernelConstruction* ctx)
      : XlaOpKernel(ctx), attrs_(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &n_));
  }

  void Compile(tfw::XlaOpKernelContext* ctx) override {
    const int64_t num_state = (1 + kSlots) * n_;
    const int64_t first_hyper = num_state, first_grad = num_state + kHyper;
    absl::Status status;
    for (int i = 0; i < kHyper; ++i) {
      const Shape shape = InputShape(ctx, first_hyper + i, &status);
      OP_REQUIRES_OK(ctx, status);
      OP_REQUIRES(ctx, shape.empty(),
                  absl::InvalidArgumentError(std::string(Rule::kHyper[i]) +
                                             " must be a scalar, got shape " + ShapeString(shape)));
    }
    OP_REQUIRES_OK(ctx, CheckDistinctVariables(ctx, num_state,
                                               [this](int64_t j) { return StateName(j); }));
    // The CPU kernel's checks in its order: the group's slot dtype (slot 0 of variable 0)
    // allowed for T, then member by member every dtype (var: T; slots: that one) and the
    // shapes.
    std::vector<tfw::DataType> types(num_state);
    std::vector<Shape> shapes(num_state);
    for (int64_t j = 0; j < num_state; ++j) {
      tfw::TensorShape shape;
      OP_REQUIRES_OK(ctx, ctx->GetVariableTypeAndShape(j, &types[j], &shape));
      shapes[j] = ToShape(shape);
    }
    const tfw::DataType slot_dtype = kSlots > 0 && n_ > 0 ? types[n_] : attrs_.dtype;
    if (kSlots > 0 && n_ > 0) {
      const std::string error =
          SlotDtypeError(attrs_.dtype, StateName(n_), slot_dtype, StateName(n_), slot_dtype);
      OP_REQUIRES(ctx, error.empty(), absl::InvalidArgumentError(error));
    }
    const Shape scalars[kHyper > 0 ? kHyper : 1];
    for (int64_t v = 0; v < n_; ++v) {
      for (int k = 0; k <= kSlots; ++k) {
        const int64_t j = k * n_ + v;
        const std::string error =
            k == 0
                ? VarDtypeError(attrs_.dtype, StateName(j), types[j])
                : SlotDtypeError(attrs_.dtype, StateName(j), types[j], StateName(n_), slot_dtype);
        OP_REQUIRES(ctx, error.empty(), absl::InvalidArgumentError(error));
      }
      std::array<Shape, kSlots> slots;
      for (int k = 0; k < kSlots; ++k) slots[k] = shapes[(k + 1) * n_ + v];
      const Shape grad = InputShape(ctx, first_grad + v, &status);
      OP_REQUIRES_OK(ctx, status);
      const std::string error = ValidateDense<Rule>(shapes[v], slots.data(), scalars, grad);
      OP_REQUIRES(ctx, error.empty(), absl::InvalidArgumentError(GroupMemberError(v, n_, error)));
    }
    std::vector<xla::XlaOp> state(num_state);
    for (int64_t j = 0; j < num_state; ++j) {
      tfw::TensorShape shape;
      OP_REQUIRES_OK(ctx, ctx->ReadVariableInput(j, types[j], &shape, &state[j]));
    }
    xla::XlaBuilder* b = ctx->builder();
    std::vector<xla::XlaOp> updated(num_state);
    if (UseCustomCall(attrs_.on_cpu)) {
      std::vector<xla::XlaOp> operands(state);
      for (int i = 0; i < kHyper; ++i) operands.push_back(ctx->Input(first_hyper + i));
      for (int64_t v = 0; v < n_; ++v) operands.push_back(ctx->Input(first_grad + v));
      operands.push_back(
          xla::ConstantR1<uint8_t>(b, OptionBytes<Rule>(attrs_.options.data(), attrs_.stochastic)));
      operands.push_back(RuleAttrs<Rule>::CallSalt(ctx));
      std::vector<xla::Shape> out_shapes;
      std::vector<std::pair<xla::ShapeIndex, std::pair<int64_t, xla::ShapeIndex>>> aliasing;
      for (int64_t j = 0; j < num_state; ++j) {
        auto shape = b->GetShape(state[j]);
        OP_REQUIRES_OK(ctx, shape.status());
        out_shapes.push_back(*shape);
        aliasing.push_back({xla::ShapeIndex{j}, {j, xla::ShapeIndex{}}});
      }
      const xla::XlaOp call = xla::CustomCall(
          b, GroupCustomCallTarget(PyName<Rule>()), operands,
          xla::ShapeUtil::MakeTupleShape(out_shapes), /*opaque=*/"", /*has_side_effect=*/true,
          aliasing, /*literal=*/nullptr, xla::CustomCallSchedule::SCHEDULE_NONE,
          xla::CustomCallApiVersion::API_VERSION_TYPED_FFI);
      for (int64_t j = 0; j < num_state; ++j) updated[j] = xla::GetTupleElement(call, j);
    } else {
      absl::Status type_status;
      const xla::PrimitiveType storage = PrimitiveTypeOf(attrs_.dtype, &type_status);
      const xla::PrimitiveType slot_storage = PrimitiveTypeOf(slot_dtype, &type_status);
      OP_REQUIRES_OK(ctx, type_status);
      const xla::PrimitiveType compute = ComputeTypeOf(storage);
      XlaValueScope scope(b, compute);
      const auto params = HloParams<Rule>(ctx, first_hyper, compute, attrs_.options.data());
      const xla::XlaOp call_salt = RuleAttrs<Rule>::CallSalt(ctx);
      for (int64_t v = 0; v < n_; ++v) {
        std::array<xla::XlaOp, kSlots> slots;
        for (int k = 0; k < kSlots; ++k) {
          slots[k] = xla::ConvertElementType(state[(k + 1) * n_ + v], compute);
        }
        const HloState<Rule> out = HloUpdate<Rule>(
            params, xla::ConvertElementType(state[v], compute), slots,
            xla::ConvertElementType(ctx->Input(first_grad + v), compute), storage, slot_storage,
            attrs_.stochastic, call_salt);
        updated[v] = out.var;
        for (int k = 0; k < kSlots; ++k) updated[(k + 1) * n_ + v] = out.slots[k];
      }
    }
    if (!ctx->status().ok()) return;
    OP_REQUIRES_OK(ctx, b->first_error());
    for (int64_t j = 0; j < num_state; ++j) {
      OP_REQUIRES_OK(ctx, ctx->AssignVariable(j, types[j], updated[j]));
    }
  }

 private:
  // "var[3]", "m[0]": state input j of the group.
  std::string StateName(int64_t j) const {
    const int64_t k = j / n_;
    return std::string(k == 0 ? "var" : Rule::kSlots[k - 1]) + "[" + std::to_string(j % n_) + "]";
  }

  const RuleAttrs<Rule> attrs_;
  int64_t n_ = 0;
};

}  // namespace xla_impl
}  // namespace tf
}  // namespace fusedopt
