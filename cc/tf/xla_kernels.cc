// XLA kernels for every rule's resource ops, so the ops work inside jit_compile (Keras 3
// compiles `fit` with XLA by default on GPU machines) and touch only the named rows.
//
// Two lowerings of the same rule:
//   * XLA:CPU (TF >= 2.16, typed FFI): a custom call into the CPU engine itself, updating
//     var and slots in place (output-operand aliasing onto the variables' buffers), on
//     XLA's intra-op thread pool. Same kernel, same numbers, same errors: a bad index is an
//     InvalidArgumentError at run time with nothing written.
//   * Elsewhere (XLA:GPU; TF 2.15; FUSEDOPT_XLA_LOWERING=hlo): HLO built from the rule's own
//     Prepare()/Update() on XlaValue (xla_value.h). Sparse calls sort the ids, sum each row's
//     gradients in the order of cc/core/sum_order.h (scatter-adds in position order), gather
//     the touched rows, update them and scatter them back: static shapes of the batch, never
//     of the table. XLA cannot raise at run time, so a call with any out-of-range id writes
//     nothing at all (all or nothing) and raises nothing.
// Compact slots (numeric.h: bfloat16/half slots beside a float32 variable, one slot dtype per
// update, the CPU kernels' refusals and words at compile time) in both: the custom call runs
// the engine with the slots' storage type, the HLO converts slots to float32 and back, to
// nearest or (stochastic_rounding) with numeric.h's stochastic rounding as U32 bit
// operations (xla_hlo.h StoreSlotHlo): the same bits for the same float32 values.
// Ref-variable ops have no XLA kernels: XLA compiles resource variables only.
//
// XLA builds its JIT kernel list once, at the process's first XLA compilation; a library
// loaded after that registers its JIT kernels itself (RegisterLateJitKernels below).
//
// Files: xla_common.h (shared), xla_hlo.h (the HLO lowering), xla_op_kernels.h (the op
// kernels), xla_ffi_handler.h (the custom call's handler); this file registers them.

// GCC 12 reports absl::InlinedVector (inside xla::ShapeIndex) as maybe-uninitialized: a known
// false positive in absl's code, not ours.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <string>
#include <vector>

#include "cc/tf/xla_ffi_handler.h"
#include "cc/tf/xla_op_kernels.h"

namespace fusedopt {
namespace tf {
namespace xla_impl {
namespace {

// ---------------------------------------------------------------------------------------
// Registration (static initialisation of the op library).

template <typename Kernel>
tfw::OpKernel* MakeKernel(tfw::OpKernelConstruction* ctx) {
  return new Kernel(ctx);
}

struct Registration {
  std::string op;
  bool sparse;
  tfw::XlaOpRegistry::Factory factory;
};

std::vector<Registration>& Registrations() {
  static auto* all = new std::vector<Registration>();
  return *all;
}

template <typename Rule, bool kSparse>
void RegisterXlaKernel() {
  const std::string op =
      OpName(Rule::kOpName, kSparse ? Variant::kResourceSparseApply : Variant::kResourceApply);
  auto builder = tfw::XlaOpRegistrationBuilder::Name(op);
  builder.TypeConstraint("T", StorageDataTypes());
  if (kSparse) builder.TypeConstraint("Tindices", IndexDataTypes());
  new tfw::XlaOpRegistrar(builder.Build(&MakeKernel<FusedApplyXlaOp<Rule, kSparse>>));
  Registrations().push_back({op, kSparse, &MakeKernel<FusedApplyXlaOp<Rule, kSparse>>});
#ifdef FUSEDOPT_XLA_FFI
  static const std::string target = CustomCallTarget(PyName<Rule>(), kSparse);
  XLA_FFI_Error* error = ffi::Ffi::RegisterStaticHandler(ffi::GetXlaFfiApi(), target, "Host",
                                                         &FfiEntry<FfiCall<Rule, kSparse>>);
  (void)error;  // only a duplicate registration fails, and then the first one serves
#endif
}

// XlaOpRegistry turns XLA registrations into JIT kernels once, at the process's first XLA
// compilation (TF's own "Add" then has XLA_CPU_JIT kernels). Loaded after that, our ops
// would be "not registered for XLA_CPU_JIT": register their JIT kernels the same way.
void RegisterLateJitKernels() {
  if (tfw::KernelsRegisteredForOp("Add").find(tfw::DEVICE_CPU_XLA_JIT) == std::string::npos) {
    return;  // early: XlaOpRegistry will include ours
  }
  for (const char* device : {tfw::DEVICE_CPU_XLA_JIT, tfw::DEVICE_GPU_XLA_JIT}) {
    if (!tfw::XlaOpRegistry::IsBackendRegistered(device)) continue;
    for (const Registration& r : Registrations()) {
      tfw::KernelDefBuilder builder(r.op.c_str());
      builder.Device(device).TypeConstraint("T", StorageDataTypes());
      if (r.sparse) builder.TypeConstraint("Tindices", IndexDataTypes());
      tfw::kernel_factory::OpKernelRegistrar(builder.Build(), "XlaJitOp", r.factory);
    }
  }
}

template <typename Rule>
void RegisterGroupXlaKernel() {
  const std::string op = GroupOpName(Rule::kOpName);
  auto builder = tfw::XlaOpRegistrationBuilder::Name(op);
  builder.TypeConstraint("T", StorageDataTypes());
  new tfw::XlaOpRegistrar(builder.Build(&MakeKernel<FusedGroupApplyXlaOp<Rule>>));
  Registrations().push_back({op, false, &MakeKernel<FusedGroupApplyXlaOp<Rule>>});
#ifdef FUSEDOPT_XLA_FFI
  static const std::string target = GroupCustomCallTarget(PyName<Rule>());
  XLA_FFI_Error* error = ffi::Ffi::RegisterStaticHandler(ffi::GetXlaFfiApi(), target, "Host",
                                                         &FfiEntry<FfiGroupCall<Rule>>);
  (void)error;  // only a duplicate registration fails, and then the first one serves
#endif
}

bool RegisterAll() {
  AllRules::ForEach([](auto rule) {
    using Rule = decltype(rule);
    RegisterXlaKernel<Rule, false>();
    RegisterXlaKernel<Rule, true>();
    RegisterGroupXlaKernel<Rule>();
  });
  RegisterLateJitKernels();
  return true;
}

const bool registered = RegisterAll();

}  // namespace
}  // namespace xla_impl
}  // namespace tf
}  // namespace fusedopt
