// The op kernel of the four single-variable ops of every rule (Apply, ResourceApply,
// SparseApply, ResourceSparseApply), for any Device. It owns what TensorFlow owns: ref vs
// resource variables, locking (use_locking), copy-on-write/read, dtype and shape
// validation; then it hands raw buffers to DeviceEngine<Device> (device_engine.h).
// Everything that can reject the call runs before the first write.
#pragma once

#include <algorithm>
#include <array>
#include <numeric>
#include <string>
#include <vector>

#include "cc/core/engine.h"
#include "cc/core/validate.h"
#include "cc/tf/device_engine.h"
#include "cc/tf/kernel_common.h"
#include "cc/tf/op_defs.h"
#include "cc/tf/separate_buffers.h"
#include "cc/tf/tf_types.h"
#include "cc/tf/variable_access.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace fusedopt {
namespace tf {

// One update: everything FusedApplyOp and FusedSparseApplyGpuOp do, given a context.
template <typename Device, typename T, typename Rule, Variant kVariant, typename Index>
class FusedApply {
  static constexpr int kSlots = NumSlots<Rule>();
  static constexpr int kHyper = NumHyper<Rule>();
  static constexpr int kGradInput = 1 + kSlots + kHyper;
  static constexpr bool kSparse = IsSparse(kVariant);
  using Storage = typename StorageOf<T>::type;
  using Engine = DeviceEngine<Device>;

 public:
  explicit FusedApply(::tensorflow::OpKernelConstruction* ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("use_locking", &use_exclusive_lock_));
    attrs_.Read(ctx);
    if constexpr (kSparse) {
      OP_REQUIRES_OK(ctx, ctx->GetAttr(kEveryRowAttr, &every_row_));
      OP_REQUIRES(ctx, !every_row_ || Engine::kCpu,
                  absl::InvalidArgumentError(EveryRowRefused("on a GPU")));
    }
  }

