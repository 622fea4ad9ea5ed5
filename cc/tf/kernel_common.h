// What every fusedopt kernel needs beside the engine: a variable's state, many
// variables' locks, the refusals worded once, raw buffers of a tensor.
#pragma once

#include <cstdint>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "cc/core/engine.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/tensor.h"

namespace fusedopt {
namespace tf {

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

// The refusal of a variable that holds no value (TF's words): `name` is the op's name for
// it ("var", "m[3]"), `input` the graph input behind it.
inline absl::Status UninitializedVariableError(const std::string& name, const std::string& input,
                                               const absl::Status& cause) {
  return absl::FailedPreconditionError(
      "Attempting to use uninitialized variable: " + name + " (" + input + ")" +
      (cause.ok() ? "" : ": " + std::string(cause.message())));
}

// The op's rounding seed (op_defs.h: a list of at most one int64 scalar); 0 without one.
inline absl::Status ReadRoundingSeed(::tensorflow::OpKernelContext* ctx, uint64_t* seed) {
  ::tensorflow::OpInputList seeds;
  TF_RETURN_IF_ERROR(ctx->input_list("rounding_seed", &seeds));
  *seed = 0;
  if (seeds.size() == 0) return absl::OkStatus();
  const ::tensorflow::Tensor& t = seeds[0];
  if (t.dims() != 0) {
    return absl::InvalidArgumentError("rounding_seed must be a scalar, got shape " +
                                      t.shape().DebugString());
  }
  *seed = static_cast<uint64_t>(t.scalar<int64_t>()());
  return absl::OkStatus();
}

// A tensor's buffer as the core's storage type (the kernels write variables in place).
// Runs `update` (a call into the CPU engine, returning a status) and turns a C++ exception
// into an error: none may leave a kernel (crossing TensorFlow's frames it ends the
// process). The engine allocates all it needs (grouping, scratch rows) before its first
// write, so an allocation refused (std::bad_alloc) leaves the variable and every slot as
// they were.
template <typename Fn>
absl::Status WithoutExceptions(Fn&& update) {
  try {
    return update();
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(kOutOfMemoryBeforeWriting);
  } catch (const std::exception& e) {
    return absl::InternalError(std::string("the update failed before writing: ") + e.what());
  }
}

template <typename Storage>
Storage* MutableData(::tensorflow::Tensor& t) {
  return reinterpret_cast<Storage*>(const_cast<char*>(t.tensor_data().data()));
}

template <typename Storage>
const Storage* DataOf(const ::tensorflow::Tensor& t) {
  return reinterpret_cast<const Storage*>(t.tensor_data().data());
}

}  // namespace tf
}  // namespace fusedopt
