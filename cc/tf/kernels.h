// The generic OpKernel for every rule and variant. It owns what TensorFlow owns:
// ref vs resource variables, locking (use_locking), copy-on-write/read, dtype and
// shape validation and the thread pool; then it hands raw buffers to the core
// engine. Everything that can reject the call runs before the first write.
//
// Built with FUSEDOPT_CUDA (FUSEDOPT_CUDA=1 pip install / bazel --config=cuda), the same
// kernel is also registered for DEVICE_GPU with Device = GpuDeviceTag: variables are
// accessed through gpu_variables.h (no TF GPU functors, so the library still loads in
// tensorflow-cpu), hyper-parameters arrive in host memory, and the core's CUDA engine
// runs on the op's stream.
#ifndef FUSEDOPT_CC_TF_KERNELS_H_
#define FUSEDOPT_CC_TF_KERNELS_H_

// Eigen::ThreadPoolDevice (CPUDevice, the CPU kernels' Device tag) in full.
#define EIGEN_USE_THREADS

#include <algorithm>
#include <array>
#include <functional>
#include <numeric>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cc/core/engine.h"
#include "cc/core/validate.h"
#include "cc/tf/op_defs.h"
#include "cc/tf/cpu_executor.h"
#include "cc/tf/separate_buffers.h"
#include "cc/tf/variable_access.h"
#include "cc/tf/variable_pack.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/register_types.h"
#include "tensorflow/core/framework/tensor.h"
#ifdef FUSEDOPT_CUDA
#include "cc/core/gpu/engine_gpu.h"
#include "cc/tf/gpu_variables.h"
#endif

namespace fusedopt {
namespace gpu {
struct IndexCheck;  // engine_gpu.h (CUDA builds)
}  // namespace gpu
namespace tf {

// TF element type -> the core's layout-compatible storage type.
template <typename T>
struct StorageOf {
  using type = T;
};
template <>
struct StorageOf<Eigen::half> {
  using type = half_t;
};
template <>
struct StorageOf<::tensorflow::bfloat16> {
  using type = bfloat16_t;
};
static_assert(sizeof(Eigen::half) == sizeof(half_t), "half layout");
static_assert(sizeof(::tensorflow::bfloat16) == sizeof(bfloat16_t), "bfloat16 layout");

// Whether a resource variable holds a value. A Var made but never assigned (e.g. TF's
// UninitializedVariable) holds an empty tensor, which Tensor::IsInitialized() counts as
// initialized; its own flag says it is not.
inline bool HoldsValue(::tensorflow::Var* var) {
  const ::tensorflow::Tensor* t = var->tensor();
  return t->IsInitialized() && (var->is_initialized || t->NumElements() > 0);
}

// Exclusive locks on many variables, taken in the given order and released (in reverse)
// when this goes out of scope. A group op runs after the previous step's update streamed
// every buffer through the caches, so each Var is a cache miss, and each lock or unlock is
// an atomic that lets no later load start early: the Vars a few places ahead are fetched
// first (prefetching only computes an address: no Var is read before it is locked).
class ExclusiveLocks {
 public:
  ExclusiveLocks(const std::vector<::tensorflow::Var*>& vars, const std::vector<int64_t>& order)
      : vars_(order.size()) {
    for (size_t i = 0; i < order.size(); ++i) vars_[i] = vars[order[i]];
    for (size_t i = 0; i < vars_.size(); ++i) {
      Prefetch(i + kAhead);
      vars_[i]->mu()->lock();
    }
  }
  ~ExclusiveLocks() {
    for (size_t i = vars_.size(); i-- > 0;) {
      if (i >= kAhead) Prefetch(i - kAhead);
      vars_[i]->mu()->unlock();
    }
  }
  ExclusiveLocks(const ExclusiveLocks&) = delete;
  ExclusiveLocks& operator=(const ExclusiveLocks&) = delete;