  // Validates, then updates (CPU) or enqueues the update (GPU). Errors go to ctx. GPU
  // sparse calls need `check` (page-locked host memory): the device's index-check verdict
  // lands there once the stream has run the call, and *num_rows_out is set for its message.
  void Run(::tensorflow::OpKernelContext* ctx, gpu::IndexCheck* check = nullptr,
           int64_t* num_rows_out = nullptr) {
    OP_REQUIRES_OK(ctx, Engine::CheckDevice(ctx));
    // Resource lookups fail inside TF's locking helper with an InternalError; check
    // first so a missing/uninitialized variable reads as FailedPrecondition.
    for (int i = 0; i <= kSlots; ++i) {
      if (ctx->input_dtype(i) != ::tensorflow::DT_RESOURCE) continue;
      ::tensorflow::core::RefCountPtr<::tensorflow::Var> variable;
      const absl::Status found = ::tensorflow::LookupResource(
          ctx, ::tensorflow::HandleFromInput(ctx, i), &variable);
      OP_REQUIRES(ctx, found.ok() && HoldsValue(variable.get()),
                  UninitializedError(ctx, i, found));
    }
    std::array<::tensorflow::core::RefCountPtr<::tensorflow::Var>, 1 + kSlots> held;
    OP_REQUIRES_OK(ctx, CheckStateInputs(ctx, held));  // dtypes, aliasing: before TF's helpers
    if constexpr (Engine::kCpu) SeparateBuffers(ctx, held);
    std::vector<int> state_inputs(1 + kSlots);
    std::iota(state_inputs.begin(), state_inputs.end(), 0);
    auto locks = LockVariables(ctx, state_inputs);
    if (!ctx->status().ok()) return;

    // state[0] is var, state[1..] the slots.
    std::array<::tensorflow::Tensor, 1 + kSlots> state;
    std::array<Shape, 1 + kSlots> state_shapes;
    for (int i = 0; i <= kSlots; ++i) {
      const char* name = i == 0 ? "var" : Rule::kSlots[i - 1];
      absl::Status status = GetVariable(ctx, i, &state[i]);
      OP_REQUIRES(ctx, status.ok() && state[i].IsInitialized(), UninitializedError(ctx, i, status));
      const ::tensorflow::DataType want = i == 0 ? ::tensorflow::DataTypeToEnum<T>::value
                                                 : slot_dtype_;
      OP_REQUIRES(ctx, state[i].dtype() == want,
                  absl::InvalidArgumentError(DtypeMismatch(name, state[i].dtype(), want)));
      state_shapes[i] = ToShape(state[i].shape());
    }
    std::array<Shape, kHyper> hyper_shapes;
    std::array<const Storage*, kHyper> hyper;
    for (int i = 0; i < kHyper; ++i) {
      const ::tensorflow::Tensor& t = ctx->input(1 + kSlots + i);
      hyper_shapes[i] = ToShape(t.shape());
      hyper[i] = DataOf<Storage>(t);
    }
    const ::tensorflow::Tensor& grad = ctx->input(kGradInput);
    const Shape grad_shape = ToShape(grad.shape());
    std::string error;
    if constexpr (kSparse) {
      error = ValidateSparse<Rule>(state_shapes[0], &state_shapes[1], hyper_shapes.data(),
                                   grad_shape, ToShape(ctx->input(kGradInput + 1).shape()));
    } else {
      error = ValidateDense<Rule>(state_shapes[0], &state_shapes[1], hyper_shapes.data(),
                                  grad_shape);
    }
    OP_REQUIRES(ctx, error.empty(), absl::InvalidArgumentError(error));
    // Memory adopted from outside TF may not be aligned to its elements (variable_access.h).
    for (int i = 0; i <= kSlots; ++i) {
      OP_REQUIRES_OK(ctx, RequireElementAligned(StateName(i), state[i]));
    }
    for (int i = 0; i < kHyper; ++i) {
      OP_REQUIRES_OK(ctx, RequireElementAligned(Rule::kHyper[i], ctx->input(1 + kSlots + i)));
    }
    OP_REQUIRES_OK(ctx, RequireElementAligned("grad", grad));
    if constexpr (kSparse) {
      OP_REQUIRES_OK(ctx, RequireElementAligned("indices", ctx->input(kGradInput + 1)));
    }

    uint64_t rounding_seed = 0;
    OP_REQUIRES_OK(ctx, ReadRoundingSeed(ctx, &rounding_seed));

    const auto params = PrepareParams<Rule, Storage>(hyper.data(), attrs_.options.data(), rounding_seed);
    OP_REQUIRES_OK(ctx, ForSlotStorage<T>(slot_dtype_, [&](auto slot_storage) {
      return Update<typename decltype(slot_storage)::type>(ctx, params, state, check,
                                                           num_rows_out);
    }));
    // Local equivalent of MaybeForwardRefInputToRefOutput (not exported on TF 2.15).
    if (!IsResource(kVariant)) ctx->forward_ref_input_to_ref_output(0, 0);
  }

 private:
  // The engine on the validated buffers, slots stored as S.
  template <typename S>
  absl::Status Update(::tensorflow::OpKernelContext* ctx, const ParamsFor<Rule, Storage>& params,
                      std::array<::tensorflow::Tensor, 1 + kSlots>& state,
                      gpu::IndexCheck* check, int64_t* num_rows_out) {
    Storage* var = MutableData<Storage>(state[0]);
    std::array<S*, kSlots> slots;
    for (int k = 0; k < kSlots; ++k) slots[k] = MutableData<S>(state[k + 1]);
    const ::tensorflow::Tensor& grad = ctx->input(kGradInput);
    const Storage* grad_data = DataOf<Storage>(grad);
    if constexpr (kSparse) {
      const ::tensorflow::Tensor& indices = ctx->input(kGradInput + 1);
      const int64_t num_rows = state[0].dim_size(0);
      const int64_t row_size = num_rows == 0 ? 0 : state[0].NumElements() / num_rows;
      if (num_rows_out != nullptr) *num_rows_out = num_rows;
      if constexpr (Engine::kCpu) {
        if (every_row_) {
          return Engine::template SparseEveryRow<Rule, Storage, Index, S>(
              ctx, params, var, slots.data(), num_rows, row_size, grad_data,
              DataOf<Index>(indices), indices.NumElements(), attrs_.stochastic);
        }
      }
      return Engine::template Sparse<Rule, Storage, Index, S>(
          ctx, params, var, slots.data(), num_rows, row_size, grad_data, DataOf<Index>(indices),
          indices.NumElements(), check, attrs_.stochastic);
    } else {
      const int64_t n = state[0].NumElements();
      const int64_t row_size =
          RowSizeOf(state[0].dims(), state[0].dims() == 0 ? 1 : state[0].dim_size(0), n);
      return Engine::template Dense<Rule, Storage, S>(ctx, params, var, slots.data(), grad_data,
                                                      n, row_size, attrs_.stochastic);
    }
  }

