// The op kernel of the group ops, FusedOpt>ResourceGroupApply<Rule> and
// FusedOpt>ResourcePackedGroupApply<Rule>, for any Device (the engine: device_engine.h).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cc/core/engine.h"
#include "cc/core/validate.h"
#include "cc/tf/device_engine.h"
#include "cc/tf/kernel_common.h"
#include "cc/tf/op_defs.h"
#include "cc/tf/separate_buffers.h"
#include "cc/tf/tf_types.h"
#include "cc/tf/variable_access.h"
#include "cc/tf/variable_pack.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace fusedopt {
namespace tf {

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
  using Storage = typename StorageOf<T>::type;
  using Engine = DeviceEngine<Device>;
  using Var = ::tensorflow::Var;

 public:
  explicit FusedGroupApplyOp(::tensorflow::OpKernelConstruction* ctx) : OpKernel(ctx) {
    // use_locking changes nothing: like TF's dense resource ops, the update always holds
    // every variable's lock exclusively.
    OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &n_));
    attrs_.Read(ctx);
  }

  void Compute(::tensorflow::OpKernelContext* ctx) override {
    OP_REQUIRES_OK(ctx, Engine::CheckDevice(ctx));
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
      hyper[i] = DataOf<Storage>(t);
    }
    uint64_t rounding_seed = 0;
    OP_REQUIRES_OK(ctx, ReadRoundingSeed(ctx, &rounding_seed));
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

    // Initialized, vars of dtype T, every slot of the group of one storage dtype (var's, or
    // compact: tf_types.h), and the shapes of each variable's slots and gradient match;
    // gradients aligned to their elements (variable_access.h).
    const ::tensorflow::DataType var_dtype = ::tensorflow::DataTypeToEnum<T>::value;
    ::tensorflow::DataType slot_dtype = var_dtype;
    if (kSlots > 0 && n_ > 0) {
      OP_REQUIRES(ctx, HoldsValue(vars[n_]), UninitializedError(ctx, n_, absl::OkStatus()));
      slot_dtype = vars[n_]->tensor()->dtype();
      OP_REQUIRES(ctx, SlotStorageAllowed<T>(slot_dtype),
                  absl::InvalidArgumentError(SlotDtypeRefused<T>(StateName(n_), slot_dtype)));
    }
    Shape hyper_shapes[kHyper > 0 ? kHyper : 1];  // scalars: checked above
    for (int64_t v = 0; v < n_; ++v) {
      const ::tensorflow::Tensor& grad = ctx->input(first_grad + v);
      if (!ElementAligned(grad)) {
        OP_REQUIRES_OK(ctx, RequireElementAligned("grad[" + std::to_string(v) + "]", grad));
      }
      const ::tensorflow::TensorShape& grad_shape = grad.shape();
      // The common case without building shapes: var and each per-element slot of grad's
      // shape, each per-row slot of its rows ([rows]; [] for a scalar).
      bool expected_shapes = true;
      for (int k = 0; k <= kSlots; ++k) {
        const int64_t j = k * n_ + v;
        OP_REQUIRES(ctx, HoldsValue(vars[j]), UninitializedError(ctx, j, absl::OkStatus()));
        const ::tensorflow::Tensor* t = vars[j]->tensor();
        OP_REQUIRES_OK(ctx, CheckStateDtype(j, t->dtype(), var_dtype, slot_dtype));
        expected_shapes = expected_shapes && (k > 0 && IsPerRowSlot<Rule>(k - 1)
                                                  ? IsRowsOf(t->shape(), grad_shape)
                                                  : t->shape().IsSameSize(grad_shape));
      }
      if (expected_shapes) continue;  // what ValidateDense accepts (hyper: scalars, above)
      std::array<Shape, 1 + kSlots> shapes;
      for (int k = 0; k <= kSlots; ++k) shapes[k] = ToShape(vars[k * n_ + v]->tensor()->shape());
      const std::string error = ValidateDense<Rule>(shapes[0], &shapes[1], hyper_shapes,
                                                    ToShape(grad_shape));
      OP_REQUIRES(ctx, error.empty(), absl::InvalidArgumentError(GroupMemberError(v, n_, error)));
    }
    // A member's buffers the cache cannot hold together move apart (cc/core/cache_alias.h),
    // before copy-on-write: a moved buffer is the variable's own, and is not copied again.
    if constexpr (Engine::kCpu) {
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
    std::vector<::tensorflow::Tensor*> state(num_state);
    for (int64_t j = 0; j < num_state; ++j) {
      Var* var = vars[j];
      OP_REQUIRES_OK(ctx, PrepareToUpdate<Device>(ctx, var->tensor(), var->copy_on_read_mode.load()));
      // After the copy, which adopted memory always gets (not TF's: never ref-count one).
      if (!ElementAligned(*var->tensor())) {
        OP_REQUIRES_OK(ctx, RequireElementAligned(StateName(j), *var->tensor()));
      }
      state[j] = var->tensor();
    }
    const auto params = PrepareParams<Rule, Storage>(hyper.data(), attrs_.options.data(), rounding_seed);
    OP_REQUIRES_OK(ctx, ForSlotStorage<T>(slot_dtype, [&](auto slot_storage) {
      using S = typename decltype(slot_storage)::type;
      std::vector<DenseTensor<Rule, Storage, S>> tensors(n_);
      for (int64_t v = 0; v < n_; ++v) {
        DenseTensor<Rule, Storage, S>& x = tensors[v];
        const ::tensorflow::Tensor& grad = ctx->input(first_grad + v);
        x.var = MutableData<Storage>(*state[v]);
        for (int k = 0; k < kSlots; ++k) x.slots[k] = MutableData<S>(*state[(k + 1) * n_ + v]);
        x.grad = DataOf<Storage>(grad);
        x.n = grad.NumElements();  // the variable's: validated above
        x.row_size = RowSizeOf(grad.dims(), grad.dims() == 0 ? 1 : grad.dim_size(0), x.n);
      }
      return Engine::template DenseGroup<Rule, Storage, S>(ctx, params, tensors.data(), n_,
                                                           attrs_.stochastic);
    }));
  }

 private:
  // State j's dtype: var's T; a slot's the group's one slot dtype (that of slot 0 of
  // variable 0, allowed for T).
  absl::Status CheckStateDtype(int64_t j, ::tensorflow::DataType got,
                               ::tensorflow::DataType var_dtype,
                               ::tensorflow::DataType slot_dtype) const {
    if (j < n_) {
      if (got == var_dtype) return absl::OkStatus();
      return absl::InvalidArgumentError(DtypeMismatch(StateName(j), got, var_dtype));
    }
    if (got == slot_dtype) return absl::OkStatus();
    if (!SlotStorageAllowed<T>(got)) {
      return absl::InvalidArgumentError(SlotDtypeRefused<T>(StateName(j), got));
    }
    return absl::InvalidArgumentError(StateName(j) + " has dtype " +
                                      ::tensorflow::DataTypeString(got) + " but " + StateName(n_) +
                                      " has " + ::tensorflow::DataTypeString(slot_dtype) +
                                      ": an update's slots are stored in one dtype");
  }

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
    return UninitializedVariableError(StateName(j), InputName(ctx, j), cause);
  }

  // Whether `slot` is the shape of a per-row slot beside a variable of shape `var`:
  // var.shape[:1], or [] for a scalar var (validate.h's SlotShape).
  static bool IsRowsOf(const ::tensorflow::TensorShape& slot, const ::tensorflow::TensorShape& var) {
    if (var.dims() == 0) return slot.dims() == 0;
    return slot.dims() == 1 && slot.dim_size(0) == var.dim_size(0);
  }

  // RequireElementAligned's test (dtypes checked first), per member.
  static bool ElementAligned(const ::tensorflow::Tensor& t) {
    return reinterpret_cast<uintptr_t>(t.tensor_data().data()) %
               static_cast<uintptr_t>(::tensorflow::DataTypeSize(t.dtype())) ==
           0;
  }

  int64_t n_ = 0;
  UpdateAttrs<Rule> attrs_;
};

}  // namespace tf
}  // namespace fusedopt