 private:
  static constexpr size_t kAhead = 8;
  void Prefetch(size_t i) const {
    if (i < vars_.size()) __builtin_prefetch(vars_[i]->mu(), 1);
  }
  std::vector<::tensorflow::Var*> vars_;  // in locking order
};

inline Shape ToShape(const ::tensorflow::TensorShape& s) {
  Shape out(s.dims());
  for (int i = 0; i < s.dims(); ++i) out[i] = s.dim_size(i);
  return out;
}

// Whether a kernel's Device tag is the GPU's (never without FUSEDOPT_CUDA).
#ifdef FUSEDOPT_CUDA
template <typename Device>
inline constexpr bool kOnGpu = std::is_same_v<Device, GpuDeviceTag>;
#else
template <typename Device>
inline constexpr bool kOnGpu = false;
#endif

// One update: everything FusedApplyOp and FusedSparseApplyGpuOp do, given a context.
template <typename Device, typename T, typename Rule, Variant kVariant, typename Index>
class FusedApply {
  static constexpr int kSlots = NumSlots<Rule>();
  static constexpr int kHyper = NumHyper<Rule>();
  static constexpr int kGradInput = 1 + kSlots + kHyper;
  static constexpr bool kSparse = IsSparse(kVariant);
  static constexpr bool kGpu = kOnGpu<Device>;
  using Storage = typename StorageOf<T>::type;

 public:
  explicit FusedApply(::tensorflow::OpKernelConstruction* ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("use_locking", &use_exclusive_lock_));
    for (int i = 0; i < NumOptions<Rule>(); ++i) {
      OP_REQUIRES_OK(ctx, ctx->GetAttr(Rule::kOptions[i].name, &options_[i]));
    }
  }

  // Validates, then updates (CPU) or enqueues the update (GPU). Errors go to ctx. GPU
  // sparse calls need `check` (page-locked host memory): the device's index-check verdict
  // lands there once the stream has run the call, and *num_rows is set for its message.
  void Run(::tensorflow::OpKernelContext* ctx, [[maybe_unused]] gpu::IndexCheck* check = nullptr,
           [[maybe_unused]] int64_t* num_rows_out = nullptr) {
#ifdef FUSEDOPT_CUDA
    // Before anything can copy a variable on the GPU (copy-on-write needs the stream).
    if constexpr (kGpu) {
      OP_REQUIRES(ctx, GpuStreamOf(ctx) != nullptr,
                  absl::InternalError("fusedopt: no GPU stream for this op"));
    }
#endif
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
    if constexpr (!kGpu) SeparateBuffers(ctx, held);
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
      OP_REQUIRES(ctx, state[i].dtype() == ::tensorflow::DataTypeToEnum<T>::value,
                  absl::InvalidArgumentError(
                      std::string(name) + " has dtype " +
                      ::tensorflow::DataTypeString(state[i].dtype()) + " but the update is for " +
                      ::tensorflow::DataTypeString(::tensorflow::DataTypeToEnum<T>::value)));
      state_shapes[i] = ToShape(state[i].shape());
    }
    std::array<Shape, kHyper> hyper_shapes;
    std::array<const Storage*, kHyper> hyper;
    for (int i = 0; i < kHyper; ++i) {
      const ::tensorflow::Tensor& t = ctx->input(1 + kSlots + i);
      hyper_shapes[i] = ToShape(t.shape());
      hyper[i] = reinterpret_cast<const Storage*>(t.tensor_data().data());
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

    const auto params = PrepareParams<Rule, Storage>(hyper.data(), options_.data());
    Storage* var = Data(state[0]);
    std::array<Storage*, kSlots> slots;
    for (int k = 0; k < kSlots; ++k) slots[k] = Data(state[k + 1]);
    const Storage* grad_data = reinterpret_cast<const Storage*>(grad.tensor_data().data());
#ifdef FUSEDOPT_CUDA
    if constexpr (kGpu) {
      const gpu::Stream stream = GpuStreamOf(ctx);
      gpu::Status status;
      if constexpr (kSparse) {
        const ::tensorflow::Tensor& indices = ctx->input(kGradInput + 1);
        const int64_t num_rows = state[0].dim_size(0);
        const int64_t row_size = num_rows == 0 ? 0 : state[0].NumElements() / num_rows;
        TfGpuTempAllocator allocator(ctx);
        // The index check runs on the device; the update kernels write nothing after a bad
        // index, and the verdict reaches *check without the host waiting for it.
        status = gpu::ApplySparse<Rule, Storage, Index>(
            params, var, slots.data(), num_rows, row_size, grad_data,
            reinterpret_cast<const Index*>(indices.tensor_data().data()), indices.NumElements(),
            allocator, stream, check);
        if (!allocator.status().ok()) {
          ctx->CtxFailure(allocator.status());
          return;
        }
        *num_rows_out = num_rows;
      } else {
        status = gpu::ApplyDense<Rule, Storage>(params, var, slots.data(), grad_data,
                                                state[0].NumElements(), stream);
      }
      OP_REQUIRES(ctx, status.ok(), ToAbsl(status));
    } else  // NOLINT: the CPU engine is not instantiated for the GPU tag
#endif
    {
      TfCpuExecutor executor(ctx);
      if constexpr (kSparse) {
        const ::tensorflow::Tensor& indices = ctx->input(kGradInput + 1);
        const int64_t num_rows = state[0].dim_size(0);
        const int64_t row_size = num_rows == 0 ? 0 : state[0].NumElements() / num_rows;
        // ApplySparse checks every index before it writes anything.
        error = ApplySparse<Rule, Storage, Index>(params, var, slots.data(), num_rows, row_size,
                                                  grad_data,
                                                  reinterpret_cast<const Index*>(
                                                      indices.tensor_data().data()),
                                                  indices.NumElements(), executor);
        OP_REQUIRES(ctx, error.empty(), absl::InvalidArgumentError(error));
      } else {
        ApplyDense<Rule, Storage>(params, var, slots.data(), grad_data, state[0].NumElements(),
                                  executor);
      }
    }
    // Local equivalent of MaybeForwardRefInputToRefOutput (not exported on TF 2.15).
    if (!IsResource(kVariant)) ctx->forward_ref_input_to_ref_output(0, 0);
  }