  // Runs before anything touches a variable's buffer: every variable's dtype, from the
  // variable itself (the engine reads var as T, the slots as one storage type: T, or for
  // a float32 var also bfloat16/half, tf_types.h). And a variable passed twice would
  // be copied apart by copy-on-write or updated as var and slot at once.
  // (A variable deleted or uninitialized since the lookups above reads as uninitialized.)
  // `held` receives the resource variables (null for ref inputs).
  absl::Status CheckStateInputs(
      ::tensorflow::OpKernelContext* ctx,
      std::array<::tensorflow::core::RefCountPtr<::tensorflow::Var>, 1 + kSlots>& held) {
    const ::tensorflow::DataType want = ::tensorflow::DataTypeToEnum<T>::value;
    std::array<const void*, 1 + kSlots> identity{};  // the Var, or a ref input's mutex
    for (int i = 0; i <= kSlots; ++i) {
      ::tensorflow::DataType dtype;
      if (ctx->input_dtype(i) == ::tensorflow::DT_RESOURCE) {
        ::tensorflow::core::RefCountPtr<::tensorflow::Var>& variable = held[i];
        const absl::Status found = ::tensorflow::LookupResource(
            ctx, ::tensorflow::HandleFromInput(ctx, i), &variable);
        if (!found.ok()) return UninitializedError(ctx, i, found);
        ::tsl::tf_shared_lock lock(*variable->mu());  // an assign may swap the tensor
        if (!HoldsValue(variable.get())) return UninitializedError(ctx, i, found);
        dtype = variable->tensor()->dtype();
        identity[i] = variable.get();
      } else {
        dtype = ::tensorflow::BaseType(ctx->input_dtype(i));
        identity[i] = ctx->input_ref_mutex(i);  // one mutex per ref variable
      }
      if (i == 0 && dtype != want) {
        return absl::InvalidArgumentError(DtypeMismatch(StateName(i), dtype, want));
      }
      if (i > 0 && !SlotStorageAllowed<T>(dtype)) {
        return absl::InvalidArgumentError(SlotDtypeRefused<T>(StateName(i), dtype));
      }
      if (i == 1) {
        slot_dtype_ = dtype;
      } else if (i > 1 && dtype != slot_dtype_) {
        return absl::InvalidArgumentError(
            std::string(StateName(i)) + " has dtype " + ::tensorflow::DataTypeString(dtype) +
            " but " + StateName(1) + " has " + ::tensorflow::DataTypeString(slot_dtype_) +
            ": an update's slots are stored in one dtype");
      }
      for (int j = 0; j < i; ++j) {
        if (identity[j] != identity[i]) continue;
        return absl::InvalidArgumentError(
            std::string(StateName(j)) + " and " + StateName(i) + " are the same variable (" +
            ctx->op_kernel().requested_input(j) + ", " + ctx->op_kernel().requested_input(i) +
            "); each needs its own");
      }
    }
    return absl::OkStatus();
  }

