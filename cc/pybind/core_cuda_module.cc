// fusedopt._core_cuda: the core's CUDA engine applied in place to device arrays, with no
// TensorFlow in the process (the GPU test harness, tools/gpu_check.sh, and raw-kernel
// benchmarks). Same calls as fusedopt._core; arrays are anything exposing
// __cuda_array_interface__ (CuPy, PyTorch, Numba) or that interface's dict itself
// (raw pointers: {"data": (ptr, False), "shape": (...), "typestr": "<f4"}).
//
// Work runs on `stream` (a cudaStream_t as an int; 0 = the legacy default stream, which
// is CuPy's default). Dense calls return without synchronising. Sparse calls never
// synchronise inside the engine either: with wait=False they return a PendingCheck at
// once (its result() raises ValueError for an out-of-range index, in which case nothing
// was written); the default wait=True waits for it, so bad indices raise at the call.
#include <cuda_runtime.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "cc/core/gpu/engine_gpu.h"
#include "cc/core/validate.h"
#include "cc/pybind/common.h"

namespace py = pybind11;

namespace fusedopt {
namespace {

using pycommon::Dispatch;
using pycommon::ParamsFromDicts;
using pycommon::Require;
using pycommon::Rules;

struct DeviceArray {
  void* data = nullptr;
  bool readonly = false;
  Shape shape;
  std::string typestr;
  int64_t size = 1;
};

int ItemSize(const std::string& typestr) {
  return typestr.size() >= 3 ? std::stoi(typestr.substr(2)) : 0;
}

DeviceArray FromInterface(const py::handle& obj, const char* what) {
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
std::string DtypeName(const DeviceArray& a, const std::string& dtype) {
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
int DeviceOf(const void* ptr, const std::string& what) {
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

// Page-locked IndexCheck records for the device to copy sparse calls' verdicts into.
// A record is reused only after the event recorded behind its call has completed, so a
// PendingCheck dropped early never sees another call's verdict, and nothing here waits.
class CheckRecords {
 public:
  static CheckRecords& Get() {
    static CheckRecords* records = new CheckRecords();  // never destroyed: outlives CUDA
    return *records;
  }

  gpu::IndexCheck* Take() {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < retired_.size();) {
      const cudaError_t state = cudaEventQuery(retired_[i].second);
      if (state == cudaErrorNotReady) {
        ++i;
        continue;
      }
      cudaGetLastError();
      cudaEventDestroy(retired_[i].second);
      if (state == cudaSuccess) free_.push_back(retired_[i].first);  // else: never reused
      retired_[i] = retired_.back();
      retired_.pop_back();
    }
    if (free_.empty()) {
      constexpr int kPerPage = 4096 / sizeof(gpu::IndexCheck);
      void* page = nullptr;
      const cudaError_t err = cudaHostAlloc(&page, kPerPage * sizeof(gpu::IndexCheck),
                                            cudaHostAllocPortable);
      if (err != cudaSuccess) ThrowCuda(err, "cudaHostAlloc (index check records)");
      auto* records = static_cast<gpu::IndexCheck*>(page);
      for (int i = 0; i < kPerPage; ++i) free_.push_back(records + i);
    }
    gpu::IndexCheck* record = free_.back();
    free_.pop_back();
    return record;
  }

  // `event` (nullptr: nothing was enqueued) marks when the device is done with `record`.
  void Return(gpu::IndexCheck* record, cudaEvent_t event) {
    std::lock_guard<std::mutex> lock(mu_);
    if (event == nullptr) {
      free_.push_back(record);
    } else {
      retired_.emplace_back(record, event);
    }
  }

 private:
  std::mutex mu_;
  std::vector<gpu::IndexCheck*> free_;
  std::vector<std::pair<gpu::IndexCheck*, cudaEvent_t>> retired_;
};

// The outcome of a sparse call still running on its stream.
class PendingCheck {
 public:
  PendingCheck(gpu::IndexCheck* record, cudaEvent_t event, int64_t num_rows)
      : record_(record), event_(event), num_rows_(num_rows) {}
  ~PendingCheck() { CheckRecords::Get().Return(record_, event_); }
  PendingCheck(const PendingCheck&) = delete;
  PendingCheck& operator=(const PendingCheck&) = delete;

  // True once the stream has run the whole call (no waiting).
  bool Done() const {
    if (event_ == nullptr) return true;
    const cudaError_t state = cudaEventQuery(event_);
    if (state == cudaErrorNotReady) return false;
    if (state != cudaSuccess) ThrowCuda(state, "sparse update");
    return true;
  }

  // Waits for the call; ValueError naming the first out-of-range index (nothing written).
  void Result() const {
    if (event_ != nullptr) {
      cudaError_t err;
      {
        py::gil_scoped_release release;
        err = cudaEventSynchronize(event_);
      }
      if (err != cudaSuccess) ThrowCuda(err, "sparse update");
    }
    const gpu::Status status = gpu::IndexCheckStatus(*record_, num_rows_);
    if (!status.ok()) throw py::value_error(status.message);
  }

 private:
  gpu::IndexCheck* record_;
  cudaEvent_t event_;
  int64_t num_rows_;
};

// Stream-ordered scratch memory: freed on the same stream after the work that uses it.
class AsyncAllocator final : public gpu::TempAllocator {
 public:
  explicit AsyncAllocator(cudaStream_t stream) : stream_(stream) {}
  ~AsyncAllocator() override {
    for (void* p : blocks_) cudaFreeAsync(p, stream_);
  }
  void* Allocate(size_t bytes) override {
    void* p = nullptr;
    if (cudaMallocAsync(&p, bytes > 0 ? bytes : 1, stream_) != cudaSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    blocks_.push_back(p);
    return p;
  }

 private:
  cudaStream_t stream_;
  std::vector<void*> blocks_;
};

void Check(const gpu::Status& s) {
  if (s.ok()) return;
  if (s.code == gpu::Status::kInvalidArgument) throw py::value_error(s.message);
  if (s.code == gpu::Status::kResourceExhausted) {
    PyErr_SetString(PyExc_MemoryError, s.message.c_str());
    throw py::error_already_set();
  }
  throw std::runtime_error(s.message);
}

struct State {
  DeviceArray var, grad;
  std::vector<DeviceArray> slots;
  std::string dtype;
};

template <typename Rule>
State CheckState(const py::handle& var, const py::list& slots, const py::handle& grad,
                 const Shape& indices_shape, bool sparse, const std::string& dtype) {
  constexpr int kSlots = NumSlots<Rule>();
  Require(static_cast<int>(slots.size()) == kSlots,
          std::string(Rule::kPyName) + " needs " + std::to_string(kSlots) + " slot arrays");
  State state;
  state.var = FromInterface(var, "var");
  state.grad = FromInterface(grad, "grad");
  std::vector<Shape> slot_shapes;
  for (auto s : slots) {
    state.slots.push_back(FromInterface(s, "slot"));
    slot_shapes.push_back(state.slots.back().shape);
  }
  Require(!state.var.readonly, "var and slots must be writeable");
  for (const auto& s : state.slots) {
    Require(!s.readonly, "var and slots must be writeable");
    Require(s.typestr == state.var.typestr, "var, slots and grad must share one dtype");
  }
  Require(state.grad.typestr == state.var.typestr, "var, slots and grad must share one dtype");
  state.dtype = DtypeName(state.var, dtype);
  const std::vector<Shape> hyper(NumHyper<Rule>());  // Python numbers: scalars
  const std::string error =
      sparse ? ValidateSparse<Rule>(state.var.shape, slot_shapes.data(), hyper.data(),
                                    state.grad.shape, indices_shape)
             : ValidateDense<Rule>(state.var.shape, slot_shapes.data(), hyper.data(),
                                   state.grad.shape);
  Require(error.empty(), error);
  return state;
}

template <typename T, int kSlots>
std::array<T*, kSlots> SlotPointers(const State& state) {
  std::array<T*, kSlots> out;
  for (int k = 0; k < kSlots; ++k) out[k] = static_cast<T*>(state.slots[k].data);
  return out;
}

std::string PeekDtype(const py::handle& var, const std::string& dtype) {
  return DtypeName(FromInterface(var, "var"), dtype);
}

void ApplyDensePy(const std::string& rule, const py::handle& var, const py::list& slots,
                  const py::handle& grad, const py::dict& hyper, const py::dict& options,
                  uintptr_t stream, const std::string& dtype) {
  Dispatch(rule, PeekDtype(var, dtype), [&]<typename Rule, typename T>() {
    const State state = CheckState<Rule>(var, slots, grad, {}, false, dtype);
    const auto params = ParamsFromDicts<Rule, T>(hyper, options);
    if (state.var.size == 0) return;
    auto slot_ptrs = SlotPointers<T, NumSlots<Rule>()>(state);
    DeviceScope scope(state.var.data);
    gpu::Status status;
    {
      py::gil_scoped_release release;
      status = gpu::ApplyDense<Rule, T>(params, static_cast<T*>(state.var.data), slot_ptrs.data(),
                                        static_cast<const T*>(state.grad.data), state.var.size,
                                        reinterpret_cast<gpu::Stream>(stream));
    }
    Check(status);
  });
}

struct ByteSpan {
  uintptr_t begin, end;
  int64_t member;
  int state;  // 0: var, k + 1: slot k, -1: grad
};

// Group calls: vars[i] with slots[k][i] and grads[i], one multi-tensor launch per
// gpu::kMaxGroupTensorsPerLaunch members. Everything is checked before anything is enqueued:
// each member as apply_dense checks it ("variable i of n: ..."), one dtype and one device
// for all, and no written buffer (a var or slot) overlapping any other buffer of the group.
void ApplyDenseGroupPy(const std::string& rule, const py::sequence& vars,
                       const py::sequence& slots, const py::sequence& grads,
                       const py::dict& hyper, const py::dict& options, uintptr_t stream,
                       const std::string& dtype) {
  const int64_t n = static_cast<int64_t>(vars.size());
  Require(static_cast<int64_t>(grads.size()) == n,
          "vars and grads must have one entry per variable, got " + std::to_string(n) + " and " +
              std::to_string(grads.size()));
  if (n == 0) return;
  Dispatch(rule, PeekDtype(vars[0], dtype), [&]<typename Rule, typename T>() {
    constexpr int kSlots = NumSlots<Rule>();
    Require(static_cast<int>(slots.size()) == kSlots,
            std::string(Rule::kPyName) + " needs " + std::to_string(kSlots) +
                " slot lists (one per slot, each with an entry per variable)");
    std::vector<py::sequence> slot_lists;
    for (int k = 0; k < kSlots; ++k) {
      slot_lists.push_back(slots[k].cast<py::sequence>());
      Require(static_cast<int64_t>(slot_lists[k].size()) == n,
              std::string(Rule::kSlots[k]) + " has " + std::to_string(slot_lists[k].size()) +
                  " entries for " + std::to_string(n) + " variables");
    }
    std::vector<State> states;
    states.reserve(n);
    for (int64_t i = 0; i < n; ++i) {
      py::list member_slots;
      for (int k = 0; k < kSlots; ++k) member_slots.append(slot_lists[k][i]);
      try {
        states.push_back(CheckState<Rule>(vars[i], member_slots, grads[i], {}, false, dtype));
        Require(states.back().dtype == states.front().dtype,
                "dtype " + states.back().dtype + " differs from variable 0's " +
                    states.front().dtype + " (one group, one dtype)");
      } catch (const py::value_error& e) {
        throw py::value_error("variable " + std::to_string(i) + " of " + std::to_string(n) +
                              ": " + e.what());
      }
    }
    const auto params = ParamsFromDicts<Rule, T>(hyper, options);
    std::vector<ByteSpan> spans;
    const void* first = nullptr;
    for (int64_t i = 0; i < n; ++i) {
      if (states[i].var.size == 0) continue;
      const uintptr_t bytes = static_cast<uintptr_t>(states[i].var.size) * sizeof(T);
      auto add = [&](const void* data, int state) {
        spans.push_back({reinterpret_cast<uintptr_t>(data),
                         reinterpret_cast<uintptr_t>(data) + bytes, i, state});
      };
      add(states[i].var.data, 0);
      for (int k = 0; k < kSlots; ++k) add(states[i].slots[k].data, k + 1);
      add(states[i].grad.data, -1);
      if (first == nullptr) first = states[i].var.data;
    }
    if (first == nullptr) return;  // every member is empty
    auto name = [&](const ByteSpan& x) {
      return std::string(x.state == 0 ? "var" : x.state < 0 ? "grad" : Rule::kSlots[x.state - 1]) +
             "[" + std::to_string(x.member) + "]";
    };
    std::sort(spans.begin(), spans.end(),
              [](const ByteSpan& a, const ByteSpan& b) { return a.begin < b.begin; });
    // Sorted by start, a span overlaps an earlier one iff it starts before the furthest end
    // seen so far; two grads may share memory (both only read).
    const ByteSpan* furthest_written = nullptr;
    const ByteSpan* furthest_any = nullptr;
    for (const ByteSpan& x : spans) {
      const ByteSpan* other = x.state < 0 ? furthest_written : furthest_any;
      if (other != nullptr && x.begin < other->end) {
        throw py::value_error(name(*other) + " and " + name(x) +
                              " overlap in memory; every var and slot needs its own array");
      }
      if (x.state >= 0 && (furthest_written == nullptr || x.end > furthest_written->end)) {
        furthest_written = &x;
      }
      if (furthest_any == nullptr || x.end > furthest_any->end) furthest_any = &x;
    }
    DeviceScope scope(first);
    for (const ByteSpan& x : spans) {
      Require(DeviceOf(reinterpret_cast<const void*>(x.begin), name(x)) == scope.device(),
              name(x) + " is on another device than the group's first var");
    }
    std::vector<DenseTensor<Rule, T>> tensors(n);
    for (int64_t i = 0; i < n; ++i) {
      tensors[i].var = static_cast<T*>(states[i].var.data);
      for (int k = 0; k < kSlots; ++k) tensors[i].slots[k] = static_cast<T*>(states[i].slots[k].data);
      tensors[i].grad = static_cast<const T*>(states[i].grad.data);
      tensors[i].n = states[i].var.size;
    }
    gpu::Status status;
    {
      py::gil_scoped_release release;
      status = gpu::ApplyDenseGroup<Rule, T>(params, tensors.data(), n,
                                             reinterpret_cast<gpu::Stream>(stream));
    }
    Check(status);
  });
}

std::unique_ptr<PendingCheck> ApplySparsePy(const std::string& rule, const py::handle& var,
                                            const py::list& slots, const py::handle& grad,
                                            const py::handle& indices_obj, const py::dict& hyper,
                                            const py::dict& options, uintptr_t stream,
                                            const std::string& dtype, bool wait) {
  const DeviceArray indices = FromInterface(indices_obj, "indices");
  const std::string index_kind = indices.typestr.substr(1);
  Require(index_kind == "i4" || index_kind == "i8",
          "indices must be int32 or int64, got typestr " + indices.typestr);
  std::unique_ptr<PendingCheck> pending;
  Dispatch(rule, PeekDtype(var, dtype), [&]<typename Rule, typename T>() {
    const State state = CheckState<Rule>(var, slots, grad, indices.shape, true, dtype);
    const auto params = ParamsFromDicts<Rule, T>(hyper, options);
    const int64_t rows = state.var.shape[0];
    const int64_t row_size = rows == 0 ? 0 : state.var.size / rows;
    const int64_t n = indices.size;
    gpu::IndexCheck* record = CheckRecords::Get().Take();
    if (n == 0) {  // nothing to check, nothing to write
      *record = gpu::IndexCheck{};
      pending = std::make_unique<PendingCheck>(record, nullptr, rows);
      return;
    }
    auto slot_ptrs = SlotPointers<T, NumSlots<Rule>()>(state);
    // Zero-size var: no device buffer to find the device by; use the indices'.
    std::unique_ptr<DeviceScope> scope;
    try {
      scope = std::make_unique<DeviceScope>(state.var.size > 0 ? state.var.data : indices.data);
    } catch (...) {
      CheckRecords::Get().Return(record, nullptr);
      throw;
    }
    const auto cuda_stream = reinterpret_cast<cudaStream_t>(stream);
    gpu::Status status;
    cudaEvent_t event = nullptr;
    {
      py::gil_scoped_release release;
      AsyncAllocator allocator(cuda_stream);
      auto run = [&](auto* index_ptr) {
        using Index = std::remove_const_t<std::remove_pointer_t<decltype(index_ptr)>>;
        return gpu::ApplySparse<Rule, T, Index>(
            params, static_cast<T*>(state.var.data), slot_ptrs.data(), rows, row_size,
            static_cast<const T*>(state.grad.data), index_ptr, n, allocator,
            reinterpret_cast<gpu::Stream>(cuda_stream), record);
      };
      status = index_kind == "i4" ? run(static_cast<const int32_t*>(indices.data))
                                  : run(static_cast<const int64_t*>(indices.data));
      // Whatever was enqueued (even before a failure) may still write the record: it is
      // reused only once this event completes.
      if (cudaEventCreateWithFlags(&event, cudaEventDisableTiming) != cudaSuccess ||
          cudaEventRecord(event, cuda_stream) != cudaSuccess) {
        cudaGetLastError();
        if (event != nullptr) cudaEventDestroy(event);
        event = nullptr;
        if (status.ok()) status = {gpu::Status::kInternal, "fusedopt: could not record a CUDA event"};
        record = nullptr;  // its copy may still be in flight: never reused
      }
    }
    if (record == nullptr) Check(status);
    pending = std::make_unique<PendingCheck>(record, event, rows);
    Check(status);
  });
  if (wait) {
    pending->Result();
    return nullptr;
  }
  return pending;
}

}  // namespace
}  // namespace fusedopt

PYBIND11_MODULE(_core_cuda, m) {
  using namespace fusedopt;
  m.doc() = "fusedopt's CUDA update kernels applied in place to CUDA device arrays.";
  m.def("rules", &Rules, "Rule metadata: slots, hyper-parameters and options of every rule.");
  m.def(
      "device_count",
      [] {
        int count = 0;
        return gpu::DeviceCount(&count).ok() ? count : 0;
      },
      "CUDA devices visible (0 without a GPU or a working driver: see cuda_init_error()).");
  m.def(
      "cuda_init_error",
      [] {
        int count = 0;
        return gpu::DeviceCount(&count).message;
      },
      "'' when CUDA initialises (with or without devices), else the CUDA error that stopped "
      "it (no driver, a driver too old for this CUDA 13 runtime, ...).");
  m.def("apply_dense", &ApplyDensePy, py::arg("rule"), py::arg("var"), py::arg("slots"),
        py::arg("grad"), py::arg("hyper"), py::arg("options") = py::dict(),
        py::arg("stream") = 0, py::arg("dtype") = "",
        "Dense update of var and slots in place, enqueued on `stream`.");
  m.def("apply_dense_group", &ApplyDenseGroupPy, py::arg("rule"), py::arg("vars"),
        py::arg("slots"), py::arg("grads"), py::arg("hyper"), py::arg("options") = py::dict(),
        py::arg("stream") = 0, py::arg("dtype") = "",
        "Dense updates of many variables in place with the same hyper-parameters, enqueued on "
        "`stream` as multi-tensor launches (the group op's engine). slots: one list per slot, "
        "each with an entry per variable. Each variable's result equals apply_dense's.");
  py::class_<PendingCheck>(m, "PendingCheck",
                           "A sparse update enqueued with wait=False: its index check's verdict.")
      .def("done", &PendingCheck::Done, "True once the stream has run the whole call (no wait).")
      .def("result", &PendingCheck::Result,
           "Waits for the call; ValueError naming the first out-of-range index, in which "
           "case var and slots were not written.");
  m.def("apply_sparse", &ApplySparsePy, py::arg("rule"), py::arg("var"), py::arg("slots"),
        py::arg("grad"), py::arg("indices"), py::arg("hyper"), py::arg("options") = py::dict(),
        py::arg("stream") = 0, py::arg("dtype") = "", py::arg("wait") = true,
        "Sparse update of the rows named by indices (duplicates summed first), in place. "
        "Never synchronises while enqueueing; wait=True (default) then waits and raises "
        "ValueError for an out-of-range index (nothing written); wait=False returns a "
        "PendingCheck at once.");
}
