// The XLA kernels' shared part (xla_kernels.cc is their one translation unit: XLA's
// headers are slow to compile): XLA's headers, the custom-call targets, input shapes and
// the compile-time check of distinct variables, used by both lowerings.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>
#include "cc/core/engine.h"
#include "cc/core/rules/all_rules.h"
#include "cc/core/sum_order.h"
#include "cc/core/validate.h"
#include "cc/tf/op_defs.h"
#include "cc/tf/tf_types.h"
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
#if __has_include("xla/ffi/api/ffi.h")
#define FUSEDOPT_XLA_FFI 1
#include "xla/ffi/api/ffi.h"
namespace xla::ffi {
const XLA_FFI_Api* GetXlaFfiApi();  // exported by libtensorflow_cc (its header needs MLIR's)
}  // namespace xla::ffi
#endif

namespace fusedopt {
namespace tf {
namespace xla_impl {

namespace tfw = ::tensorflow;

// ---------------------------------------------------------------------------------------
// Shared by both lowerings.

inline xla::PrimitiveType ComputeTypeOf(xla::PrimitiveType storage) {
  return storage == xla::F64 ? xla::F64 : xla::F32;  // half/bfloat16 compute in float32
}

inline std::string CustomCallTarget(const std::string& rule, bool sparse) {
  return std::string("fusedopt_") + rule + (sparse ? "_sparse" : "_dense");
}

inline std::string GroupCustomCallTarget(const std::string& rule) {
  return std::string("fusedopt_") + rule + "_group";
}

// The custom call needs XLA:CPU's typed FFI; FUSEDOPT_XLA_LOWERING=hlo picks the HLO
// lowering there too (tests compare the two). Read when a step compiles.
inline bool UseCustomCall(bool on_cpu) {
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
inline Shape InputShape(tfw::XlaOpKernelContext* ctx, int input, absl::Status* status) {
  const absl::StatusOr<xla::Shape> shape = ctx->InputXlaShape(input);
  if (!shape.ok()) {
    *status = shape.status();
    return {};
  }
  return Shape(shape->dimensions().begin(), shape->dimensions().end());
}

// The CPU kernels' dtype rules (tf_types.h, apply_kernel.h, group_kernel.h) for an op whose
// T is known only at run time: var of T; every slot of one storage dtype, T's own or, for a
// float32 var, bfloat16 or half (compact slots). Same words; "" when fine. `name`/`first_name`
// name the state input and the first slot ("m", "m[0]").
inline std::string VarDtypeError(tfw::DataType t, const std::string& name, tfw::DataType got) {
  return got == t ? std::string() : DtypeMismatch(name, got, t);
}

inline std::string SlotDtypeError(tfw::DataType t, const std::string& name, tfw::DataType got,
                                  const std::string& first_name, tfw::DataType first) {
  std::string error;
  ForEachType(StorageTypes{}, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (tfw::DataTypeToEnum<T>::value == t && !SlotStorageAllowed<T>(got)) {
      error = SlotDtypeRefused<T>(name, got);
    }
  });
  if (!error.empty() || got == first) return error;
  return name + " has dtype " + tfw::DataTypeString(got) + " but " + first_name + " has " +
         tfw::DataTypeString(first) + ": an update's slots are stored in one dtype";
}

// XLA's element type of a TF dtype (the op's dtypes are all XLA types).
inline xla::PrimitiveType PrimitiveTypeOf(tfw::DataType dtype, absl::Status* status) {
  xla::PrimitiveType type = xla::PRIMITIVE_TYPE_INVALID;
  const absl::Status s = tfw::DataTypeToPrimitiveType(dtype, &type);
  if (!s.ok()) *status = s;
  return type;
}

// The custom call's options operand (both lowerings' kernels read the attributes): one
// byte per rule option, then one for stochastic_rounding.
template <typename Rule>
std::vector<uint8_t> OptionBytes(const bool* options, bool stochastic) {
  std::vector<uint8_t> bytes(NumOptions<Rule>() + 1, 0);
  for (int i = 0; i < NumOptions<Rule>(); ++i) bytes[i] = options[i] ? 1 : 0;
  bytes[NumOptions<Rule>()] = stochastic ? 1 : 0;
  return bytes;
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

}  // namespace xla_impl
}  // namespace tf
}  // namespace fusedopt
