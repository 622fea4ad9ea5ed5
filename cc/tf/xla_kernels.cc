// XLA kernels for every rule's resource ops, so the ops work inside jit_compile (Keras 3
// compiles `fit` with XLA by default on GPU machines) and touch only the named rows.
//
// Two lowerings of the same rule:
//   * XLA:CPU (TF >= 2.16, typed FFI): a custom call into the CPU engine itself, updating
//     var and slots in place (output-operand aliasing onto the variables' buffers), on
//     XLA's intra-op thread pool. Same kernel, same numbers, same errors: a bad index is an
//     InvalidArgumentError at run time with nothing written.
//   * Elsewhere (XLA:GPU; TF 2.15; FUSEDOPT_XLA_LOWERING=hlo): HLO built from the rule's own
//     Prepare()/Update() on XlaValue (xla_value.h). Sparse calls sort the ids, sum each row's
//     gradients in the order of cc/core/sum_order.h (scatter-adds in position order), gather
//     the touched rows, update them and scatter them back: static shapes of the batch, never
//     of the table. XLA cannot raise at run time, so a call with any out-of-range id writes
//     nothing at all (all or nothing) and raises nothing.
// Ref-variable ops have no XLA kernels: XLA compiles resource variables only.
//
// XLA builds its JIT kernel list once, at the process's first XLA compilation; a library
// loaded after that registers its JIT kernels itself (RegisterLateJitKernels below).
#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cc/core/engine.h"
#include "cc/core/rules/all_rules.h"
#include "cc/core/sum_order.h"
#include "cc/core/validate.h"
#include "cc/tf/op_defs.h"
#include "cc/tf/xla_value.h"
#include "tensorflow/compiler/tf2xla/type_util.h"
#include "tensorflow/compiler/tf2xla/xla_op_kernel.h"
#include "tensorflow/compiler/tf2xla/xla_op_registry.h"
#include "tensorflow/core/framework/kernel_def_builder.h"
#include "tensorflow/core/framework/op_kernel.h"
#if __has_include("xla/hlo/builder/lib/slicing.h")
#include "xla/hlo/builder/lib/arithmetic.h"
#include "xla/hlo/builder/lib/comparators.h"
#include "xla/hlo/builder/lib/slicing.h"
#else  // TF 2.15
#include "xla/client/lib/arithmetic.h"
#include "xla/client/lib/comparators.h"
#include "xla/client/lib/slicing.h"
#endif
// GCC 12 reports absl::InlinedVector (inside xla::ShapeIndex) as maybe-uninitialized: a known
// false positive in absl's code, not ours.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#if __has_include("xla/ffi/api/ffi.h")
#define FUSEDOPT_XLA_FFI 1
#include "xla/ffi/api/ffi.h"
namespace xla::ffi {
const XLA_FFI_Api* GetXlaFfiApi();  // exported by libtensorflow_cc (its header needs MLIR's)
}  // namespace xla::ffi
#endif

