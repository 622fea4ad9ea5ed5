// fusedopt._core: the core engine applied in place to NumPy arrays, with no
// TensorFlow in the process. Tests use it as a framework-free check of the same
// kernels; benchmarks use it to measure raw kernel bandwidth.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <exception>
#include <new>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cc/core/engine.h"
#include "cc/core/rules/all_rules.h"
#include "cc/core/validate.h"
#include "cc/pybind/bandwidth.h"
#include "cc/pybind/sparse_floor.h"
#include "cc/pybind/common.h"

// The NumPy module's code lives in pycommon, beside the helpers it is built from.
namespace fusedopt::pycommon {
namespace {

Shape ShapeOf(const py::array& a) {
  return Shape(a.shape(), a.shape() + a.ndim());
}

std::string DtypeName(const py::array& a) { return py::str(a.dtype()); }

struct State {
  py::array var;
  std::vector<py::array> slots;
  std::string slot_dtype;  // the slots' one dtype: var's, or bfloat16/float16 beside float32
};

// var and the slots are updated in place, so they must be NumPy arrays already: pybind11
// would convert anything else (a list) into a temporary array, update that and drop it.
py::array InPlaceArray(const py::handle& obj, const std::string& what) {
  if (!py::isinstance<py::array>(obj)) {
    throw py::type_error(what + " must be a numpy.ndarray (it is updated in place), got " +
                         pycommon::TypeName(obj));
  }
  return py::reinterpret_borrow<py::array>(obj);
}

// The bytes an array spans (arrays are checked C-contiguous first, so exactly these).
struct Span {
  std::string name;
  uintptr_t begin, end;
};

Span SpanOf(const std::string& name, const py::array& a) {
  const auto begin = reinterpret_cast<uintptr_t>(a.data());
  return {name, begin, begin + static_cast<uintptr_t>(a.nbytes())};
}

bool Overlap(const Span& a, const Span& b) { return a.begin < b.end && b.begin < a.end; }

void RequireAligned(const std::string& name, const py::array& a) {
  Require(reinterpret_cast<uintptr_t>(a.data()) % a.itemsize() == 0,
          name + " is not aligned to its " + std::to_string(a.itemsize()) + "-byte elements");
}

// Everything about var, slots and grad (and indices, when sparse) that can reject the
// call, before anything is written. `indices` is null for dense updates.
template <typename Rule>
State CheckState(const py::array& var, const py::sequence& slots, const py::array& grad,
                 const py::array* indices) {
  constexpr int kSlots = NumSlots<Rule>();
  Require(static_cast<int>(slots.size()) == kSlots,
          PyName<Rule>() + " needs " + std::to_string(kSlots) + " slot arrays");
  State state{var, {}, {}};
  std::vector<Shape> slot_shapes;
  for (int k = 0; k < kSlots; ++k) {
    state.slots.push_back(InPlaceArray(slots[k], Rule::kSlots[k].name));
    slot_shapes.push_back(ShapeOf(state.slots.back()));
  }
  std::vector<py::array> all = state.slots;
  all.push_back(var);
  for (const auto& a : all) Require(a.writeable(), "var and slots must be writeable");
  Require(DtypeName(grad) == DtypeName(var), "grad has dtype " + DtypeName(grad) +
                                                 " but var is " + DtypeName(var) +
                                                 ": var and grad must share one dtype");
  std::vector<std::string> slot_names, slot_dtypes;
  for (int k = 0; k < kSlots; ++k) {
    slot_names.push_back(Rule::kSlots[k].name);
    slot_dtypes.push_back(DtypeName(state.slots[k]));
  }
  state.slot_dtype = SlotDtype(DtypeName(var), slot_names, slot_dtypes);
  all.push_back(grad);
  if (indices != nullptr) all.push_back(*indices);
  for (const auto& a : all) {
    Require(a.flags() & py::array::c_style, "arrays must be C-contiguous");
  }
  // Written: var and slots; read while they are written: grad (and indices).
  std::vector<Span> written = {SpanOf("var", var)}, read = {SpanOf("grad", grad)};
  for (int k = 0; k < kSlots; ++k) written.push_back(SpanOf(Rule::kSlots[k].name, state.slots[k]));
  if (indices != nullptr) read.push_back(SpanOf("indices", *indices));
  RequireAligned("var", var);
  for (int k = 0; k < kSlots; ++k) RequireAligned(Rule::kSlots[k].name, state.slots[k]);
  RequireAligned("grad", grad);
  if (indices != nullptr) RequireAligned("indices", *indices);
  for (size_t i = 0; i < written.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      Require(!Overlap(written[i], written[j]),
              written[j].name + " and " + written[i].name +
                  " overlap in memory; var and each slot need their own array");
    }
    for (const Span& r : read) {
      Require(!Overlap(written[i], r), r.name + " overlaps " + written[i].name +
                                           " in memory; pass a copy (it is read while " +
                                           written[i].name + " is written)");
    }
  }
  const std::vector<Shape> hyper(NumHyper<Rule>());  // Python numbers: scalars
  const std::string error =
      indices != nullptr
          ? ValidateSparse<Rule>(ShapeOf(var), slot_shapes.data(), hyper.data(), ShapeOf(grad),
                                 ShapeOf(*indices))
          : ValidateDense<Rule>(ShapeOf(var), slot_shapes.data(), hyper.data(), ShapeOf(grad));
  Require(error.empty(), error);
  return state;
}

template <typename S, int kSlots>
std::array<S*, kSlots> SlotPointers(State& state) {
  std::array<S*, kSlots> out;
  for (int k = 0; k < kSlots; ++k) out[k] = static_cast<S*>(state.slots[k].mutable_data());
  return out;
}

// Slots are stored as the checked slot dtype S (compact slots: rounded once on store, to
// nearest or, `stochastic`, stochastically: cc/core/numeric.h).
template <typename Rule, typename T>
void Dense(const py::array& var, const py::sequence& slots, const py::array& grad,
           const py::dict& hyper, const py::dict& options, int num_threads, bool stochastic,
           uint64_t rounding_seed) {
  State state = CheckState<Rule>(var, slots, grad, nullptr);
  const auto params = ParamsFromDicts<Rule, T>(hyper, options, rounding_seed);
  ForSlotStorage<T>(state.slot_dtype, [&]<typename S>() {
    auto slot_ptrs = SlotPointers<S, NumSlots<Rule>()>(state);
    T* var_ptr = static_cast<T*>(state.var.mutable_data());
    const T* grad_ptr = static_cast<const T*>(grad.data());
    const int64_t n = state.var.size();
    const int64_t row_size =
        RowSizeOf(state.var.ndim(), state.var.ndim() == 0 ? 1 : state.var.shape(0), n);
    py::gil_scoped_release release;
    ThreadExecutor executor(num_threads);
    ApplyDense<Rule, T, S>(params, var_ptr, slot_ptrs.data(), grad_ptr, n, row_size, executor,
                           stochastic);
  });
}

template <typename Rule, typename T, typename Index>
void Sparse(const py::array& var, const py::sequence& slots, const py::array& grad,
            const py::array& indices, const py::dict& hyper, const py::dict& options,
            int num_threads, bool stochastic, uint64_t rounding_seed) {
  State state = CheckState<Rule>(var, slots, grad, &indices);
  const auto params = ParamsFromDicts<Rule, T>(hyper, options, rounding_seed);
  std::string error;
  ForSlotStorage<T>(state.slot_dtype, [&]<typename S>() {
    auto slot_ptrs = SlotPointers<S, NumSlots<Rule>()>(state);
    T* var_ptr = static_cast<T*>(state.var.mutable_data());
    const T* grad_ptr = static_cast<const T*>(grad.data());
    const Index* index_ptr = static_cast<const Index*>(indices.data());
    const int64_t rows = state.var.shape(0);
    const int64_t row_size = rows == 0 ? 0 : state.var.size() / rows;
    const int64_t n = indices.size();
    py::gil_scoped_release release;
    ThreadExecutor executor(num_threads);
    error = ApplySparse<Rule, T, Index, S>(params, var_ptr, slot_ptrs.data(), rows, row_size,
                                           grad_ptr, index_ptr, n, executor, stochastic);
  });
  Require(error.empty(), error);
}

// The slot arrays: a list or tuple (each one checked by CheckState).
py::sequence SlotList(const py::object& slots) {
  if (!py::isinstance<py::list>(slots) && !py::isinstance<py::tuple>(slots)) {
    throw py::type_error("slots must be a list of numpy.ndarrays, got " +
                         pycommon::TypeName(slots));
  }
  return py::reinterpret_borrow<py::sequence>(slots);
}

// At least 1; more than kMaxThreads are not started (each would only cost a stack).
int ThreadCount(int64_t num_threads) {
  Require(num_threads >= 1, "num_threads must be at least 1, got " + std::to_string(num_threads));
  return static_cast<int>(std::min<int64_t>(num_threads, kMaxThreads));
}

// Exposes the 16-bit conversions so tests can compare them with NumPy/ml_dtypes: `convert`
// is called as convert(x, is_half) for every element.
template <typename Out, typename In, typename Convert>
py::array_t<Out> ConvertEach(const py::array_t<In, py::array::c_style>& x,
                             const std::string& dtype, Convert convert) {
  Require(dtype == "float16" || dtype == "bfloat16", "dtype must be float16 or bfloat16");
  py::array_t<Out> out(x.size());
  const In* in = x.data();
  Out* values = out.mutable_data();
  for (py::ssize_t i = 0; i < x.size(); ++i) values[i] = convert(in[i], dtype == "float16");
  return out;
}

py::array_t<uint16_t> RoundFloat32(py::array_t<float, py::array::c_style> x,
                                   const std::string& dtype) {
  return ConvertEach<uint16_t>(x, dtype, [](float v, bool half) {
    return half ? ToHalf(v).bits : ToBfloat16(v).bits;
  });
}

py::array_t<float> WidenToFloat32(py::array_t<uint16_t, py::array::c_style> bits,
                                  const std::string& dtype) {
  return ConvertEach<float>(bits, dtype, [](uint16_t b, bool half) {
    return half ? ToFloat(half_t{b}) : ToFloat(bfloat16_t{b});
  });
}

// Runs, in this library, each libstdc++ entry point cc/compat/abi_floor.cc stands in for
// (the op library has the same definitions): a default-constructed stringstream, copies and
// releases of an exception_ptr, new[] of an impossible count. What each did, for the test.
py::dict AbiFloorSelfTest(int64_t copies, int64_t count) {
  py::dict out;
  std::stringstream text;  // the default constructor: read and write
  text << "fusedopt " << 42;
  std::string word;
  int number = 0;
  text >> word >> number;
  out["stringstream"] = word + " " + std::to_string(number);
  // An exception whose destruction is counted: it must outlive every reference and die
  // with the last one.
  struct Counted : std::runtime_error {
    int* destroyed;
    Counted(const char* what, int* counter) : std::runtime_error(what), destroyed(counter) {}
    Counted(const Counted&) = default;
    ~Counted() override { ++*destroyed; }
  };
  int destroyed = 0;
  std::exception_ptr error;
  try {
    throw Counted("kept", &destroyed);
  } catch (...) {
    error = std::current_exception();
  }
  {
    std::vector<std::exception_ptr> held(static_cast<size_t>(copies), error);  // _M_addref
  }  // _M_release, `copies` times
  try {
    std::rethrow_exception(error);
  } catch (const std::runtime_error& e) {
    out["exception_ptr"] = std::string(e.what());
  }
  out["destroyed_while_held"] = destroyed;
  error = nullptr;  // the last reference
  out["destroyed_after_release"] = destroyed;
  try {
    // A count new[] cannot allocate: bad_array_new_length is a bad_alloc.
    const volatile int64_t n = count;
    auto* p = new double[n];
    delete[] p;
    out["new_array"] = "allocated";
  } catch (const std::bad_alloc&) {
    out["new_array"] = "bad_alloc";
  }
  return out;
}

}  // namespace