 private:
  // Runs before anything touches a variable's buffer: every variable's dtype, from the
  // variable itself (the engine reads the buffer as T). And a variable passed twice would
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
      if (dtype != want) {
        return absl::InvalidArgumentError(
            std::string(StateName(i)) + " has dtype " + ::tensorflow::DataTypeString(dtype) +
            " but the update is for " + ::tensorflow::DataTypeString(want));
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
    return absl::FailedPreconditionError(
        std::string("Attempting to use uninitialized variable: ") +
        (input == 0 ? "var" : Rule::kSlots[input - 1]) + " (" +
        ctx->op_kernel().requested_input(input) + ")" +
        (cause.ok() ? "" : ": " + std::string(cause.message())));
  }

  static Storage* Data(::tensorflow::Tensor& t) {
    return reinterpret_cast<Storage*>(const_cast<char*>(t.tensor_data().data()));
  }

  bool use_exclusive_lock_ = false;
  std::array<bool, NumOptions<Rule>()> options_{};
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

#ifdef FUSEDOPT_CUDA
// Sparse GPU ops are asynchronous, as TF's own GPU ops that must report a data-dependent
// error: Compute enqueues the whole update and returns; the index check's verdict is
// copied into page-locked host memory behind it, and TF's EventMgr runs the callback that
// turns a bad index into InvalidArgument (nothing was written) once the stream gets there.
// The compute stream never drains for an embedding update.
template <typename T, typename Rule, Variant kVariant, typename Index>
class FusedSparseApplyGpuOp : public ::tensorflow::AsyncOpKernel {
 public:
  explicit FusedSparseApplyGpuOp(::tensorflow::OpKernelConstruction* ctx)
      : AsyncOpKernel(ctx), apply_(ctx) {}