namespace fusedopt {
namespace tf {
namespace {

namespace tfw = ::tensorflow;

// ---------------------------------------------------------------------------------------
// Shared by both lowerings.

Shape ToShape(const tfw::TensorShape& s) {
  Shape out(s.dims());
  for (int i = 0; i < s.dims(); ++i) out[i] = s.dim_size(i);
  return out;
}

xla::PrimitiveType ComputeTypeOf(xla::PrimitiveType storage) {
  return storage == xla::F64 ? xla::F64 : xla::F32;  // half/bfloat16 compute in float32
}

std::string CustomCallTarget(const char* rule, bool sparse) {
  return std::string("fusedopt_") + rule + (sparse ? "_sparse" : "_dense");
}

std::string GroupCustomCallTarget(const char* rule) {
  return std::string("fusedopt_") + rule + "_group";
}

// The custom call needs XLA:CPU's typed FFI; FUSEDOPT_XLA_LOWERING=hlo picks the HLO
// lowering there too (tests compare the two). Read when a step compiles.
bool UseCustomCall(bool on_cpu) {
#ifdef FUSEDOPT_XLA_FFI
  const char* forced = std::getenv("FUSEDOPT_XLA_LOWERING");
  if (forced != nullptr && std::string(forced) == "hlo") return false;
  return on_cpu;
#else
  (void)on_cpu;
  return false;
#endif
}

// A (static) input shape: TF's InputShape, without its deprecation.
Shape InputShape(tfw::XlaOpKernelContext* ctx, int input, absl::Status* status) {
  const absl::StatusOr<xla::Shape> shape = ctx->InputXlaShape(input);
  if (!shape.ok()) {
    *status = shape.status();
    return {};
  }
  return Shape(shape->dimensions().begin(), shape->dimensions().end());
}

// XLA resolves every use of one variable in a computation to one XlaResource, so two
// state inputs with the same resource are one variable passed twice (var and its own slot,
// or two members of a group): both lowerings would write one buffer twice and corrupt it.
// The same InvalidArgumentError as the op's own kernel, at compile time (XLA knows every
// resource then). `name(i)` names state input i ("var", "accumulator[3]").
template <typename Name>
absl::Status CheckDistinctVariables(tfw::XlaOpKernelContext* ctx, int64_t count, Name name) {
  std::vector<std::pair<const tfw::XlaResource*, int64_t>> resources(count);
  for (int64_t i = 0; i < count; ++i) {
    tfw::XlaResource* resource = nullptr;
    const absl::Status found = ctx->GetResourceInput(static_cast<int>(i), &resource);
    if (!found.ok()) return found;
    resources[i] = {resource, i};
  }
  std::sort(resources.begin(), resources.end());
  for (size_t i = 1; i < resources.size(); ++i) {
    if (resources[i].first != resources[i - 1].first) continue;
    const int64_t a = resources[i - 1].second, b = resources[i].second;  // a < b
    const auto& kernel = ctx->op_kernel();
    return absl::InvalidArgumentError(
        std::string(name(a)) + " and " + name(b) + " are the same variable (" +
        kernel.requested_input(a) + ", " + kernel.requested_input(b) + "); each needs its own");
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------
// HLO lowering.

// Rows `rows` ([n], any integer type) of `table` ([R, ...]): [n, ...]. XLA clamps
// out-of-range rows, so reads are always safe.
xla::XlaOp GatherRows(xla::XlaOp table, xla::XlaOp rows) {
  return xla::TorchIndexSelect(table, rows, 0);
}

// Writes (or, with `combiner`, accumulates) updates[k] into row rows[k] of `operand`,
// k = 0, 1, ... in order; a row index outside the operand drops that update.
xla::XlaOp ScatterRows(xla::XlaOp operand, xla::XlaOp rows, xla::XlaOp updates,
                       const xla::XlaComputation& combiner, int64_t n, int64_t rank) {
  xla::ScatterDimensionNumbers dims;
  for (int64_t d = 1; d < rank; ++d) dims.add_update_window_dims(d);
  dims.add_inserted_window_dims(0);
  dims.add_scatter_dims_to_operand_dims(0);
  dims.set_index_vector_dim(1);
  return xla::Scatter(operand, xla::Reshape(rows, {n, 1}), updates, combiner, dims);
}

xla::XlaComputation ReplaceComputation(xla::XlaBuilder* parent, xla::PrimitiveType type) {
  auto b = parent->CreateSubBuilder("replace");
  const xla::Shape scalar = xla::ShapeUtil::MakeShape(type, {});
  xla::Parameter(b.get(), 0, scalar, "old");
  xla::Parameter(b.get(), 1, scalar, "new");  // the last instruction is the root
  return b->BuildAndNoteError();
}

// Running max (forward) or min (backward) along a vector: window of the whole length.
xla::XlaOp Scan(xla::XlaOp x, int64_t n, bool forward_max, xla::XlaBuilder* b) {
  const xla::PrimitiveType type = xla::S64;
  const std::pair<int64_t, int64_t> padding = forward_max ? std::make_pair(n - 1, int64_t{0})
                                                          : std::make_pair(int64_t{0}, n - 1);
  return xla::ReduceWindowWithGeneralPadding(
      x,
      forward_max ? xla::ConstantR0<int64_t>(b, std::numeric_limits<int64_t>::min())
                  : xla::ConstantR0<int64_t>(b, std::numeric_limits<int64_t>::max()),
      forward_max ? xla::CreateScalarMaxComputation(type, b)
                  : xla::CreateScalarMinComputation(type, b),
      {n}, {1}, {}, {}, {padding});
}

// DuplicateChunkLength element-wise on S64 counts [n]: 32 up to 1024, else ceil(sqrt(count)).
xla::XlaOp ChunkLength(xla::XlaOp count, int64_t n, xla::XlaBuilder* b) {
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

// Update() over whole arrays (already in the compute type), results in `storage`.
template <typename Rule>
HloState<Rule> HloUpdate(const typename Rule::template Params<XlaValue>& params, xla::XlaOp var,
                         const std::array<xla::XlaOp, NumSlots<Rule>()>& slots, xla::XlaOp grad,
                         xla::PrimitiveType storage) {
  XlaValue v = var;
  XlaValue s[NumSlots<Rule>()];
  for (int k = 0; k < NumSlots<Rule>(); ++k) s[k] = slots[k];
  Rule::Update(params, v, s, XlaValue(grad));
  HloState<Rule> out;
  out.var = xla::ConvertElementType(v.op(), storage);
  for (int k = 0; k < NumSlots<Rule>(); ++k) out.slots[k] = xla::ConvertElementType(s[k].op(), storage);
  return out;
}

// ---------------------------------------------------------------------------------------
// The XLA op kernel.

template <typename Rule, bool kSparse>
class FusedApplyXlaOp : public tfw::XlaOpKernel {
  static constexpr int kSlots = NumSlots<Rule>();
  static constexpr int kHyper = NumHyper<Rule>();
  static constexpr int kGradInput = 1 + kSlots + kHyper;

 public:
  explicit FusedApplyXlaOp(tfw::OpKernelConstruction* ctx)
      : XlaOpKernel(ctx),
        on_cpu_(ctx->device_type() == tfw::DeviceType(tfw::DEVICE_CPU_XLA_JIT)) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("T", &dtype_));
    for (int i = 0; i < NumOptions<Rule>(); ++i) {
      OP_REQUIRES_OK(ctx, ctx->GetAttr(Rule::kOptions[i].name, &options_[i]));
    }
  }

  void Compile(tfw::XlaOpKernelContext* ctx) override {
    OP_REQUIRES_OK(ctx, CheckDistinctVariables(ctx, 1 + kSlots, [](int64_t i) {
                     return i == 0 ? "var" : Rule::kSlots[i - 1];
                   }));
    std::array<xla::XlaOp, 1 + kSlots> state;
    std::array<Shape, 1 + kSlots> shapes;
    for (int i = 0; i <= kSlots; ++i) {
      tfw::TensorShape shape;
      OP_REQUIRES_OK(ctx, ctx->ReadVariableInput(i, dtype_, &shape, &state[i]));
      shapes[i] = ToShape(shape);
    }
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
    if (UseCustomCall(on_cpu_)) {
      CompileCustomCall(ctx, state, &updated);
    } else if constexpr (kSparse) {
      write = CompileHloSparse(ctx, state, shapes[0], indices_shape[0], &updated);
    } else {
      CompileHloDense(ctx, state, &updated);
    }
    if (!ctx->status().ok() || !write) return;
    OP_REQUIRES_OK(ctx, ctx->builder()->first_error());
    for (int i = 0; i <= kSlots; ++i) {
      OP_REQUIRES_OK(ctx, ctx->AssignVariable(i, dtype_, updated[i]));
    }
  }

 private:
  xla::PrimitiveType StorageType(tfw::XlaOpKernelContext* ctx) {
    xla::PrimitiveType type;
    const absl::Status s = tfw::DataTypeToPrimitiveType(dtype_, &type);
    if (!s.ok()) ctx->SetStatus(s);
    return type;
  }

  void CompileHloDense(tfw::XlaOpKernelContext* ctx, const std::array<xla::XlaOp, 1 + kSlots>& state,
                       std::array<xla::XlaOp, 1 + kSlots>* updated) {
    xla::XlaBuilder* b = ctx->builder();
    const xla::PrimitiveType storage = StorageType(ctx);
    const xla::PrimitiveType compute = ComputeTypeOf(storage);
    XlaValueScope scope(b, compute);
    const auto params = HloParams<Rule>(ctx, 1 + kSlots, compute, options_.data());
    std::array<xla::XlaOp, kSlots> slots;
    for (int k = 0; k < kSlots; ++k) slots[k] = xla::ConvertElementType(state[k + 1], compute);
    const HloState<Rule> out =
        HloUpdate<Rule>(params, xla::ConvertElementType(state[0], compute), slots,
                        xla::ConvertElementType(ctx->Input(kGradInput), compute), storage);
    (*updated)[0] = out.var;
    for (int k = 0; k < kSlots; ++k) (*updated)[k + 1] = out.slots[k];
  }

  // Returns false when there is nothing to write (no ids, or rows of no elements).
  bool CompileHloSparse(tfw::XlaOpKernelContext* ctx,
                        const std::array<xla::XlaOp, 1 + kSlots>& state, const Shape& var_shape,
                        int64_t n, std::array<xla::XlaOp, 1 + kSlots>* updated) {
    xla::XlaBuilder* b = ctx->builder();
    const xla::PrimitiveType storage = StorageType(ctx);
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
    const auto params = HloParams<Rule>(ctx, 1 + kSlots, compute, options_.data());
    std::array<xla::XlaOp, kSlots> slot_rows;
    for (int k = 0; k < kSlots; ++k) {
      slot_rows[k] = xla::ConvertElementType(GatherRows(state[k + 1], rows), compute);
    }
    const HloState<Rule> out = HloUpdate<Rule>(
        params, xla::ConvertElementType(GatherRows(state[0], rows), compute), slot_rows, sums,
        storage);
    const xla::XlaOp write_row = xla::Select(xla::And(head, xla::Broadcast(all_in_range, {n})),
                                             rows, xla::Broadcast(c(num_rows), {n}));
    const xla::XlaComputation replace = ReplaceComputation(b, storage);
    (*updated)[0] = ScatterRows(state[0], write_row, out.var, replace, n, rank);
    for (int k = 0; k < kSlots; ++k) {
      (*updated)[k + 1] = ScatterRows(state[k + 1], write_row, out.slots[k], replace, n, rank);
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
    std::vector<uint8_t> options(std::max(1, NumOptions<Rule>()), 0);
    for (int i = 0; i < NumOptions<Rule>(); ++i) options[i] = options_[i] ? 1 : 0;
    operands.push_back(xla::ConstantR1<uint8_t>(b, options));
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
        b, CustomCallTarget(Rule::kPyName, kSparse), operands, xla::ShapeUtil::MakeTupleShape(shapes),
        /*opaque=*/"", /*has_side_effect=*/true, aliasing, /*literal=*/nullptr,
        xla::CustomCallSchedule::SCHEDULE_NONE, xla::CustomCallApiVersion::API_VERSION_TYPED_FFI);
    for (int i = 0; i <= kSlots; ++i) (*updated)[i] = xla::GetTupleElement(call, i);
  }

  const bool on_cpu_;  // compiling for XLA:CPU
  tfw::DataType dtype_;
  std::array<bool, NumOptions<Rule>()> options_{};
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
      : XlaOpKernel(ctx),
        on_cpu_(ctx->device_type() == tfw::DeviceType(tfw::DEVICE_CPU_XLA_JIT)) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("T", &dtype_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &n_));
    for (int i = 0; i < NumOptions<Rule>(); ++i) {
      OP_REQUIRES_OK(ctx, ctx->GetAttr(Rule::kOptions[i].name, &options_[i]));
    }
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
    OP_REQUIRES_OK(ctx, CheckDistinctVariables(ctx, num_state, [this](int64_t j) {
                     const int64_t k = j / n_;
                     return std::string(k == 0 ? "var" : Rule::kSlots[k - 1]) + "[" +
                            std::to_string(j % n_) + "]";
                   }));
    std::vector<xla::XlaOp> state(num_state);
    std::vector<Shape> shapes(num_state);
    for (int64_t j = 0; j < num_state; ++j) {
      tfw::TensorShape shape;
      OP_REQUIRES_OK(ctx, ctx->ReadVariableInput(j, dtype_, &shape, &state[j]));
      shapes[j] = ToShape(shape);
    }
    const Shape scalars[kHyper > 0 ? kHyper : 1];
    for (int64_t v = 0; v < n_; ++v) {
      std::array<Shape, kSlots> slots;
      for (int k = 0; k < kSlots; ++k) slots[k] = shapes[(k + 1) * n_ + v];
      const Shape grad = InputShape(ctx, first_grad + v, &status);
      OP_REQUIRES_OK(ctx, status);
      const std::string error = ValidateDense<Rule>(shapes[v], slots.data(), scalars, grad);
      OP_REQUIRES(ctx, error.empty(), absl::InvalidArgumentError(GroupMemberError(v, n_, error)));
    }
    xla::XlaBuilder* b = ctx->builder();
    std::vector<xla::XlaOp> updated(num_state);
    if (UseCustomCall(on_cpu_)) {
      std::vector<xla::XlaOp> operands(state);
      for (int i = 0; i < kHyper; ++i) operands.push_back(ctx->Input(first_hyper + i));
      for (int64_t v = 0; v < n_; ++v) operands.push_back(ctx->Input(first_grad + v));
      std::vector<uint8_t> options(std::max(1, NumOptions<Rule>()), 0);
      for (int i = 0; i < NumOptions<Rule>(); ++i) options[i] = options_[i] ? 1 : 0;
      operands.push_back(xla::ConstantR1<uint8_t>(b, options));
      std::vector<xla::Shape> out_shapes;
      std::vector<std::pair<xla::ShapeIndex, std::pair<int64_t, xla::ShapeIndex>>> aliasing;
      for (int64_t j = 0; j < num_state; ++j) {
        auto shape = b->GetShape(state[j]);
        OP_REQUIRES_OK(ctx, shape.status());
        out_shapes.push_back(*shape);
        aliasing.push_back({xla::ShapeIndex{j}, {j, xla::ShapeIndex{}}});
      }
      const xla::XlaOp call = xla::CustomCall(
          b, GroupCustomCallTarget(Rule::kPyName), operands,
          xla::ShapeUtil::MakeTupleShape(out_shapes), /*opaque=*/"", /*has_side_effect=*/true,
          aliasing, /*literal=*/nullptr, xla::CustomCallSchedule::SCHEDULE_NONE,
          xla::CustomCallApiVersion::API_VERSION_TYPED_FFI);
      for (int64_t j = 0; j < num_state; ++j) updated[j] = xla::GetTupleElement(call, j);
    } else {
      xla::PrimitiveType storage;
      OP_REQUIRES_OK(ctx, tfw::DataTypeToPrimitiveType(dtype_, &storage));
      const xla::PrimitiveType compute = ComputeTypeOf(storage);
      XlaValueScope scope(b, compute);
      const auto params = HloParams<Rule>(ctx, first_hyper, compute, options_.data());
      for (int64_t v = 0; v < n_; ++v) {
        std::array<xla::XlaOp, kSlots> slots;
        for (int k = 0; k < kSlots; ++k) {
          slots[k] = xla::ConvertElementType(state[(k + 1) * n_ + v], compute);
        }
        const HloState<Rule> out = HloUpdate<Rule>(
            params, xla::ConvertElementType(state[v], compute), slots,
            xla::ConvertElementType(ctx->Input(first_grad + v), compute), storage);
        updated[v] = out.var;
        for (int k = 0; k < kSlots; ++k) updated[(k + 1) * n_ + v] = out.slots[k];
      }
    }
    OP_REQUIRES_OK(ctx, b->first_error());
    for (int64_t j = 0; j < num_state; ++j) {
      OP_REQUIRES_OK(ctx, ctx->AssignVariable(j, dtype_, updated[j]));
    }
  }

