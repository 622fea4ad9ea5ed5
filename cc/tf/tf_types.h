// The element types the ops take, in one list, and the TF -> core type and shape mapping.
// The op definitions, the kernel registrations (CPU, GPU, XLA) and fusedopt's Python
// front ends (which read the op definition) all follow StorageTypes.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "cc/core/numeric.h"
#include "cc/core/validate.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.h"

namespace fusedopt {
namespace tf {

template <typename... Ts>
struct TypeList {};
template <typename T>
struct TypeTag {
  using type = T;
};

// The variable dtypes every op takes (16-bit types compute in float32).
using StorageTypes = TypeList<Eigen::half, ::tensorflow::bfloat16, float, double>;

// f(TypeTag<T>{}) for every T of the list, in order.
template <typename F, typename... Ts>
void ForEachType(TypeList<Ts...>, F&& f) {
  (f(TypeTag<Ts>{}), ...);
}

// The sparse ops' index dtypes.
using IndexTypes = TypeList<int32_t, int64_t>;

template <typename... Ts>
std::vector<::tensorflow::DataType> DataTypesOf(TypeList<Ts...>) {
  return {::tensorflow::DataTypeToEnum<Ts>::value...};
}

inline const std::vector<::tensorflow::DataType>& StorageDataTypes() {
  static const auto* types = new std::vector<::tensorflow::DataType>(DataTypesOf(StorageTypes{}));
  return *types;
}

inline const std::vector<::tensorflow::DataType>& IndexDataTypes() {
  static const auto* types = new std::vector<::tensorflow::DataType>(DataTypesOf(IndexTypes{}));
  return *types;
}

// An op definition's type attribute: "T: {half, bfloat16, float, double}".
inline std::string TypeAttr(const std::string& name,
                            const std::vector<::tensorflow::DataType>& types) {
  std::string attr = name + ": {";
  for (size_t i = 0; i < types.size(); ++i) {
    attr += (i ? ", " : "") + ::tensorflow::DataTypeString(types[i]);
  }
  return attr + "}";
}

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

inline Shape ToShape(const ::tensorflow::TensorShape& s) {
  Shape out(s.dims());
  for (int i = 0; i < s.dims(); ++i) out[i] = s.dim_size(i);
  return out;
}

// "<name> has dtype <got> but the update is for <want>": every kernel's dtype refusal.
inline std::string DtypeMismatch(const std::string& name, ::tensorflow::DataType got,
                                 ::tensorflow::DataType want) {
  return name + " has dtype " + ::tensorflow::DataTypeString(got) + " but the update is for " +
         ::tensorflow::DataTypeString(want);
}

// Slot storage: the slots of an update share one dtype, var's own or, for a float32 var,
// bfloat16 or half (compact slots: numeric.h). Every kernel and engine follows this.
template <typename T>
bool SlotStorageAllowed(::tensorflow::DataType slot) {
  if (slot == ::tensorflow::DataTypeToEnum<T>::value) return true;
  return std::is_same_v<T, float> &&
         (slot == ::tensorflow::DT_BFLOAT16 || slot == ::tensorflow::DT_HALF);
}

template <typename T>
std::string SlotDtypeRefused(const std::string& name, ::tensorflow::DataType got) {
  const ::tensorflow::DataType want = ::tensorflow::DataTypeToEnum<T>::value;
  std::string message = DtypeMismatch(name, got, want);
  if (std::is_same_v<T, float>) return message + " (slots may be float, bfloat16 or half)";
  if (got == ::tensorflow::DT_BFLOAT16 || got == ::tensorflow::DT_HALF) {
    return message + " (bfloat16/half slots are for float32 variables)";
  }
  return message;
}

// f(TypeTag<S>{}) with S the core storage type of `slot` (allowed for T: above); returns
// what f returns.
template <typename T, typename F>
absl::Status ForSlotStorage(::tensorflow::DataType slot, F&& f) {
  if constexpr (std::is_same_v<T, float>) {
    if (slot == ::tensorflow::DT_BFLOAT16) return f(TypeTag<bfloat16_t>{});
    if (slot == ::tensorflow::DT_HALF) return f(TypeTag<half_t>{});
  }
  if (slot != ::tensorflow::DataTypeToEnum<T>::value) {
    return absl::InvalidArgumentError(SlotDtypeRefused<T>("slot", slot));
  }
  return f(TypeTag<typename StorageOf<T>::type>{});
}

}  // namespace tf
}  // namespace fusedopt