  void ComputeAsync(::tensorflow::OpKernelContext* ctx, DoneCallback done) override {
    ::tensorflow::Tensor verdict;
    tsl::AllocatorAttributes on_host;
    on_host.set_on_host(true);
    on_host.set_gpu_compatible(true);  // page-locked: the device copies into it
    OP_REQUIRES_OK_ASYNC(
        ctx,
        ctx->allocate_temp(::tensorflow::DT_INT64,
                           ::tensorflow::TensorShape({sizeof(gpu::IndexCheck) / sizeof(int64_t)}),
                           &verdict, on_host),
        done);
    auto* check = reinterpret_cast<gpu::IndexCheck*>(verdict.flat<int64_t>().data());
    int64_t num_rows = 0;
    apply_.Run(ctx, check, &num_rows);
    if (!ctx->status().ok()) {
      done();
      return;
    }
    const auto* device_info = ctx->device()->tensorflow_accelerator_device_info();
    OP_REQUIRES_ASYNC(ctx, device_info != nullptr && device_info->event_mgr != nullptr,
                      absl::InternalError("fusedopt: no GPU event manager for this op"), done);
    // `verdict` rides along so its memory outlives the copy into it.
    device_info->event_mgr->ThenExecute(
        ctx->op_device_context()->stream(),
        [ctx, verdict, num_rows, done = std::move(done)]() {
          const auto* result =
              reinterpret_cast<const gpu::IndexCheck*>(verdict.flat<int64_t>().data());
          const gpu::Status status = gpu::IndexCheckStatus(*result, num_rows);
          if (!status.ok()) ctx->SetStatus(ToAbsl(status));
          done();
        });
  }

 private:
  FusedApply<GpuDeviceTag, T, Rule, kVariant, Index> apply_;
};
#endif

// FusedOpt>ResourceGroupApply<Rule>: N resource variables, one dense update, one pass
// (ApplyDenseGroup; on the GPU multi-tensor launches, 64 variables each, on the op's
// stream). Everything that can reject the call (lookups, dtypes, a variable passed twice
// anywhere in the group, shapes) is checked for the whole group before the first write.
// kPacked: FusedOpt>ResourcePackedGroupApply<Rule>, the variables from a member pack
// (variable_pack.h) in input 0 instead of (1 + slots) * N handles; the rest is the same.
template <typename Device, typename T, typename Rule, bool kPacked = false>
class FusedGroupApplyOp : public ::tensorflow::OpKernel {
  static constexpr int kSlots = NumSlots<Rule>();
  static constexpr int kHyper = NumHyper<Rule>();
  static constexpr bool kGpu = kOnGpu<Device>;
  using Storage = typename StorageOf<T>::type;
  using Var = ::tensorflow::Var;

 public:
  explicit FusedGroupApplyOp(::tensorflow::OpKernelConstruction* ctx) : OpKernel(ctx) {
    // use_locking changes nothing: like TF's dense resource ops, the update always holds
    // every variable's lock exclusively.
    OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &n_));
    for (int i = 0; i < NumOptions<Rule>(); ++i) {
      OP_REQUIRES_OK(ctx, ctx->GetAttr(Rule::kOptions[i].name, &options_[i]));
    }
  }

