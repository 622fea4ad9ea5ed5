// The custom call's handler (XLA:CPU, TF >= 2.16): the CPU engine on XLA's buffers, on
// XLA's intra-op thread pool. Empty without the typed FFI.
#pragma once

#include "cc/tf/xla_common.h"

namespace fusedopt {
namespace tf {
namespace xla_impl {

namespace tfw = ::tensorflow;

// ---------------------------------------------------------------------------------------
// The custom call's handler: the CPU engine on XLA's buffers.

#ifdef FUSEDOPT_XLA_FFI
namespace ffi = ::xla::ffi;

// Runs ParallelFor blocks on XLA's intra-op pool. The calling thread takes blocks too and
// waits only for blocks other threads are running, so a busy pool cannot deadlock it.
class FfiExecutor final : public Executor {
 public:
  explicit FfiExecutor(ffi::ThreadPool& pool) : pool_(pool) {}

  int64_t MaxConcurrentBlocks() const override { return pool_.num_threads() + 1; }

  void ParallelFor(int64_t n, int64_t cost_per_unit, const Block& fn) override {
    const int64_t threads = std::max<int64_t>(1, pool_.num_threads() + 1);
    // Below ~50k cycles of work a thread costs more than it saves.
    const int64_t min_units = std::max<int64_t>(1, 50000 / std::max<int64_t>(1, cost_per_unit));
    const int64_t blocks = std::min<int64_t>(4 * threads, std::max<int64_t>(1, n / min_units));
    RunClaimingPieces(
        n, blocks, threads - 1,
        [this](auto task) { pool_.Schedule(std::move(task)); }, fn);
  }