// The slots' dtype and rounding, as the TF ops take them.
#define SLOTS_DOC                                                                            \
  "Slots have var's dtype or, beside a float32 var, all bfloat16 or all float16 (compact "  \
  "slots: computed in float32, rounded once on store, to nearest even or, with "            \
  "stochastic_rounding=True, stochastically with the random bits of the stored value, var's " \
  "old element and rounding_seed (an int; the TF ops' rounding_seed: the same bits given the " \
  "same seed)."

// The module's contents, defined where both fusedopt's and pycommon's names are in scope.
void DefineCoreModule(py::module_& m) {
  DefineModuleBasics(m, "fusedopt's TensorFlow-free update kernels applied in place to NumPy arrays.");
  m.def("abi_floor_self_test", &AbiFloorSelfTest, py::arg("copies"), py::arg("count"),
        "For tests: a stringstream, `copies` copies of an exception_ptr and new[] of "
        "`count` doubles, through the libstdc++ stand-ins of cc/compat/abi_floor.cc.");
  m.def("round_float32", &RoundFloat32, py::arg("x"), py::arg("dtype"),
        "float32 -> float16/bfloat16 bit patterns, rounded as the kernels store them.");
  m.def("widen_to_float32", &WidenToFloat32, py::arg("bits"), py::arg("dtype"),
        "float16/bfloat16 bit patterns -> float32, as the kernels load them.");
  m.def(
      "huge_page_stats",
      [] {
        const HugePageCounters c = HugePageStats();
        py::dict stats;
        stats["enabled"] = c.enabled;
        stats["advised_calls"] = c.advised_calls;
        stats["collapsed_buffers"] = c.collapsed_buffers;
        stats["collapsed_bytes"] = c.collapsed_bytes;
        stats["collapse_failures"] = c.collapse_failures;
        stats["pending_bytes"] = c.pending_bytes;
        return stats;
      },
      "What this module's engine did about huge pages (cc/core/huge_pages.h): enabled "
      "(FUSEDOPT_HUGE_PAGES != 0), MADV_HUGEPAGE calls, buffers and bytes collapsed to huge "
      "pages, failed collapses, bytes still queued for collapsing. The op library keeps its own "
      "counts (fusedopt.ops.huge_page_stats()).");
  m.def(
      "cpu_isa", [] { return std::string(VectorIsaName(CpuVectorIsa())); },
      "Vector instruction set of this module's element loops (cc/core/cpu_isa.h): \"avx2\" "
      "where the CPU has it, else \"baseline\" (x86-64 SSE2; also with "
      "FUSEDOPT_CPU_ISA=baseline). Results are bit-identical either way.");
  m.def(
      "sparse_floor",
      [](const py::sequence& batches, int64_t num_rows, int64_t row_size, int element_slots,
         int row_slots, int64_t num_threads, int repeats) {
        Require(num_rows > 0 && row_size > 0, "num_rows and row_size must be positive");
        Require(element_slots >= 0 && element_slots <= 4 && row_slots >= 0 && row_slots <= 4,
                "element_slots and row_slots must be in [0, 4]");
        Require(repeats >= 1 && repeats <= 10000, "repeats must be in [1, 10000]");
        Require(num_rows <= (int64_t{1} << 40) / row_size, "num_rows * row_size is too large");
        const int threads = ThreadCount(num_threads);
        // The batches' sizes first (no copy yet), so that the memory check below comes
        // before any buffer of the probe (or copy of the ids) is allocated.
        std::vector<py::array> given;
        std::vector<int64_t> sizes;
        for (const py::handle& item : batches) {
          given.push_back(py::array::ensure(item));
          const py::array& ids = given.back();
          Require(ids && (ids.dtype().kind() == 'i' || ids.dtype().kind() == 'u'),
                  "each batch of ids must be an integer array, got " + TypeName(item) +
                      (ids ? " of dtype " + std::string(py::str(ids.dtype())) : ""));
          Require(ids.ndim() == 1 && ids.size() > 0,
                  "each batch of ids must be a non-empty 1-D array");
          sizes.push_back(static_cast<int64_t>(ids.size()));
        }
        Require(!sizes.empty(), "batches must hold at least one array of ids");
        // The probe touches every buffer it allocates: all of them together at most half of
        // this machine's memory.
        const sparse_floor::Footprint need =
            sparse_floor::BytesNeeded(sizes, num_rows, row_size, element_slots, row_slots);
        const double memory = static_cast<double>(sysconf(_SC_PHYS_PAGES)) *
                              static_cast<double>(sysconf(_SC_PAGESIZE));
        auto mb = [](double bytes) {
          return std::to_string(static_cast<int64_t>(bytes / 1e6)) + " MB";
        };
        Require(need.Total() <= memory / 2,
                "the probe would take " + mb(need.Total()) + " (tables " + mb(need.tables) +
                    ", gradient " + mb(need.gradient) + ", ids " + mb(need.ids) +
                    ", grouping " + mb(need.grouping) +
                    "), more than half of this machine's memory (" + mb(memory) + ")");
        std::vector<py::array_t<int64_t, py::array::c_style | py::array::forcecast>> held;
        std::vector<sparse_floor::Batch> list;
        for (const py::array& ids_given : given) {
          held.emplace_back(ids_given);
          const auto& ids = held.back();
          const int64_t* data = ids.data();
          for (py::ssize_t i = 0; i < ids.size(); ++i) {
            Require(data[i] >= 0 && data[i] < num_rows,
                    IndexErrorMessage(static_cast<int64_t>(i), data[i], num_rows));
          }
          list.push_back({data, static_cast<int64_t>(ids.size())});
        }
        sparse_floor::Result r;
        {
          py::gil_scoped_release release;
          r = sparse_floor::Measure(list, num_rows, row_size, element_slots, row_slots, threads,
                                    repeats);
        }
        py::dict out;
        out["group_ms"] = r.group_ms;
        out["rows_ms"] = r.rows_ms;
        out["floor_ms"] = r.group_ms + r.rows_ms;
        out["distinct_rows"] = r.distinct_rows;
        return out;
      },
      py::arg("batches"), py::arg("num_rows"), py::arg("row_size"), py::arg("element_slots"),
      py::arg("row_slots") = 0, py::arg("num_threads") = 1, py::arg("repeats") = 20,
      "The floor of a sparse step (cc/pybind/sparse_floor.h), on tables of its own: group_ms "
      "(one thread: the ids of a batch to distinct rows, gradient rows summed), rows_ms "
      "(num_threads threads: read, update and write exactly those rows of var, element_slots "
      "per-element and row_slots per-row slots), floor_ms (their sum), each the best of "
      "`repeats` over the batches (lists of int64 ids in [0, num_rows)); distinct_rows of the "
      "first batch. Refused with a ValueError naming the sizes, before anything is allocated, "
      "when the buffers it would allocate (tables, gradient, ids, grouping) together take more "
      "than half of this machine's memory. Its threads (num_threads, at most 256) meet at a "
      "barrier that spins briefly, then yields the core: more threads than cores is slower, "
      "never stalled.");
  m.def(
      "memory_bandwidth",
      [](const std::string& kernel, int64_t n, int num_threads, int repeats) {
        py::gil_scoped_release release;
        return bandwidth::Measure(kernel, n, num_threads, repeats);
      },
      py::arg("kernel"), py::arg("n"), py::arg("num_threads") = 1, py::arg("repeats") = 5,
      "Best GB/s of a STREAM-style probe ('copy', 'triad': non-temporal stores; 'update': "
      "a += s*b in place) over arrays of n float32 on num_threads threads.");
  m.def(
      "apply_dense",
      [](const std::string& rule, const py::object& var, const py::object& slots,
         py::array grad, py::dict hyper, py::dict options, int64_t num_threads,
         const py::object& stochastic_rounding, const py::object& rounding_seed) {
        const py::array state = InPlaceArray(var, "var");
        const py::sequence slot_list = SlotList(slots);
        const int threads = ThreadCount(num_threads);
        const bool stochastic = StochasticRounding(stochastic_rounding);
        const uint64_t seed = RoundingSeed(rounding_seed, stochastic);
        Dispatch(rule, DtypeName(state), [&]<typename Rule, typename T>() {
          Dense<Rule, T>(state, slot_list, grad, hyper, options, threads, stochastic, seed);
        });
      },
      py::arg("rule"), py::arg("var"), py::arg("slots"), py::arg("grad"), py::arg("hyper"),
      py::arg("options") = py::dict(), py::arg("num_threads") = 1, py::kw_only(),
      py::arg("stochastic_rounding") = false, py::arg("rounding_seed") = py::none(),
      "Dense update of var and slots (numpy.ndarrays) in place, on up to num_threads "
      "threads (at most 256). " SLOTS_DOC);
  m.def(
      "apply_sparse",
      [](const std::string& rule, const py::object& var, const py::object& slots,
         py::array grad, py::array indices, py::dict hyper, py::dict options,
         int64_t num_threads, const py::object& stochastic_rounding,
         const py::object& rounding_seed) {
        const py::array state = InPlaceArray(var, "var");
        const py::sequence slot_list = SlotList(slots);
        const int threads = ThreadCount(num_threads);
        const bool stochastic = StochasticRounding(stochastic_rounding);
        const uint64_t seed = RoundingSeed(rounding_seed, stochastic);
        const std::string index_type = DtypeName(indices);
        Require(index_type == "int32" || index_type == "int64",
                "indices must be int32 or int64, got " + index_type);
        Dispatch(rule, DtypeName(state), [&]<typename Rule, typename T>() {
          if (index_type == "int32") {
            Sparse<Rule, T, int32_t>(state, slot_list, grad, indices, hyper, options, threads,
                                     stochastic, seed);
          } else {
            Sparse<Rule, T, int64_t>(state, slot_list, grad, indices, hyper, options, threads,
                                     stochastic, seed);
          }
        });
      },
      py::arg("rule"), py::arg("var"), py::arg("slots"), py::arg("grad"), py::arg("indices"),
      py::arg("hyper"), py::arg("options") = py::dict(), py::arg("num_threads") = 1,
      py::kw_only(), py::arg("stochastic_rounding") = false, py::arg("rounding_seed") = py::none(),
      "Sparse update of the rows named by indices (duplicates summed first), in place, on "
      "up to num_threads threads (at most 256). " SLOTS_DOC);
}

}  // namespace fusedopt::pycommon

PYBIND11_MODULE(_core, m) { fusedopt::pycommon::DefineCoreModule(m); }