  void Compute(::tensorflow::OpKernelContext* ctx) override {
#ifdef FUSEDOPT_CUDA
    if constexpr (kGpu) {
      OP_REQUIRES(ctx, GpuStreamOf(ctx) != nullptr,
                  absl::InternalError("fusedopt: no GPU stream for this op"));
    }
#endif
    const int64_t num_state = (1 + kSlots) * n_;
    const int64_t first_hyper = kPacked ? 1 : num_state, first_grad = first_hyper + kHyper;
    // Hyper-parameters: scalars, shared by the group.
    std::array<const Storage*, kHyper> hyper;
    for (int i = 0; i < kHyper; ++i) {
      const ::tensorflow::Tensor& t = ctx->input(first_hyper + i);
      OP_REQUIRES(ctx, t.dims() == 0,
                  absl::InvalidArgumentError(std::string(Rule::kHyper[i]) +
                                             " must be a scalar, got shape " +
                                             ShapeString(ToShape(t.shape()))));
      OP_REQUIRES_OK(ctx, RequireElementAligned(Rule::kHyper[i], t));
      hyper[i] = reinterpret_cast<const Storage*>(t.tensor_data().data());
    }
    // Every variable found and distinct from all others. The pack (held by `pack`) or
    // `held` owns them until the end; `lock_order` is their address order.
    std::vector<Var*> vars(num_state);
    const std::vector<int64_t>* lock_order = nullptr;
    ::tensorflow::core::RefCountPtr<VariablePack> pack;
    std::vector<::tensorflow::core::RefCountPtr<Var>> held;
    std::vector<int64_t> sorted;
    if constexpr (kPacked) {
      const absl::Status found =
          ::tensorflow::LookupResource(ctx, ::tensorflow::HandleFromInput(ctx, 0), &pack);
      OP_REQUIRES(ctx, found.ok(),
                  absl::InvalidArgumentError("pack (" + requested_input(0) +
                                             ") is not a fusedopt member pack: " +
                                             std::string(found.message())));
      const int64_t size = static_cast<int64_t>(pack->members().size());
      OP_REQUIRES(ctx, size == num_state,
                  absl::InvalidArgumentError(
                      "the pack holds " + std::to_string(size) + " variables but " +
                      std::to_string(n_) + " gradients need " + std::to_string(num_state) +
                      " (each variable and its " + std::to_string(kSlots) + " slot(s))"));
      vars = pack->members();  // distinct: checked when the pack was made
      lock_order = &pack->lock_order();
    } else {
      held.resize(num_state);
      for (int64_t j = 0; j < num_state; ++j) {
        const absl::Status found =
            ::tensorflow::LookupResource(ctx, ::tensorflow::HandleFromInput(ctx, j), &held[j]);
        OP_REQUIRES(ctx, found.ok(), UninitializedError(ctx, j, found));
        vars[j] = held[j].get();
      }
      std::pair<int64_t, int64_t> same;
      OP_REQUIRES(ctx, AddressOrder(vars, &sorted, &same),
                  absl::InvalidArgumentError(StateName(same.first) + " and " +
                                             StateName(same.second) + " are the same variable (" +
                                             InputName(ctx, same.first) + ", " +
                                             InputName(ctx, same.second) + "); each needs its own"));
      lock_order = &sorted;
    }
    // Exclusive locks in address order, as TF's helpers take them: no deadlock with TF's
    // ops. Everything below is checked under them, once per member: the update is mostly
    // the cost of touching each member (its lock, tensor and buffer), which the update's
    // streaming has evicted from the caches since the last step.
    const ExclusiveLocks locks(vars, *lock_order);

    // Initialized, of dtype T, and the shapes of each variable's slots and gradient match;
    // gradients aligned to their elements (variable_access.h).
    const ::tensorflow::DataType want = ::tensorflow::DataTypeToEnum<T>::value;
    Shape hyper_shapes[kHyper > 0 ? kHyper : 1];  // scalars: checked above
    for (int64_t v = 0; v < n_; ++v) {
      const ::tensorflow::Tensor& grad = ctx->input(first_grad + v);
      if (!ElementAligned(grad)) {
        OP_REQUIRES_OK(ctx, RequireElementAligned("grad[" + std::to_string(v) + "]", grad));
      }
      const ::tensorflow::TensorShape& grad_shape = grad.shape();
      bool same_shapes = true;
      for (int k = 0; k <= kSlots; ++k) {
        const int64_t j = k * n_ + v;
        OP_REQUIRES(ctx, HoldsValue(vars[j]), UninitializedError(ctx, j, absl::OkStatus()));
        const ::tensorflow::Tensor* t = vars[j]->tensor();
        OP_REQUIRES(ctx, t->dtype() == want,
                    absl::InvalidArgumentError(StateName(j) + " has dtype " +
                                               ::tensorflow::DataTypeString(t->dtype()) +
                                               " but the update is for " +
                                               ::tensorflow::DataTypeString(want)));
        same_shapes = same_shapes && t->shape().IsSameSize(grad_shape);
      }
      if (same_shapes) continue;  // what ValidateDense accepts (hyper: scalars, above)
      std::array<Shape, 1 + kSlots> shapes;
      for (int k = 0; k <= kSlots; ++k) shapes[k] = ToShape(vars[k * n_ + v]->tensor()->shape());
      const std::string error = ValidateDense<Rule>(shapes[0], &shapes[1], hyper_shapes,
                                                    ToShape(grad_shape));
      OP_REQUIRES(ctx, error.empty(), absl::InvalidArgumentError(GroupMemberError(v, n_, error)));
    }
    // A member's buffers the cache cannot hold together move apart (cc/core/cache_alias.h),
    // before copy-on-write: a moved buffer is the variable's own, and is not copied again.
    if constexpr (!kGpu) {
      if (SeparationEnabled()) {
        std::array<Var*, 1 + kSlots> member;
        for (int64_t v = 0; v < n_; ++v) {
          const ::tensorflow::Tensor& grad = ctx->input(first_grad + v);
          if (grad.TotalBytes() < static_cast<size_t>(kMinSeparatedBytes)) continue;
          for (int k = 0; k <= kSlots; ++k) member[k] = vars[k * n_ + v];
          SeparateAliasedBuffers(ctx, member.data(), 1 + kSlots, grad.tensor_data().data(),
                                 static_cast<int64_t>(grad.TotalBytes()));
        }
      }
    }
    // Copy-on-write (a read still holds the buffer): the values stay as they are. Then
    // each member's buffer, which stays its own while the locks are held.
    std::vector<Storage*> state(num_state);
    for (int64_t j = 0; j < num_state; ++j) {
      Var* var = vars[j];
      OP_REQUIRES_OK(ctx, PrepareToUpdate<Device>(ctx, var->tensor(), var->copy_on_read_mode.load()));
      // After the copy, which adopted memory always gets (not TF's: never ref-count one).
      if (!ElementAligned(*var->tensor())) {
        OP_REQUIRES_OK(ctx, RequireElementAligned(StateName(j), *var->tensor()));
      }
      state[j] = Data(*var->tensor());
    }

    const auto params = PrepareParams<Rule, Storage>(hyper.data(), options_.data());
    std::vector<DenseTensor<Rule, Storage>> tensors(n_);
    for (int64_t v = 0; v < n_; ++v) {
      DenseTensor<Rule, Storage>& x = tensors[v];
      const ::tensorflow::Tensor& grad = ctx->input(first_grad + v);
      x.var = state[v];
      for (int k = 0; k < kSlots; ++k) x.slots[k] = state[(k + 1) * n_ + v];
      x.grad = reinterpret_cast<const Storage*>(grad.tensor_data().data());
      x.n = grad.NumElements();  // the variable's: validated above
    }
#ifdef FUSEDOPT_CUDA
    if constexpr (kGpu) {
      OP_REQUIRES_OK(ctx, ToAbsl(gpu::ApplyDenseGroup<Rule, Storage>(params, tensors.data(), n_,
                                                                     GpuStreamOf(ctx))));
    } else  // NOLINT: the CPU engine is not instantiated for the GPU tag
#endif
    {
      TfCpuExecutor executor(ctx);
      ApplyDenseGroup<Rule, Storage>(params, tensors.data(), n_, executor);
    }
  }