 private:
  const bool on_cpu_;
  tfw::DataType dtype_;
  int64_t n_ = 0;
  std::array<bool, NumOptions<Rule>()> options_{};
};

// ---------------------------------------------------------------------------------------
// The custom call's handler: the CPU engine on XLA's buffers.

#ifdef FUSEDOPT_XLA_FFI
namespace ffi = ::xla::ffi;

// Runs ParallelFor blocks on XLA's intra-op pool. The calling thread takes blocks too and
// waits only for blocks other threads are running, so a busy pool cannot deadlock it.
class FfiExecutor final : public Executor {
 public:
  explicit FfiExecutor(ffi::ThreadPool& pool) : pool_(pool) {}

  void ParallelFor(int64_t n, int64_t cost_per_unit, const Block& fn) override {
    const int64_t threads = std::max<int64_t>(1, pool_.num_threads() + 1);
    // Below ~50k cycles of work a thread costs more than it saves.
    const int64_t min_units = std::max<int64_t>(1, 50000 / std::max<int64_t>(1, cost_per_unit));
    const int64_t blocks = std::min<int64_t>(4 * threads, std::max<int64_t>(1, n / min_units));
    RunClaimingPieces(
        n, blocks, threads - 1,
        [this](auto task) { pool_.Schedule(std::move(task)); }, fn);
  }