 private:
  ffi::ThreadPool& pool_;
};

// Result i starts as argument i: aliased (the normal case) it is the same buffer, else the
// old value is copied in. Its data, and argument i's element count and leading dimension.
// std::nullopt on success (ffi::Error's own test for it differs across TF versions).
inline std::optional<ffi::Error> StateBuffer(const ffi::RemainingArgs& args,
                                             const ffi::RemainingRets& rets, int64_t i,
                                             void** data, int64_t* elements, int64_t* rows) {
  auto in = args.get<ffi::AnyBuffer>(i);
  auto out = rets.get<ffi::AnyBuffer>(i);
  if (!in.has_value()) return in.error();
  if (!out.has_value()) return out.error();
  *data = (*out)->untyped_data();
  if (*data != in->untyped_data()) std::memcpy(*data, in->untyped_data(), in->size_bytes());
  *elements = static_cast<int64_t>(in->element_count());
  const auto dims = in->dimensions();
  *rows = dims.size() > 0 ? dims[0] : 1;
  return std::nullopt;
}

// The call's Params from the rule's scalar hyper-parameter arguments (first_hyper, ...),
// the options argument (one byte per option, then stochastic_rounding's: OptionBytes) and
// the call's rounding salt, the argument after it (U32 scalar).
template <typename Rule, typename T>
std::optional<ffi::Error> ReadParams(const ffi::RemainingArgs& args, int64_t first_hyper,
                                     int64_t options_at, ParamsFor<Rule, T>* params,
                                     bool* stochastic) {
  std::array<const T*, NumHyper<Rule>()> hyper;
  for (int i = 0; i < NumHyper<Rule>(); ++i) {
    auto h = args.get<ffi::AnyBuffer>(first_hyper + i);
    if (!h.has_value()) return h.error();
    hyper[i] = static_cast<const T*>(h->untyped_data());
  }
  auto options = args.get<ffi::AnyBuffer>(options_at);
  if (!options.has_value()) return options.error();
  std::array<bool, NumOptions<Rule>()> flags{};
  const auto* option_bytes = static_cast<const uint8_t*>(options->untyped_data());
  for (int i = 0; i < NumOptions<Rule>(); ++i) flags[i] = option_bytes[i] != 0;
  *stochastic = option_bytes[NumOptions<Rule>()] != 0;
  auto salt = args.get<ffi::AnyBuffer>(options_at + 1);
  if (!salt.has_value()) return salt.error();
  *params = PrepareParams<Rule, T>(hyper.data(), flags.data());
  params->rounding_salt = *static_cast<const uint32_t*>(salt->untyped_data());
  return std::nullopt;
}

// Call::Typed<T, S>(pool, args, rets) for var's storage type T and the slots' S: T, or for a
// float32 var bfloat16/half (compact slots). The op kernel refused every other combination
// at compile time; the handler checks again that all slots share one type.
template <typename Call, typename T>
ffi::Error RunWithSlots(ffi::ThreadPool& pool, const ffi::RemainingArgs& args,
                        const ffi::RemainingRets& rets, ffi::DataType var_type) {
  if constexpr (Call::kSlots == 0) {
    return Call::template Typed<T, T>(pool, args, rets);
  } else {
    const int64_t first = Call::FirstSlotArg(args), count = Call::SlotArgs(args);
    auto slot = args.get<ffi::AnyBuffer>(first);
    if (!slot.has_value()) return slot.error();
    const ffi::DataType slot_type = slot->element_type();
    for (int64_t j = first + 1; j < first + count; ++j) {
      auto other = args.get<ffi::AnyBuffer>(j);
      if (!other.has_value()) return other.error();
      if (other->element_type() != slot_type) {
        return ffi::Error::InvalidArgument("fusedopt: an update's slots are stored in one dtype");
      }
    }
    if (slot_type == var_type) return Call::template Typed<T, T>(pool, args, rets);
    if constexpr (std::is_same_v<T, float>) {
      if (slot_type == ffi::DataType::BF16) {
        return Call::template Typed<T, bfloat16_t>(pool, args, rets);
      }
      if (slot_type == ffi::DataType::F16) return Call::template Typed<T, half_t>(pool, args, rets);
    }
    return ffi::Error::InvalidArgument("fusedopt: unsupported slot dtype");
  }
}

template <typename Call>
ffi::Error RunTypedUnguarded(ffi::ThreadPool& pool, ffi::RemainingArgs& args,
                             ffi::RemainingRets& rets);

// RunWithSlots for the storage type of the first argument (var). No C++ exception may
// cross into XLA: an allocation refused (std::bad_alloc) comes before the engine's first
// write (engine.h), so the error leaves the state as it was.
template <typename Call>
ffi::Error RunTyped(ffi::ThreadPool pool, ffi::RemainingArgs args, ffi::RemainingRets rets) {
  try {
    return RunTypedUnguarded<Call>(pool, args, rets);
  } catch (const std::bad_alloc&) {
    return ffi::Error(ffi::ErrorCode::kResourceExhausted, kOutOfMemoryBeforeWriting);
  } catch (const std::exception& e) {
    return ffi::Error::Internal(std::string("the update failed before writing: ") + e.what());
  }
}

template <typename Call>
ffi::Error RunTypedUnguarded(ffi::ThreadPool& pool, ffi::RemainingArgs& args,
                             ffi::RemainingRets& rets) {
  auto var = args.get<ffi::AnyBuffer>(0);
  if (!var.has_value()) return var.error();
  const ffi::DataType type = var->element_type();
  switch (type) {
    case ffi::DataType::F16:
      return RunWithSlots<Call, half_t>(pool, args, rets, type);
    case ffi::DataType::BF16:
      return RunWithSlots<Call, bfloat16_t>(pool, args, rets, type);
    case ffi::DataType::F32:
      return RunWithSlots<Call, float>(pool, args, rets, type);
    case ffi::DataType::F64:
      return RunWithSlots<Call, double>(pool, args, rets, type);
    default:
      return ffi::Error::InvalidArgument("fusedopt: unsupported variable dtype");
  }
}

// The FFI entry point of a handler: binds XLA's thread pool and every argument and result.
template <typename Call>
XLA_FFI_Error* FfiEntry(XLA_FFI_CallFrame* frame) {
  static auto* handler = ffi::Ffi::Bind()
                             .Ctx<ffi::ThreadPool>()
                             .RemainingArgs()
                             .RemainingRets()
                             .To(RunTyped<Call>)
                             .release();
  return handler->Call(frame);
}

template <typename Rule, bool kSparse>
struct FfiCall {
  static constexpr int kSlots = NumSlots<Rule>();
  static constexpr int kHyper = NumHyper<Rule>();

  static int64_t FirstSlotArg(const ffi::RemainingArgs&) { return 1; }
  static int64_t SlotArgs(const ffi::RemainingArgs&) { return kSlots; }