 private:
  // "var[3]", "m[0]": state input j of the group.
  std::string StateName(int64_t j) const {
    const int64_t k = j / n_;
    return std::string(k == 0 ? "var" : Rule::kSlots[k - 1]) + "[" + std::to_string(j % n_) + "]";
  }

  // The graph input behind state j: its own input, or the pack's ("pack member 7 of x").
  std::string InputName(::tensorflow::OpKernelContext* ctx, int64_t j) const {
    if constexpr (kPacked) {
      return "member " + std::to_string(j) + " of pack " + ctx->op_kernel().requested_input(0);
    } else {
      return ctx->op_kernel().requested_input(j);
    }
  }

  absl::Status UninitializedError(::tensorflow::OpKernelContext* ctx, int64_t j,
                                  const absl::Status& cause) const {
    return absl::FailedPreconditionError(
        "Attempting to use uninitialized variable: " + StateName(j) + " (" +
        InputName(ctx, j) + ")" +
        (cause.ok() ? "" : ": " + std::string(cause.message())));
  }

  static Storage* Data(::tensorflow::Tensor& t) {
    return reinterpret_cast<Storage*>(const_cast<char*>(t.tensor_data().data()));
  }

  // RequireElementAligned's test for a tensor of T (checked of dtype T first), per member.
  static bool ElementAligned(const ::tensorflow::Tensor& t) {
    return reinterpret_cast<uintptr_t>(t.tensor_data().data()) % sizeof(Storage) == 0;
  }

