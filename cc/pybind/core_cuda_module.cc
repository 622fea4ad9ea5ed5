// fusedopt._core_cuda: the core's CUDA engine applied in place to device arrays, with no
// TensorFlow in the process (the GPU test harness, tools/gpu_check.sh, and raw-kernel
// benchmarks). Same calls as fusedopt._core; arrays are anything exposing
// __cuda_array_interface__ (CuPy, PyTorch, Numba) or that interface's dict itself
// (raw pointers: {"data": (ptr, False), "shape": (...), "typestr": "<f4"}).
//
// Slots have var's dtype or, beside a float32 var, all bfloat16 or all float16 (compact
// slots, rounded once on store; stochastic_rounding=True: stochastically, the CPU engine's
// bits). A slot's dtype is its typestr's, bfloat16 where dtype="bfloat16" names var's 2-byte
// arrays so, or where slot_dtype="bfloat16" names the slots' (CUDA array interfaces have no
// bfloat16 typestr: its bits travel as 2-byte integers).
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
#include "cc/pybind/cuda_arrays.h"
#include "cc/pybind/cuda_checks.h"

namespace py = pybind11;

// Beside the device-array view it is built from (cuda_arrays.h, cuda_checks.h).
namespace fusedopt::cuda_module {
namespace {

using pycommon::Dispatch;
using pycommon::ForSlotStorage;
using pycommon::ParamsFromDicts;
using pycommon::Require;
using pycommon::StochasticRounding;
using pycommon::RoundingSeed;

struct State {
  DeviceArray var, grad;
  std::vector<DeviceArray> slots;
  std::string dtype;
  std::string slot_dtype;  // the slots' one dtype: var's, or bfloat16/float16 beside float32
};

// A slot's dtype name: its typestr's; bfloat16 for 2-byte arrays where slot_dtype says so,
// or, slot_dtype empty, where dtype does (var's 2-byte arrays are bfloat16: so are slots).
std::string SlotDtypeName(const DeviceArray& slot, const std::string& name,
                          const std::string& dtype, const std::string& slot_dtype) {
  const std::string named = slot_dtype.empty() ? dtype : slot_dtype;
  const std::string kind = slot.typestr.substr(1);
  const bool two_bytes = kind == "u2" || kind == "i2" || kind == "V2" || kind == "f2";
  if (named == "bfloat16") {
    Require(two_bytes || slot_dtype.empty(), "slot_dtype='bfloat16' needs 2-byte arrays, but " +
                                                  name + " has typestr " + slot.typestr);
    if (two_bytes) return "bfloat16";
  }
  const std::string got = DtypeName(slot, "");
  Require(slot_dtype.empty() || slot_dtype == "bfloat16" || got == slot_dtype,
          "slot_dtype='" + slot_dtype + "' but " + name + " has typestr " + slot.typestr);
  return got;
}

template <typename Rule>
State CheckState(const py::handle& var, const py::list& slots, const py::handle& grad,
                 const Shape& indices_shape, bool sparse, const std::string& dtype,
                 const std::string& slot_dtype) {
  constexpr int kSlots = NumSlots<Rule>();
  Require(static_cast<int>(slots.size()) == kSlots,
          PyName<Rule>() + " needs " + std::to_string(kSlots) + " slot arrays");
  State state;
  state.var = FromInterface(var, "var");
  state.grad = FromInterface(grad, "grad");
  std::vector<Shape> slot_shapes;
  for (auto s : slots) {
    state.slots.push_back(FromInterface(s, "slot"));
    slot_shapes.push_back(state.slots.back().shape);
  }
  Require(!state.var.readonly, "var and slots must be writeable");
  for (const auto& s : state.slots) Require(!s.readonly, "var and slots must be writeable");
  Require(state.grad.typestr == state.var.typestr,
          "grad has typestr " + state.grad.typestr + " but var " + state.var.typestr +
              ": var and grad must share one dtype");
  state.dtype = DtypeName(state.var, dtype);
  std::vector<std::string> slot_names, slot_dtypes;
  for (int k = 0; k < kSlots; ++k) {
    slot_names.push_back(Rule::kSlots[k].name);
    slot_dtypes.push_back(SlotDtypeName(state.slots[k], slot_names[k], dtype, slot_dtype));
  }
  state.slot_dtype = pycommon::SlotDtype(state.dtype, slot_names, slot_dtypes);
  const std::vector<Shape> hyper(NumHyper<Rule>());  // Python numbers: scalars
  const std::string error =
      sparse ? ValidateSparse<Rule>(state.var.shape, slot_shapes.data(), hyper.data(),
                                    state.grad.shape, indices_shape)
             : ValidateDense<Rule>(state.var.shape, slot_shapes.data(), hyper.data(),
                                   state.grad.shape);
  Require(error.empty(), error);
  return state;
}

template <typename S, int kSlots>
std::array<S*, kSlots> SlotPointers(const State& state) {
  std::array<S*, kSlots> out;
  for (int k = 0; k < kSlots; ++k) out[k] = static_cast<S*>(state.slots[k].data);
  return out;
}

// slot_dtype: "" (from the slots' typestrs) or a dtype name.
void CheckSlotDtypeArg(const std::string& slot_dtype) {
  Require(slot_dtype.empty() || slot_dtype == "float16" || slot_dtype == "bfloat16" ||
              slot_dtype == "float32" || slot_dtype == "float64",
          "unsupported slot_dtype " + slot_dtype + " (float16, bfloat16, float32, float64)");
}

std::string PeekDtype(const py::handle& var, const std::string& dtype) {
  return DtypeName(FromInterface(var, "var"), dtype);
}

void ApplyDensePy(const std::string& rule, const py::handle& var, const py::list& slots,
                  const py::handle& grad, const py::dict& hyper, const py::dict& options,
                  uintptr_t stream, const std::string& dtype, const std::string& slot_dtype,
                  const py::object& stochastic_rounding, const py::object& rounding_seed) {
  CheckSlotDtypeArg(slot_dtype);
  const bool stochastic = StochasticRounding(stochastic_rounding);
  const uint64_t seed = RoundingSeed(rounding_seed, stochastic);
  Dispatch(rule, PeekDtype(var, dtype), [&]<typename Rule, typename T>() {
    const State state = CheckState<Rule>(var, slots, grad, {}, false, dtype, slot_dtype);
    const auto params = ParamsFromDicts<Rule, T>(hyper, options, seed);
    if (state.var.size == 0) return;
    ForSlotStorage<T>(state.slot_dtype, [&]<typename S>() {
      auto slot_ptrs = SlotPointers<S, NumSlots<Rule>()>(state);
      DeviceScope scope(state.var.data);
      const Shape& shape = state.var.shape;
      const int64_t row_size = RowSizeOf(static_cast<int64_t>(shape.size()),
                                         shape.empty() ? 1 : shape[0], state.var.size);
      gpu::Status status;
      {
        py::gil_scoped_release release;
        status = gpu::ApplyDense<Rule, T, S>(
            params, static_cast<T*>(state.var.data), slot_ptrs.data(),
            static_cast<const T*>(state.grad.data), state.var.size, row_size,
            reinterpret_cast<gpu::Stream>(stream), stochastic);
      }
      Check(status);
    });
  });
}

struct ByteSpan {
  uintptr_t begin, end;
  int64_t member;
  int state;  // 0: var, k + 1: slot k, -1: grad
};

// The group's overlap and device checks, then its launches, with slots stored as S.
template <typename Rule, typename T, typename S>
void EnqueueGroup(const std::vector<State>& states, const ParamsFor<Rule, T>& params,
                  uintptr_t stream, bool stochastic) {
  constexpr int kSlots = NumSlots<Rule>();
  const int64_t n = static_cast<int64_t>(states.size());
  std::vector<ByteSpan> spans;
  const void* first = nullptr;
  for (int64_t i = 0; i < n; ++i) {
    if (states[i].var.size == 0) continue;
    // Each buffer's own size: a per-row slot holds one value per row, not var's count,
    // and a compact slot's values are 2 bytes beside var's 4.
    auto add = [&](const DeviceArray& array, size_t item, int state) {
      const uintptr_t begin = reinterpret_cast<uintptr_t>(array.data);
      spans.push_back({begin, begin + static_cast<uintptr_t>(array.size) * item, i, state});
    };
    add(states[i].var, sizeof(T), 0);
    for (int k = 0; k < kSlots; ++k) add(states[i].slots[k], sizeof(S), k + 1);
    add(states[i].grad, sizeof(T), -1);
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
  std::vector<DenseTensor<Rule, T, S>> tensors(n);
  for (int64_t i = 0; i < n; ++i) {
    tensors[i].var = static_cast<T*>(states[i].var.data);
    for (int k = 0; k < kSlots; ++k) tensors[i].slots[k] = static_cast<S*>(states[i].slots[k].data);
    tensors[i].grad = static_cast<const T*>(states[i].grad.data);
    tensors[i].n = states[i].var.size;
    const Shape& shape = states[i].var.shape;
    tensors[i].row_size = RowSizeOf(static_cast<int64_t>(shape.size()),
                                    shape.empty() ? 1 : shape[0], states[i].var.size);
  }
  gpu::Status status;
  {
    py::gil_scoped_release release;
    status = gpu::ApplyDenseGroup<Rule, T, S>(params, tensors.data(), n,
                                              reinterpret_cast<gpu::Stream>(stream), stochastic);
  }
  Check(status);
}

// Group calls: vars[i] with slots[k][i] and grads[i], one multi-tensor launch per
// gpu::kMaxGroupTensorsPerLaunch members. Everything is checked before anything is enqueued:
// each member as apply_dense checks it ("variable i of n: ..."), one dtype, one slot dtype
// and one device for all, and no written buffer (a var or slot) overlapping any other
// buffer of the group, each measured by its own size (a compact or per-row slot is smaller
// than var).
void ApplyDenseGroupPy(const std::string& rule, const py::sequence& vars,
                       const py::sequence& slots, const py::sequence& grads,
                       const py::dict& hyper, const py::dict& options, uintptr_t stream,
                       const std::string& dtype, const std::string& slot_dtype,
                       const py::object& stochastic_rounding, const py::object& rounding_seed) {
  CheckSlotDtypeArg(slot_dtype);
  const bool stochastic = StochasticRounding(stochastic_rounding);
  const uint64_t seed = RoundingSeed(rounding_seed, stochastic);
  const int64_t n = static_cast<int64_t>(vars.size());
  Require(static_cast<int64_t>(grads.size()) == n,
          "vars and grads must have one entry per variable, got " + std::to_string(n) + " and " +
              std::to_string(grads.size()));
  if (n == 0) return;
  Dispatch(rule, PeekDtype(vars[0], dtype), [&]<typename Rule, typename T>() {
    constexpr int kSlots = NumSlots<Rule>();
    Require(static_cast<int>(slots.size()) == kSlots,
            PyName<Rule>() + " needs " + std::to_string(kSlots) +
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
        states.push_back(
            CheckState<Rule>(vars[i], member_slots, grads[i], {}, false, dtype, slot_dtype));
        Require(states.back().dtype == states.front().dtype,
                "dtype " + states.back().dtype + " differs from variable 0's " +
                    states.front().dtype + " (one group, one dtype)");
        Require(states.back().slot_dtype == states.front().slot_dtype,
                "slot dtype " + states.back().slot_dtype + " differs from variable 0's " +
                    states.front().slot_dtype + " (one group, one slot dtype)");
      } catch (const py::value_error& e) {
        throw py::value_error("variable " + std::to_string(i) + " of " + std::to_string(n) +
                              ": " + e.what());
      }
    }
    const auto params = ParamsFromDicts<Rule, T>(hyper, options, seed);
    ForSlotStorage<T>(states.front().slot_dtype, [&]<typename S>() {
      EnqueueGroup<Rule, T, S>(states, params, stream, stochastic);
    });
  });
}

std::unique_ptr<PendingCheck> ApplySparsePy(const std::string& rule, const py::handle& var,
                                            const py::list& slots, const py::handle& grad,
                                            const py::handle& indices_obj, const py::dict& hyper,
                                            const py::dict& options, uintptr_t stream,
                                            const std::string& dtype, bool wait,
                                            const std::string& slot_dtype,
                                            const py::object& stochastic_rounding,
                                            const py::object& rounding_seed) {
  CheckSlotDtypeArg(slot_dtype);
  const bool stochastic = StochasticRounding(stochastic_rounding);
  const uint64_t seed = RoundingSeed(rounding_seed, stochastic);
  const DeviceArray indices = FromInterface(indices_obj, "indices");
  const std::string index_kind = indices.typestr.substr(1);
  Require(index_kind == "i4" || index_kind == "i8",
          "indices must be int32 or int64, got typestr " + indices.typestr);
  std::unique_ptr<PendingCheck> pending;
  Dispatch(rule, PeekDtype(var, dtype), [&]<typename Rule, typename T>() {
    const State state =
        CheckState<Rule>(var, slots, grad, indices.shape, true, dtype, slot_dtype);
    const auto params = ParamsFromDicts<Rule, T>(hyper, options, seed);
    const int64_t rows = state.var.shape[0];
    const int64_t row_size = rows == 0 ? 0 : state.var.size / rows;
    const int64_t n = indices.size;
    gpu::IndexCheck* record = CheckRecords::Get().Take();
    if (n == 0) {  // nothing to check, nothing to write
      *record = gpu::IndexCheck{};
      pending = std::make_unique<PendingCheck>(record, nullptr, rows);
      return;
    }
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
        gpu::Status result;
        ForSlotStorage<T>(state.slot_dtype, [&]<typename S>() {
          const auto slot_ptrs = SlotPointers<S, NumSlots<Rule>()>(state);
          result = gpu::ApplySparse<Rule, T, Index, S>(
              params, static_cast<T*>(state.var.data), slot_ptrs.data(), rows, row_size,
              static_cast<const T*>(state.grad.data), index_ptr, n, allocator,
              reinterpret_cast<gpu::Stream>(cuda_stream), record, stochastic);
        });
        return result;
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
}  // namespace fusedopt::cuda_module

PYBIND11_MODULE(_core_cuda, m) {
  using namespace fusedopt;
  using namespace fusedopt::cuda_module;
  pycommon::DefineModuleBasics(m, "fusedopt's CUDA update kernels applied in place to CUDA device arrays.");
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
        py::arg("stream") = 0, py::arg("dtype") = "", py::kw_only(), py::arg("slot_dtype") = "",
        py::arg("stochastic_rounding") = false, py::arg("rounding_seed") = py::none(),
        "Dense update of var and slots in place, enqueued on `stream`. Slots: var's dtype or, "
        "beside a float32 var, all bfloat16 or all float16 (slot_dtype='bfloat16' for "
        "2-byte arrays of bfloat16 bits), rounded to nearest even or, with "
        "stochastic_rounding=True, stochastically (the CPU engine's bits).");
  m.def("apply_dense_group", &ApplyDenseGroupPy, py::arg("rule"), py::arg("vars"),
        py::arg("slots"), py::arg("grads"), py::arg("hyper"), py::arg("options") = py::dict(),
        py::arg("stream") = 0, py::arg("dtype") = "", py::kw_only(), py::arg("slot_dtype") = "",
        py::arg("stochastic_rounding") = false, py::arg("rounding_seed") = py::none(),
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
        py::arg("stream") = 0, py::arg("dtype") = "", py::arg("wait") = true, py::kw_only(),
        py::arg("slot_dtype") = "", py::arg("stochastic_rounding") = false, py::arg("rounding_seed") = py::none(),
        "Sparse update of the rows named by indices (duplicates summed first), in place. "
        "Never synchronises while enqueueing; wait=True (default) then waits and raises "
        "ValueError for an out-of-range index (nothing written); wait=False returns a "
        "PendingCheck at once.");
}
