// fusedopt._core: the core engine applied in place to NumPy arrays, with no
// TensorFlow in the process. Tests use it as a framework-free check of the same
// kernels; benchmarks use it to measure raw kernel bandwidth.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <array>
#include <stdexcept>
#include <string>
#include <vector>

#include "cc/core/engine.h"
#include "cc/core/rules/all_rules.h"
#include "cc/core/validate.h"
#include "cc/pybind/bandwidth.h"
#include "cc/pybind/common.h"

namespace py = pybind11;

namespace fusedopt {
namespace {

using pycommon::Dispatch;
using pycommon::ParamsFromDicts;
using pycommon::Require;
using pycommon::Rules;

Shape ShapeOf(const py::array& a) {
  return Shape(a.shape(), a.shape() + a.ndim());
}

std::string DtypeName(const py::array& a) { return py::str(a.dtype()); }

struct State {
  py::array var;
  std::vector<py::array> slots;
};

template <typename Rule>
State CheckState(const py::array& var, const py::list& slots, const py::array& grad,
                 const Shape& indices_shape, bool sparse) {
  constexpr int kSlots = NumSlots<Rule>();
  Require(static_cast<int>(slots.size()) == kSlots,
          std::string(Rule::kPyName) + " needs " + std::to_string(kSlots) + " slot arrays");
  State state{var, {}};
  std::vector<Shape> slot_shapes;
  for (auto s : slots) {
    state.slots.push_back(s.cast<py::array>());
    slot_shapes.push_back(ShapeOf(state.slots.back()));
  }
  std::vector<py::array> all = state.slots;
  all.push_back(var);
  for (const auto& a : all) {
    Require(a.writeable(), "var and slots must be writeable");
    Require(DtypeName(a) == DtypeName(var) && DtypeName(grad) == DtypeName(var),
            "var, slots and grad must share one dtype");
  }
  all.push_back(grad);
  for (const auto& a : all) {
    Require(a.flags() & py::array::c_style, "arrays must be C-contiguous");
  }
  const std::vector<Shape> hyper(NumHyper<Rule>());  // Python numbers: scalars
  const std::string error =
      sparse ? ValidateSparse<Rule>(ShapeOf(var), slot_shapes.data(), hyper.data(),
                                    ShapeOf(grad), indices_shape)
             : ValidateDense<Rule>(ShapeOf(var), slot_shapes.data(), hyper.data(), ShapeOf(grad));
  Require(error.empty(), error);
  return state;
}

template <typename T, int kSlots>
std::array<T*, kSlots> SlotPointers(State& state) {
  std::array<T*, kSlots> out;
  for (int k = 0; k < kSlots; ++k) out[k] = static_cast<T*>(state.slots[k].mutable_data());
  return out;
}

template <typename Rule, typename T>
void Dense(const py::array& var, const py::list& slots, const py::array& grad,
           const py::dict& hyper, const py::dict& options, int num_threads) {
  State state = CheckState<Rule>(var, slots, grad, {}, false);
  const auto params = ParamsFromDicts<Rule, T>(hyper, options);
  auto slot_ptrs = SlotPointers<T, NumSlots<Rule>()>(state);
  T* var_ptr = static_cast<T*>(state.var.mutable_data());
  const T* grad_ptr = static_cast<const T*>(grad.data());
  const int64_t n = state.var.size();
  py::gil_scoped_release release;
  ThreadExecutor executor(num_threads);
  ApplyDense<Rule, T>(params, var_ptr, slot_ptrs.data(), grad_ptr, n, executor);
}

template <typename Rule, typename T, typename Index>
void Sparse(const py::array& var, const py::list& slots, const py::array& grad,
            const py::array& indices, const py::dict& hyper, const py::dict& options,
            int num_threads) {
  Require(indices.flags() & py::array::c_style, "arrays must be C-contiguous");
  State state = CheckState<Rule>(var, slots, grad, ShapeOf(indices), true);
  const auto params = ParamsFromDicts<Rule, T>(hyper, options);
  auto slot_ptrs = SlotPointers<T, NumSlots<Rule>()>(state);
  T* var_ptr = static_cast<T*>(state.var.mutable_data());
  const T* grad_ptr = static_cast<const T*>(grad.data());
  const Index* index_ptr = static_cast<const Index*>(indices.data());
  const int64_t rows = state.var.shape(0);
  const int64_t row_size = rows == 0 ? 0 : state.var.size() / rows;
  const int64_t n = indices.size();
  std::string error;
  {
    py::gil_scoped_release release;
    ThreadExecutor executor(num_threads);
    error = ApplySparse<Rule, T, Index>(params, var_ptr, slot_ptrs.data(), rows, row_size,
                                        grad_ptr, index_ptr, n, executor);
  }
  Require(error.empty(), error);
}

// Exposes the 16-bit conversions so tests can compare them with NumPy/ml_dtypes.
py::array_t<uint16_t> RoundFloat32(py::array_t<float, py::array::c_style> x,
                                   const std::string& dtype) {
  Require(dtype == "float16" || dtype == "bfloat16", "dtype must be float16 or bfloat16");
  py::array_t<uint16_t> out(x.size());
  const float* in = x.data();
  uint16_t* bits = out.mutable_data();
  for (py::ssize_t i = 0; i < x.size(); ++i) {
    bits[i] = dtype == "float16" ? ToHalf(in[i]).bits : ToBfloat16(in[i]).bits;
  }
  return out;
}

py::array_t<float> WidenToFloat32(py::array_t<uint16_t, py::array::c_style> bits,
                                  const std::string& dtype) {
  Require(dtype == "float16" || dtype == "bfloat16", "dtype must be float16 or bfloat16");
  py::array_t<float> out(bits.size());
  const uint16_t* in = bits.data();
  float* values = out.mutable_data();
  for (py::ssize_t i = 0; i < bits.size(); ++i) {
    values[i] = dtype == "float16" ? ToFloat(half_t{in[i]}) : ToFloat(bfloat16_t{in[i]});
  }
  return out;
}

}  // namespace
}  // namespace fusedopt