  int64_t n_ = 0;
  std::array<bool, NumOptions<Rule>()> options_{};
};

// Registers one kernel for op `op` on `device` with the given type constraints.
// On GPU the scalar hyper-parameters are host-memory inputs (read once by Prepare()).
template <typename Kernel>
void RegisterKernel(const std::string& op, const char* device, ::tensorflow::DataType type,
                    ::tensorflow::DataType index_type, bool sparse,
                    const std::vector<const char*>& host_memory_inputs) {
  ::tensorflow::KernelDefBuilder builder(op.c_str());
  builder.Device(device).TypeConstraint("T", type);
  if (sparse) builder.TypeConstraint("Tindices", index_type);
  for (const char* input : host_memory_inputs) builder.HostMemory(input);
  // The registrar's constructor does the registration; the object itself is inert.
  ::tensorflow::kernel_factory::OpKernelRegistrar(
      builder.Build(), "fusedopt::tf::FusedApplyOp",
      [](::tensorflow::OpKernelConstruction* ctx) -> ::tensorflow::OpKernel* {
        return new Kernel(ctx);
      });
}

// The kernel class of each op: FusedApplyOp, except for the asynchronous sparse GPU ops.
template <typename Device, typename T, typename Rule, Variant kVariant, typename Index>
struct KernelFor {
  using type = FusedApplyOp<Device, T, Rule, kVariant, Index>;
};
#ifdef FUSEDOPT_CUDA
template <typename T, typename Rule, Variant kVariant, typename Index>
struct KernelFor<GpuDeviceTag, T, Rule, kVariant, Index> {
  using type = std::conditional_t<IsSparse(kVariant), FusedSparseApplyGpuOp<T, Rule, kVariant, Index>,
                                  FusedApplyOp<GpuDeviceTag, T, Rule, kVariant, Index>>;
};
#endif

template <typename Device, typename Rule, typename T>
void RegisterKernelsForType(const char* device) {
  using ::tensorflow::DataTypeToEnum;
  const auto type = DataTypeToEnum<T>::value;
  const auto i32 = ::tensorflow::DT_INT32, i64 = ::tensorflow::DT_INT64;
  const char* name = Rule::kOpName;
  std::vector<const char*> host;
  if (std::string(device) != ::tensorflow::DEVICE_CPU) {
    host.assign(Rule::kHyper.begin(), Rule::kHyper.end());
  }
  RegisterKernel<typename KernelFor<Device, T, Rule, Variant::kApply, int32_t>::type>(
      OpName(name, Variant::kApply), device, type, i32, false, host);
  RegisterKernel<typename KernelFor<Device, T, Rule, Variant::kResourceApply, int32_t>::type>(
      OpName(name, Variant::kResourceApply), device, type, i32, false, host);
  RegisterKernel<typename KernelFor<Device, T, Rule, Variant::kSparseApply, int32_t>::type>(
      OpName(name, Variant::kSparseApply), device, type, i32, true, host);
  RegisterKernel<typename KernelFor<Device, T, Rule, Variant::kSparseApply, int64_t>::type>(
      OpName(name, Variant::kSparseApply), device, type, i64, true, host);
  RegisterKernel<typename KernelFor<Device, T, Rule, Variant::kResourceSparseApply, int32_t>::type>(
      OpName(name, Variant::kResourceSparseApply), device, type, i32, true, host);
  RegisterKernel<typename KernelFor<Device, T, Rule, Variant::kResourceSparseApply, int64_t>::type>(
      OpName(name, Variant::kResourceSparseApply), device, type, i64, true, host);
}