  // T: var's storage type; S: the slots'.
  template <typename T, typename S>
  static ffi::Error Typed(ffi::ThreadPool& pool, const ffi::RemainingArgs& args,
                          const ffi::RemainingRets& rets) {
    // Arguments: var, slots, hyper-parameters, grad, [indices], options, rounding salt;
    // results: var, slots.
    T* var = nullptr;
    std::array<S*, kSlots> slots;
    int64_t elements = 0, num_rows = 0;
    for (int i = 0; i <= kSlots; ++i) {
      void* data = nullptr;
      int64_t count = 0, rows = 0;
      if (auto e = StateBuffer(args, rets, i, &data, &count, &rows)) return std::move(*e);
      if (i == 0) {
        var = static_cast<T*>(data);
        elements = count, num_rows = rows;
      } else {
        slots[i - 1] = static_cast<S*>(data);
      }
    }
    auto grad = args.get<ffi::AnyBuffer>(1 + kSlots + kHyper);
    if (!grad.has_value()) return grad.error();
    ParamsFor<Rule, T> params;
    bool stochastic = false;
    if (auto e = ReadParams<Rule, T>(args, 1 + kSlots, 2 + kSlots + kHyper + (kSparse ? 1 : 0),
                                     &params, &stochastic)) {
      return std::move(*e);
    }
    const T* grad_data = static_cast<const T*>(grad->untyped_data());
    FfiExecutor executor(pool);
    const int64_t row_size = num_rows == 0 ? 0 : elements / num_rows;
    if constexpr (!kSparse) {
      ApplyDense<Rule, T, S>(params, var, slots.data(), grad_data, elements, row_size, executor,
                             stochastic);
      return ffi::Error::Success();
    } else {
      auto indices = args.get<ffi::AnyBuffer>(2 + kSlots + kHyper);
      if (!indices.has_value()) return indices.error();
      const int64_t n = static_cast<int64_t>(indices->element_count());
      std::string error;
      if (indices->element_type() == ffi::DataType::S32) {
        error = ApplySparse<Rule, T, int32_t, S>(
            params, var, slots.data(), num_rows, row_size, grad_data,
            static_cast<const int32_t*>(indices->untyped_data()), n, executor, stochastic);
      } else {
        error = ApplySparse<Rule, T, int64_t, S>(
            params, var, slots.data(), num_rows, row_size, grad_data,
            static_cast<const int64_t*>(indices->untyped_data()), n, executor, stochastic);
      }
      if (!error.empty()) return ffi::Error::InvalidArgument(error);
      return ffi::Error::Success();
    }
  }

};

// The group's custom call: arguments N*(1+kSlots) state buffers (vars, then each slot's),
// the hyper-parameters, N grads, options, rounding salt; results the state buffers.
template <typename Rule>
struct FfiGroupCall {
  static constexpr int kSlots = NumSlots<Rule>();
  static constexpr int kHyper = NumHyper<Rule>();

  // Members: N = (arguments - hyper-parameters - options - salt) / (var, slots, grad).
  static int64_t Members(const ffi::RemainingArgs& args) {
    return (static_cast<int64_t>(args.size()) - kHyper - 2) / (2 + kSlots);
  }
  static int64_t FirstSlotArg(const ffi::RemainingArgs& args) { return Members(args); }
  static int64_t SlotArgs(const ffi::RemainingArgs& args) { return kSlots * Members(args); }

  // T: the vars' storage type; S: the slots'.
  template <typename T, typename S>
  static ffi::Error Typed(ffi::ThreadPool& pool, const ffi::RemainingArgs& args,
                          const ffi::RemainingRets& rets) {
    const int64_t n = Members(args);
    const int64_t num_state = (1 + kSlots) * n;
    if (n < 1 || static_cast<int64_t>(rets.size()) != num_state) {
      return ffi::Error::InvalidArgument("fusedopt: malformed group custom call");
    }
    std::vector<DenseTensor<Rule, T, S>> tensors(n);
    for (int64_t j = 0; j < num_state; ++j) {
      void* data = nullptr;
      int64_t count = 0, rows = 0;
      if (auto e = StateBuffer(args, rets, j, &data, &count, &rows)) return std::move(*e);
      DenseTensor<Rule, T, S>& x = tensors[j % n];
      if (j < n) {
        x.var = static_cast<T*>(data);
        x.n = count;
        x.row_size = rows == 0 ? 0 : count / rows;
      } else {
        x.slots[j / n - 1] = static_cast<S*>(data);
      }
    }
    for (int64_t v = 0; v < n; ++v) {
      auto grad = args.get<ffi::AnyBuffer>(num_state + kHyper + v);
      if (!grad.has_value()) return grad.error();
      tensors[v].grad = static_cast<const T*>(grad->untyped_data());
    }
    ParamsFor<Rule, T> params;
    bool stochastic = false;
    if (auto e = ReadParams<Rule, T>(args, num_state, num_state + kHyper + n, &params,
                                     &stochastic)) {
      return std::move(*e);
    }
    FfiExecutor executor(pool);
    ApplyDenseGroup<Rule, T, S>(params, tensors.data(), n, executor, stochastic);
    return ffi::Error::Success();
  }

};
#endif  // FUSEDOPT_XLA_FFI

}  // namespace xla_impl
}  // namespace tf
}  // namespace fusedopt
