// FusedOpt>VariablePack and its kernels (see variable_pack.h).
#include "cc/tf/variable_pack.h"

#include <string>
#include <utility>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace fusedopt {
namespace tf {
namespace {

class VariablePackOp : public ::tensorflow::OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(::tensorflow::OpKernelContext* ctx) override {
    const int n = ctx->num_inputs();
    std::vector<::tensorflow::core::RefCountPtr<::tensorflow::Var>> members(n);
    std::vector<::tensorflow::Var*> vars(n);
    for (int j = 0; j < n; ++j) {
      const absl::Status found = ::tensorflow::LookupResource(
          ctx, ::tensorflow::HandleFromInput(ctx, j), &members[j]);
      OP_REQUIRES(ctx, found.ok(),
                  absl::FailedPreconditionError(
                      "members[" + std::to_string(j) + "] (" + requested_input(j) +
                      ") is not a live resource variable: " + std::string(found.message())));
      vars[j] = members[j].get();
    }
    std::vector<int64_t> lock_order;
    std::pair<int64_t, int64_t> same;
    OP_REQUIRES(ctx, AddressOrder(vars, &lock_order, &same),
                absl::InvalidArgumentError(
                    "members[" + std::to_string(same.first) + "] and members[" +
                    std::to_string(same.second) + "] are the same variable (" +
                    requested_input(same.first) + ", " + requested_input(same.second) +
                    "); each needs its own"));
    ::tensorflow::Tensor* out = nullptr;
    ::tensorflow::AllocatorAttributes on_host;
    on_host.set_on_host(true);
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, ::tensorflow::TensorShape({}), &out, on_host));
    // A new resource has one reference, which the handle takes over.
    out->scalar<::tensorflow::ResourceHandle>()() =
        ::tensorflow::ResourceHandle::MakeRefCountingHandle<VariablePack>(
            new VariablePack(std::move(members), std::move(lock_order)),
            ctx->device()->name());
  }
};

bool Register() {
  ::tensorflow::register_op::OpDefBuilderWrapper op("FusedOpt>VariablePack");
  op.Input("members: N * resource");
  op.Output("pack: resource");
  op.Attr("N: int >= 1");
  // Stateful: each call makes a new pack (never folded, merged or cached).
  op.SetIsStateful();
  op.SetShapeFn(::tensorflow::shape_inference::ScalarShape);
  op.Doc("A member pack of N distinct resource variables, for the packed group ops.");
  op();
  for (const char* device : {::tensorflow::DEVICE_CPU, ::tensorflow::DEVICE_GPU}) {
    // Registering for GPU is inert without one; handles live in host memory.
    ::tensorflow::KernelDefBuilder builder("FusedOpt>VariablePack");
    builder.Device(device).HostMemory("members").HostMemory("pack");
    ::tensorflow::kernel_factory::OpKernelRegistrar(
        builder.Build(), "fusedopt::tf::VariablePackOp",
        [](::tensorflow::OpKernelConstruction* ctx) -> ::tensorflow::OpKernel* {
          return new VariablePackOp(ctx);
        });
  }
  return true;
}

const bool registered = Register();

}  // namespace
}  // namespace tf
}  // namespace fusedopt