// The four ops of a rule, its group op, and their CPU (and, with FUSEDOPT_CUDA, GPU) kernels for every
// dtype and index type.
// The group op's kernel on `device` for dtype T.
template <typename Device, typename Rule, typename T>
void RegisterGroupKernel(const char* device) {
  std::vector<const char*> host;
  if (std::string(device) != ::tensorflow::DEVICE_CPU) {
    host.assign(Rule::kHyper.begin(), Rule::kHyper.end());
  }
  RegisterKernel<FusedGroupApplyOp<Device, T, Rule>>(
      GroupOpName(Rule::kOpName), device, ::tensorflow::DataTypeToEnum<T>::value,
      ::tensorflow::DT_INT32, /*sparse=*/false, host);
  RegisterKernel<FusedGroupApplyOp<Device, T, Rule, /*kPacked=*/true>>(
      PackedGroupOpName(Rule::kOpName), device, ::tensorflow::DataTypeToEnum<T>::value,
      ::tensorflow::DT_INT32, /*sparse=*/false, host);
}

template <typename Device, typename Rule, typename T>
void RegisterAllKernelsForType(const char* device) {
  RegisterKernelsForType<Device, Rule, T>(device);
  RegisterGroupKernel<Device, Rule, T>(device);
}

template <typename Rule>
bool RegisterOptimizer() {
  for (Variant v : kAllVariants) RegisterOpDef<Rule>(v);
  RegisterGroupOpDef<Rule>(/*packed=*/false);
  RegisterGroupOpDef<Rule>(/*packed=*/true);
  RegisterAllKernelsForType<CPUDevice, Rule, Eigen::half>(::tensorflow::DEVICE_CPU);
  RegisterAllKernelsForType<CPUDevice, Rule, ::tensorflow::bfloat16>(::tensorflow::DEVICE_CPU);
  RegisterAllKernelsForType<CPUDevice, Rule, float>(::tensorflow::DEVICE_CPU);
  RegisterAllKernelsForType<CPUDevice, Rule, double>(::tensorflow::DEVICE_CPU);
#ifdef FUSEDOPT_CUDA
  // Inert without a GPU: TF only instantiates them for GPU devices.
  RegisterAllKernelsForType<GpuDeviceTag, Rule, Eigen::half>(::tensorflow::DEVICE_GPU);
  RegisterAllKernelsForType<GpuDeviceTag, Rule, ::tensorflow::bfloat16>(::tensorflow::DEVICE_GPU);
  RegisterAllKernelsForType<GpuDeviceTag, Rule, float>(::tensorflow::DEVICE_GPU);
  RegisterAllKernelsForType<GpuDeviceTag, Rule, double>(::tensorflow::DEVICE_GPU);
#endif
  return true;
}

}  // namespace tf
}  // namespace fusedopt

// One line per optimizer, in its own translation unit (compile time and memory).
#define FUSEDOPT_REGISTER_OPTIMIZER(Rule) \
  static const bool fusedopt_registered_##Rule = ::fusedopt::tf::RegisterOptimizer<::fusedopt::Rule>()

#endif  // FUSEDOPT_CC_TF_KERNELS_H_