  // Moves a large variable or slot buffer the cache cannot hold beside another buffer of
  // this update (cc/core/cache_alias.h), before TF's helpers hand the buffers out. Only
  // resource variables of one size and, dense, a gradient of that size (anything else is
  // left to the validation below). Checked under shared locks, as concurrent sparse
  // updates hold them; a move takes every variable's lock exclusively. Locks in address
  // order, as TF's helpers take them.
  void SeparateBuffers(
      ::tensorflow::OpKernelContext* ctx,
      std::array<::tensorflow::core::RefCountPtr<::tensorflow::Var>, 1 + kSlots>& held) {
    if (!SeparationEnabled()) return;
    const ::tensorflow::Tensor& grad = ctx->input(kGradInput);
    if (!kSparse && grad.TotalBytes() < static_cast<size_t>(kMinSeparatedBytes)) return;
    std::array<::tensorflow::Var*, 1 + kSlots> vars;
    for (int i = 0; i <= kSlots; ++i) {
      if (!held[i]) return;  // a ref variable
      vars[i] = held[i].get();
    }
    std::array<::tensorflow::Var*, 1 + kSlots> order = vars;
    std::sort(order.begin(), order.end());
    const void* grad_data = kSparse ? nullptr : grad.tensor_data().data();
    const int64_t grad_bytes = static_cast<int64_t>(grad.TotalBytes());
    // Same-size initialized buffers, and some of them aliased.
    auto wanted = [&] {
      const ::tensorflow::Tensor* first = vars[0]->tensor();
      if (!first->IsInitialized() ||
          first->TotalBytes() < static_cast<size_t>(kMinSeparatedBytes) ||
          (!kSparse && grad.NumElements() != first->NumElements())) {
        return false;
      }
      for (::tensorflow::Var* var : vars) {
        const ::tensorflow::Tensor* t = var->tensor();
        if (!t->IsInitialized() || t->dtype() != first->dtype() ||
            t->NumElements() != first->NumElements()) {
          return false;
        }
      }
      return AnyAliasedBuffer(vars.data(), 1 + kSlots, grad_data, grad_bytes);
    };
    {
      std::vector<::tsl::tf_shared_lock> shared;
      shared.reserve(order.size());
      for (::tensorflow::Var* var : order) shared.emplace_back(*var->mu());
      if (!wanted()) return;
    }
    std::vector<::tsl::mutex_lock> locks;
    locks.reserve(order.size());
    for (::tensorflow::Var* var : order) locks.emplace_back(*var->mu());
    if (wanted()) SeparateAliasedBuffers(ctx, vars.data(), 1 + kSlots, grad_data, grad_bytes);
  }

  static const char* StateName(int i) { return i == 0 ? "var" : Rule::kSlots[i - 1]; }

  ::tensorflow::VariableInputLockHolder LockVariables(::tensorflow::OpKernelContext* ctx,
                                                      const std::vector<int>& inputs) {
    return LockVariableInputs<Device, T>(ctx, use_exclusive_lock_, kSparse, inputs);
  }

  absl::Status GetVariable(::tensorflow::OpKernelContext* ctx, int input,
                           ::tensorflow::Tensor* out) {
    return VariableForUpdate<Device>(ctx, input, use_exclusive_lock_, kSparse, out);
  }

  static absl::Status UninitializedError(::tensorflow::OpKernelContext* ctx, int input,
                                         const absl::Status& cause) {
    return UninitializedVariableError(StateName(input), ctx->op_kernel().requested_input(input),
                                      cause);
  }

  bool use_exclusive_lock_ = false;
  bool every_row_ = false;  // sparse ops: kEveryRowAttr
  UpdateAttrs<Rule> attrs_;
  ::tensorflow::DataType slot_dtype_ = ::tensorflow::DataTypeToEnum<T>::value;
};

// The kernel for every CPU op and the dense GPU ops.
template <typename Device, typename T, typename Rule, Variant kVariant, typename Index>
class FusedApplyOp : public ::tensorflow::OpKernel {
 public:
  explicit FusedApplyOp(::tensorflow::OpKernelConstruction* ctx) : OpKernel(ctx), apply_(ctx) {}
  void Compute(::tensorflow::OpKernelContext* ctx) override { apply_.Run(ctx); }

 private:
  FusedApply<Device, T, Rule, kVariant, Index> apply_;
};

// The kernel class of each op: FusedApplyOp (apply_kernel_gpu.h: the asynchronous sparse
// GPU ops).
template <typename Device, typename T, typename Rule, Variant kVariant, typename Index>
struct KernelFor {
  using type = FusedApplyOp<Device, T, Rule, kVariant, Index>;
};

}  // namespace tf
}  // namespace fusedopt
