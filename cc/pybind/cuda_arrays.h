// fusedopt._core_cuda's view of the caller's device arrays: __cuda_array_interface__ (or
// its dict) read into a DeviceArray, the dtype it holds, and the device that owns it
// (DeviceScope runs a call there and restores the caller's device).
#pragma once

#include <cuda_runtime.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "cc/core/validate.h"
#include "cc/pybind/common.h"

namespace fusedopt {
namespace cuda_module {

namespace py = pybind11;
using pycommon::Require;

struct DeviceArray {
  void* data = nullptr;
  bool readonly = false;
  Shape shape;
  std::string typestr;
  int64_t size = 1;
};

inline int ItemSize(const std::string& typestr) {
  return typestr.size() >= 3 ? std::stoi(typestr.substr(2)) : 0;
}

inline DeviceArray FromInterface(const py::handle& obj, const char* what) {
  py::dict d;
  if (py::hasattr(obj, "__cuda_array_interface__")) {
    d = obj.attr("__cuda_array_interface__").cast<py::dict>();
  } else if (py::isinstance<py::dict>(obj)) {
    d = obj.cast<py::dict>();
  } else {
    throw py::value_error(std::string(what) +
                          " must be a CUDA array (__cuda_array_interface__) or its dict");
  }
  DeviceArray a;
  for (auto dim : d["shape"].cast<py::tuple>()) a.shape.push_back(dim.cast<int64_t>());
  for (int64_t dim : a.shape) a.size *= dim;
  a.typestr = d["typestr"].cast<std::string>();
  const py::tuple data = d["data"].cast<py::tuple>();
  a.data = reinterpret_cast<void*>(data[0].cast<uintptr_t>());
  a.readonly = data[1].cast<bool>();
  // Every load of the kernels assumes it (a misaligned one is a sticky CUDA error).
  const int item = ItemSize(a.typestr);
  Require(item <= 1 || reinterpret_cast<uintptr_t>(a.data) % static_cast<uintptr_t>(item) == 0,
          std::string(what) + " is not aligned to its " + std::to_string(item) + "-byte elements");
  Require(!d.contains("mask") || d["mask"].is_none(), std::string(what) + " must not be masked");
  if (d.contains("strides") && !d["strides"].is_none()) {
    // C-contiguous, ignoring the strides of dimensions of size 1.
    int64_t expected = ItemSize(a.typestr);
    const py::tuple strides = d["strides"].cast<py::tuple>();
    bool contiguous = strides.size() == a.shape.size();
    for (int i = static_cast<int>(a.shape.size()) - 1; contiguous && i >= 0; --i) {
      if (a.shape[i] != 1 && strides[i].cast<int64_t>() != expected) contiguous = false;
      expected *= a.shape[i];
    }
    Require(contiguous || a.size == 0, "arrays must be C-contiguous");
  }
  return a;
}

// NumPy-style dtype name of a storage array; 2-byte arrays are float16 unless the
// caller says bfloat16 (CUDA array interfaces have no bfloat16 typestr: pass its bits as
// uint16/int16 with dtype="bfloat16").
inline std::string DtypeName(const DeviceArray& a, const std::string& dtype) {
  const std::string kind = a.typestr.substr(1);
  if (dtype == "bfloat16") {
    Require(kind == "u2" || kind == "i2" || kind == "V2" || kind == "f2",
            "dtype='bfloat16' needs 2-byte arrays, got typestr " + a.typestr);
    return "bfloat16";
  }
  if (kind == "f2") return "float16";
  if (kind == "f4") return "float32";
  if (kind == "f8") return "float64";
  return "typestr " + a.typestr;
}

[[noreturn]] void ThrowCuda(cudaError_t err, const std::string& what) {
  cudaGetLastError();
  throw std::runtime_error("CUDA error in fusedopt " + what + ": " + cudaGetErrorName(err) +
                           ": " + cudaGetErrorString(err));
}

// Runs the calls on the device owning var, restoring the caller's device afterwards.
// The CUDA device owning ptr; ValueError when it is not device (or managed) memory. The
// pointer is asked first: without a usable driver no memory is CUDA memory, and that is the
// caller's ValueError, not a CUDA failure.
inline int DeviceOf(const void* ptr, const std::string& what) {
  cudaPointerAttributes attributes{};
  const cudaError_t err = cudaPointerGetAttributes(&attributes, ptr);
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw py::value_error(what + " is not CUDA memory: " + cudaGetErrorString(err));
  }
  Require(attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged,
          what + " must be device (or managed) memory");
  return attributes.device;
}

class DeviceScope {
 public:
  explicit DeviceScope(const void* ptr) : device_(DeviceOf(ptr, "var")) {
    cudaError_t err = cudaGetDevice(&previous_);
    if (err != cudaSuccess) ThrowCuda(err, "cudaGetDevice");
    if (device_ != previous_) {
      err = cudaSetDevice(device_);
      if (err != cudaSuccess) ThrowCuda(err, "cudaSetDevice");
      switched_ = true;
    }
  }
  ~DeviceScope() {
    if (switched_ && cudaSetDevice(previous_) != cudaSuccess) cudaGetLastError();
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

  int device() const { return device_; }

 private:
  int device_;
  int previous_ = 0;
  bool switched_ = false;
};

}  // namespace cuda_module
}  // namespace fusedopt