 private:
  ffi::ThreadPool& pool_;
};

// Call::Typed<T>(pool, args, rets) for the storage type of the first argument (var).
template <typename Call>
ffi::Error RunTyped(ffi::ThreadPool pool, ffi::RemainingArgs args, ffi::RemainingRets rets) {
  auto var = args.get<ffi::AnyBuffer>(0);
  if (!var.has_value()) return var.error();
  switch (var->element_type()) {
    case ffi::DataType::F16:
      return Call::template Typed<half_t>(pool, args, rets);
    case ffi::DataType::BF16:
      return Call::template Typed<bfloat16_t>(pool, args, rets);
    case ffi::DataType::F32:
      return Call::template Typed<float>(pool, args, rets);
    case ffi::DataType::F64:
      return Call::template Typed<double>(pool, args, rets);
    default:
      return ffi::Error::InvalidArgument("fusedopt: unsupported variable dtype");
  }
}

// The FFI entry point of a handler: binds XLA's thread pool and every argument and result.
template <typename Call>
XLA_FFI_Error* FfiEntry(XLA_FFI_CallFrame* frame) {
  static auto* handler = ffi::Ffi::Bind()
                             .Ctx<ffi::ThreadPool>()
                             .RemainingArgs()
                             .RemainingRets()
                             .To(RunTyped<Call>)
                             .release();
  return handler->Call(frame);
}

template <typename Rule, bool kSparse>
struct FfiCall {
  static constexpr int kSlots = NumSlots<Rule>();
  static constexpr int kHyper = NumHyper<Rule>();