PYBIND11_MODULE(_core, m) {
  using namespace fusedopt;
  m.doc() = "fusedopt's TensorFlow-free update kernels applied in place to NumPy arrays.";
  m.def("rules", &Rules, "Rule metadata: slots, hyper-parameters and options of every rule.");
  m.def("round_float32", &RoundFloat32, py::arg("x"), py::arg("dtype"),
        "float32 -> float16/bfloat16 bit patterns, rounded as the kernels store them.");
  m.def("widen_to_float32", &WidenToFloat32, py::arg("bits"), py::arg("dtype"),
        "float16/bfloat16 bit patterns -> float32, as the kernels load them.");
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
      [](const std::string& rule, py::array var, py::list slots, py::array grad,
         py::dict hyper, py::dict options, int num_threads) {
        Dispatch(rule, DtypeName(var), [&]<typename Rule, typename T>() {
          Dense<Rule, T>(var, slots, grad, hyper, options, num_threads);
        });
      },
      py::arg("rule"), py::arg("var"), py::arg("slots"), py::arg("grad"), py::arg("hyper"),
      py::arg("options") = py::dict(), py::arg("num_threads") = 1,
      "Dense update of var and slots in place.");
  m.def(
      "apply_sparse",
      [](const std::string& rule, py::array var, py::list slots, py::array grad,
         py::array indices, py::dict hyper, py::dict options, int num_threads) {
        const std::string index_type = DtypeName(indices);
        Require(index_type == "int32" || index_type == "int64",
                "indices must be int32 or int64, got " + index_type);
        Dispatch(rule, DtypeName(var), [&]<typename Rule, typename T>() {
          if (index_type == "int32") {
            Sparse<Rule, T, int32_t>(var, slots, grad, indices, hyper, options, num_threads);
          } else {
            Sparse<Rule, T, int64_t>(var, slots, grad, indices, hyper, options, num_threads);
          }
        });
      },
      py::arg("rule"), py::arg("var"), py::arg("slots"), py::arg("grad"), py::arg("indices"),
      py::arg("hyper"), py::arg("options") = py::dict(), py::arg("num_threads") = 1,
      "Sparse update of the rows named by indices (duplicates summed first), in place.");
}
