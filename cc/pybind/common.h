// What both pybind11 modules share (fusedopt._core on NumPy arrays, fusedopt._core_cuda
// on CUDA device arrays): hyper-parameter/option parsing, rule/dtype dispatch and the
// rule table, so the two accept the same calls and reject them with the same words.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <array>
#include <string>
#include <type_traits>
#include <vector>

#include "cc/core/engine.h"
#include "cc/core/rules/all_rules.h"
#include "cc/core/validate.h"

namespace fusedopt {
namespace pycommon {

namespace py = pybind11;

inline void Require(bool ok, const std::string& message) {
  if (!ok) throw py::value_error(message);
}

inline std::string TypeName(const py::handle& obj) { return Py_TYPE(obj.ptr())->tp_name; }

// A hyper-parameter: a real number (Python or NumPy scalar, 0-d array), named in errors
// (pybind11's own cast error names neither the parameter nor the type it wants).
inline double HyperValue(const py::handle& value, const char* name) {
  if (py::isinstance<py::array>(value)) {
    const auto a = py::reinterpret_borrow<py::array>(value);
    Require(a.ndim() == 0, std::string(name) + " must be a scalar, got shape " +
                               ShapeString(Shape(a.shape(), a.shape() + a.ndim())));
  }
  // __float__/__index__ only: unlike float(), no strings.
  const double x = PyFloat_AsDouble(value.ptr());
  if (x == -1.0 && PyErr_Occurred()) {
    const py::error_already_set cause;
    throw py::type_error("hyper-parameter " + std::string(name) +
                         " must be a real number (float), got " + TypeName(value) + ": " +
                         cause.what());
  }
  return x;
}

// An option: True/False (Python or NumPy bool), as the TF ops' bool attributes.
inline bool OptionValue(const py::handle& value, const char* name) {
  const bool is_bool = py::isinstance<py::bool_>(value) ||
                       py::isinstance(value, py::module_::import("numpy").attr("bool_"));
  if (!is_bool) {
    throw py::type_error("option " + std::string(name) + " must be a bool, got " +
                         TypeName(value));
  }
  return PyObject_IsTrue(value.ptr()) == 1;
}

// The keyword stochastic_rounding (of compact slots): True/False, as the TF ops' attribute.
inline bool StochasticRounding(const py::handle& value) {
  const bool is_bool = py::isinstance<py::bool_>(value) ||
                       py::isinstance(value, py::module_::import("numpy").attr("bool_"));
  if (!is_bool) throw py::type_error("stochastic_rounding must be a bool, got " + TypeName(value));
  return PyObject_IsTrue(value.ptr()) == 1;
}

// The keyword rounding_seed: the seed of stochastic rounding (numeric.h's CallSalt), an
// integer (any 64-bit value, Python's or NumPy's; the TF ops take an int64), as the TF ops'
// rounding_seed input. Required with stochastic rounding (the same seed every call would
// round an element that does not change the same way every step: a bias); None without.
inline uint64_t RoundingSeed(const py::handle& value, bool stochastic) {
  if (value.is_none()) {
    if (stochastic) {
      throw py::value_error(
          "stochastic_rounding=True needs rounding_seed: an integer that changes every call, "
          "such as the step number (without one, an element that does not change would round "
          "the same way every step, a bias)");
    }
    return 0;
  }
  const bool integer = (py::isinstance<py::int_>(value) ||
                        py::isinstance(value, py::module_::import("numpy").attr("integer"))) &&
                       !py::isinstance<py::bool_>(value);
  if (!integer) throw py::type_error("rounding_seed must be an integer, got " + TypeName(value));
  const py::int_ as_int(py::reinterpret_borrow<py::object>(value));
  const long long low = PyLong_AsLongLong(as_int.ptr());
  if (low == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    const unsigned long long high = PyLong_AsUnsignedLongLong(as_int.ptr());
    if (high == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
      PyErr_Clear();
      throw py::value_error("rounding_seed must fit in 64 bits");
    }
    return static_cast<uint64_t>(high);
  }
  return static_cast<uint64_t>(low);
}

// Hyper-parameters are rounded to the variable's dtype first, as the TF wrappers do.
// `rounding_seed`: the call's seed of stochastic rounding.
template <typename Rule, typename T>
ParamsFor<Rule, T> ParamsFromDicts(const py::dict& hyper, const py::dict& options,
                                   uint64_t rounding_seed = 0) {
  std::array<T, Rule::kHyper.size()> values{};
  std::array<const T*, Rule::kHyper.size()> pointers{};
  for (size_t i = 0; i < Rule::kHyper.size(); ++i) {
    const char* name = Rule::kHyper[i];
    Require(hyper.contains(name), std::string("missing hyper-parameter ") + name);
    Store(values[i], static_cast<ComputeType<T>>(HyperValue(hyper[name], name)));
    pointers[i] = &values[i];
  }
  for (auto item : hyper) {
    const std::string key = py::str(item.first);
    bool known = false;
    for (const char* name : Rule::kHyper) known |= key == name;
    Require(known, "unknown hyper-parameter " + key);
  }
  std::array<bool, Rule::kOptions.size()> flags{};
  for (size_t i = 0; i < Rule::kOptions.size(); ++i) {
    const char* name = Rule::kOptions[i].name;
    flags[i] = options.contains(name) ? OptionValue(options[name], name)
                                   : Rule::kOptions[i].default_value;
  }
  for (auto item : options) {
    const std::string key = py::str(item.first);
    bool known = false;
    for (const RuleOption& option : Rule::kOptions) known |= key == option.name;
    Require(known, "unknown option " + key);
  }
  return PrepareParams<Rule, T>(pointers.data(), flags.data(), rounding_seed);
}

// Calls fn.template operator()<Rule, T>() for the rule and dtype named.
template <typename Fn>
void Dispatch(const std::string& rule, const std::string& dtype, Fn&& fn) {
  bool found = false;
  AllRules::ForEach([&](auto rule_tag) {
    using Rule = decltype(rule_tag);
    if (found || rule != PyName<Rule>()) return;
    found = true;
    if (dtype == "float16") {
      fn.template operator()<Rule, half_t>();
    } else if (dtype == "bfloat16") {
      fn.template operator()<Rule, bfloat16_t>();
    } else if (dtype == "float32") {
      fn.template operator()<Rule, float>();
    } else if (dtype == "float64") {
      fn.template operator()<Rule, double>();
    } else {
      throw py::value_error("unsupported dtype " + dtype +
                            " (float16, bfloat16, float32, float64)");
    }
  });
  Require(found, "unknown rule " + rule);
}

// Compact slot storage (cc/core/numeric.h), the TF ops' rule (cc/tf/tf_types.h): an
// update's slots share one dtype, var's own or, beside a float32 var, bfloat16 or float16.
inline bool SlotDtypeAllowed(const std::string& var_dtype, const std::string& slot_dtype) {
  return slot_dtype == var_dtype ||
         (var_dtype == "float32" && (slot_dtype == "bfloat16" || slot_dtype == "float16"));
}

// The one dtype of an update's slots, named names[k] with dtypes[k] (var's dtype when the
// rule has none); else ValueError naming the first slot refused.
inline std::string SlotDtype(const std::string& var_dtype, const std::vector<std::string>& names,
                             const std::vector<std::string>& dtypes) {
  for (size_t k = 0; k < dtypes.size(); ++k) {
    if (!SlotDtypeAllowed(var_dtype, dtypes[k])) {
      std::string message = names[k] + " has dtype " + dtypes[k] + " but var is " + var_dtype;
      if (var_dtype == "float32") {
        message += " (slots may be float32, bfloat16 or float16)";
      } else if (dtypes[k] == "bfloat16" || dtypes[k] == "float16") {
        message += " (bfloat16/float16 slots are for float32 variables)";
      }
      throw py::value_error(message);
    }
    Require(dtypes[k] == dtypes[0], names[k] + " has dtype " + dtypes[k] + " but " + names[0] +
                                        " has " + dtypes[0] +
                                        ": an update's slots are stored in one dtype");
  }
  return dtypes.empty() ? var_dtype : dtypes[0];
}

// Calls fn.template operator()<S>() with S the core storage type of `slot_dtype`, which
// SlotDtype() has allowed for T: T's own, or half_t/bfloat16_t beside float.
template <typename T, typename Fn>
void ForSlotStorage(const std::string& slot_dtype, Fn&& fn) {
  if constexpr (std::is_same_v<T, float>) {
    if (slot_dtype == "bfloat16") return fn.template operator()<bfloat16_t>();
    if (slot_dtype == "float16") return fn.template operator()<half_t>();
  }
  fn.template operator()<T>();
}

inline py::dict Rules() {
  py::dict out;
  AllRules::ForEach([&](auto rule_tag) {
    using Rule = decltype(rule_tag);
    py::list slots, hyper;
    py::dict options, layouts;
    for (const SlotDecl& s : Rule::kSlots) {
      slots.append(s.name);
      layouts[s.name] = s.layout == SlotLayout::kPerRow ? "per_row" : "per_element";
    }
    for (const char* h : Rule::kHyper) hyper.append(h);
    for (const RuleOption& o : Rule::kOptions) options[o.name] = o.default_value;
    py::dict entry;
    entry["op_name"] = Rule::kOpName;
    entry["slots"] = slots;
    entry["slot_layouts"] = layouts;
    entry["hyper"] = hyper;
    entry["options"] = options;
    out[py::str(PyName<Rule>())] = entry;
  });
  return out;
}

// What both modules start with: their docstring and rules().
inline void DefineModuleBasics(py::module_& m, const char* doc) {
  m.doc() = doc;
  m.def("rules", &Rules, "Rule metadata: slots, hyper-parameters and options of every rule.");
}

}  // namespace pycommon
}  // namespace fusedopt