  template <typename T>
  static ffi::Error Typed(ffi::ThreadPool& pool, const ffi::RemainingArgs& args,
                          const ffi::RemainingRets& rets) {
    // Arguments: var, slots, hyper-parameters, grad, [indices], options; results: var, slots.
    std::array<T*, 1 + kSlots> state;
    int64_t elements = 0, num_rows = 0;
    for (int i = 0; i <= kSlots; ++i) {
      auto in = args.get<ffi::AnyBuffer>(i);
      auto out = rets.get<ffi::AnyBuffer>(i);
      if (!in.has_value()) return in.error();
      if (!out.has_value()) return out.error();
      void* dst = (*out)->untyped_data();
      // Aliased (the normal case): the same buffer. Otherwise start from the old value.
      if (dst != in->untyped_data()) std::memcpy(dst, in->untyped_data(), in->size_bytes());
      state[i] = static_cast<T*>(dst);
      if (i == 0) {
        elements = static_cast<int64_t>(in->element_count());
        const auto dims = in->dimensions();
        num_rows = dims.size() > 0 ? dims[0] : 1;
      }
    }
    std::array<const T*, kHyper> hyper;
    for (int i = 0; i < kHyper; ++i) {
      auto h = args.get<ffi::AnyBuffer>(1 + kSlots + i);
      if (!h.has_value()) return h.error();
      hyper[i] = static_cast<const T*>(h->untyped_data());
    }
    auto grad = args.get<ffi::AnyBuffer>(1 + kSlots + kHyper);
    if (!grad.has_value()) return grad.error();
    auto options = args.get<ffi::AnyBuffer>(2 + kSlots + kHyper + (kSparse ? 1 : 0));
    if (!options.has_value()) return options.error();
    std::array<bool, NumOptions<Rule>()> flags{};
    const auto* option_bytes = static_cast<const uint8_t*>(options->untyped_data());
    for (int i = 0; i < NumOptions<Rule>(); ++i) flags[i] = option_bytes[i] != 0;
    const auto params = PrepareParams<Rule, T>(hyper.data(), flags.data());
    const T* grad_data = static_cast<const T*>(grad->untyped_data());
    FfiExecutor executor(pool);
    if constexpr (!kSparse) {
      ApplyDense<Rule, T>(params, state[0], &state[1], grad_data, elements, executor);
      return ffi::Error::Success();
    } else {
      auto indices = args.get<ffi::AnyBuffer>(2 + kSlots + kHyper);
      if (!indices.has_value()) return indices.error();
      const int64_t n = static_cast<int64_t>(indices->element_count());
      const int64_t row_size = num_rows == 0 ? 0 : elements / num_rows;
      std::string error;
      if (indices->element_type() == ffi::DataType::S32) {
        error = ApplySparse<Rule, T, int32_t>(params, state[0], &state[1], num_rows, row_size,
                                              grad_data,
                                              static_cast<const int32_t*>(indices->untyped_data()),
                                              n, executor);
      } else {
        error = ApplySparse<Rule, T, int64_t>(params, state[0], &state[1], num_rows, row_size,
                                              grad_data,
                                              static_cast<const int64_t*>(indices->untyped_data()),
                                              n, executor);
      }
      if (!error.empty()) return ffi::Error::InvalidArgument(error);
      return ffi::Error::Success();
    }
  }

};

// The group's custom call: arguments N*(1+kSlots) state buffers (vars, then each slot's),
// the hyper-parameters, N grads, options; results the state buffers.
template <typename Rule>
struct FfiGroupCall {
  static constexpr int kSlots = NumSlots<Rule>();
  static constexpr int kHyper = NumHyper<Rule>();

  template <typename T>
  static ffi::Error Typed(ffi::ThreadPool& pool, const ffi::RemainingArgs& args,
                          const ffi::RemainingRets& rets) {
    const int64_t n = (static_cast<int64_t>(args.size()) - kHyper - 1) / (2 + kSlots);
    const int64_t num_state = (1 + kSlots) * n;
    if (n < 1 || static_cast<int64_t>(rets.size()) != num_state) {
      return ffi::Error::InvalidArgument("fusedopt: malformed group custom call");
    }
    std::vector<DenseTensor<Rule, T>> tensors(n);
    for (int64_t j = 0; j < num_state; ++j) {
      auto in = args.get<ffi::AnyBuffer>(j);
      auto out = rets.get<ffi::AnyBuffer>(j);
      if (!in.has_value()) return in.error();
      if (!out.has_value()) return out.error();
      void* dst = (*out)->untyped_data();
      if (dst != in->untyped_data()) std::memcpy(dst, in->untyped_data(), in->size_bytes());
      DenseTensor<Rule, T>& x = tensors[j % n];
      if (j < n) {
        x.var = static_cast<T*>(dst);
        x.n = static_cast<int64_t>(in->element_count());
      } else {
        x.slots[j / n - 1] = static_cast<T*>(dst);
      }
    }
    std::array<const T*, kHyper> hyper;
    for (int i = 0; i < kHyper; ++i) {
      auto h = args.get<ffi::AnyBuffer>(num_state + i);
      if (!h.has_value()) return h.error();
      hyper[i] = static_cast<const T*>(h->untyped_data());
    }
    for (int64_t v = 0; v < n; ++v) {
      auto grad = args.get<ffi::AnyBuffer>(num_state + kHyper + v);
      if (!grad.has_value()) return grad.error();
      tensors[v].grad = static_cast<const T*>(grad->untyped_data());
    }
    auto options = args.get<ffi::AnyBuffer>(num_state + kHyper + n);
    if (!options.has_value()) return options.error();
    std::array<bool, NumOptions<Rule>()> flags{};
    const auto* option_bytes = static_cast<const uint8_t*>(options->untyped_data());
    for (int i = 0; i < NumOptions<Rule>(); ++i) flags[i] = option_bytes[i] != 0;
    FfiExecutor executor(pool);
    ApplyDenseGroup<Rule, T>(PrepareParams<Rule, T>(hyper.data(), flags.data()), tensors.data(),
                             n, executor);
    return ffi::Error::Success();
  }

};
#endif  // FUSEDOPT_XLA_FFI

// ---------------------------------------------------------------------------------------
// Registration (static initialisation of the op library).

template <typename Kernel>
tfw::OpKernel* MakeKernel(tfw::OpKernelConstruction* ctx) {
  return new Kernel(ctx);
}

const std::vector<tfw::DataType>& FloatTypes() {
  static const auto* types =
      new std::vector<tfw::DataType>{tfw::DT_HALF, tfw::DT_BFLOAT16, tfw::DT_FLOAT, tfw::DT_DOUBLE};
  return *types;
}

struct Registration {
  std::string op;
  bool sparse;
  tfw::XlaOpRegistry::Factory factory;
};

std::vector<Registration>& Registrations() {
  static auto* all = new std::vector<Registration>();
  return *all;
}

template <typename Rule, bool kSparse>
void RegisterXlaKernel() {
  const std::string op =
      OpName(Rule::kOpName, kSparse ? Variant::kResourceSparseApply : Variant::kResourceApply);
  auto builder = tfw::XlaOpRegistrationBuilder::Name(op);
  builder.TypeConstraint("T", FloatTypes());
  if (kSparse) builder.TypeConstraint("Tindices", {tfw::DT_INT32, tfw::DT_INT64});
  new tfw::XlaOpRegistrar(builder.Build(&MakeKernel<FusedApplyXlaOp<Rule, kSparse>>));
  Registrations().push_back({op, kSparse, &MakeKernel<FusedApplyXlaOp<Rule, kSparse>>});
#ifdef FUSEDOPT_XLA_FFI
  static const std::string target = CustomCallTarget(Rule::kPyName, kSparse);
  XLA_FFI_Error* error = ffi::Ffi::RegisterStaticHandler(ffi::GetXlaFfiApi(), target, "Host",
                                                         &FfiEntry<FfiCall<Rule, kSparse>>);
  (void)error;  // only a duplicate registration fails, and then the first one serves
#endif
}

// XlaOpRegistry turns XLA registrations into JIT kernels once, at the process's first XLA
// compilation (TF's own "Add" then has XLA_CPU_JIT kernels). Loaded after that, our ops
// would be "not registered for XLA_CPU_JIT": register their JIT kernels the same way.
void RegisterLateJitKernels() {
  if (tfw::KernelsRegisteredForOp("Add").find(tfw::DEVICE_CPU_XLA_JIT) == std::string::npos) {
    return;  // early: XlaOpRegistry will include ours
  }
  for (const char* device : {tfw::DEVICE_CPU_XLA_JIT, tfw::DEVICE_GPU_XLA_JIT}) {
    if (!tfw::XlaOpRegistry::IsBackendRegistered(device)) continue;
    for (const Registration& r : Registrations()) {
      tfw::KernelDefBuilder builder(r.op.c_str());
      builder.Device(device).TypeConstraint("T", FloatTypes());
      if (r.sparse) builder.TypeConstraint("Tindices", {tfw::DT_INT32, tfw::DT_INT64});
      tfw::kernel_factory::OpKernelRegistrar(builder.Build(), "XlaJitOp", r.factory);
    }
  }
}

template <typename Rule>
void RegisterGroupXlaKernel() {
  const std::string op = GroupOpName(Rule::kOpName);
  auto builder = tfw::XlaOpRegistrationBuilder::Name(op);
  builder.TypeConstraint("T", FloatTypes());
  new tfw::XlaOpRegistrar(builder.Build(&MakeKernel<FusedGroupApplyXlaOp<Rule>>));
  Registrations().push_back({op, false, &MakeKernel<FusedGroupApplyXlaOp<Rule>>});
#ifdef FUSEDOPT_XLA_FFI
  static const std::string target = GroupCustomCallTarget(Rule::kPyName);
  XLA_FFI_Error* error = ffi::Ffi::RegisterStaticHandler(ffi::GetXlaFfiApi(), target, "Host",
                                                         &FfiEntry<FfiGroupCall<Rule>>);
  (void)error;  // only a duplicate registration fails, and then the first one serves
#endif
}

bool RegisterAll() {
  AllRules::ForEach([](auto rule) {
    using Rule = decltype(rule);
    RegisterXlaKernel<Rule, false>();
    RegisterXlaKernel<Rule, true>();
    RegisterGroupXlaKernel<Rule>();
  });
  RegisterLateJitKernels();
  return true;
}

const bool registered = RegisterAll();

}  // namespace
}  // namespace tf
}  // namespace fusedopt
