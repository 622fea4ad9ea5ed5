// Moves a variable's or slot's buffer that the L1 cache cannot hold beside another buffer
// of the same update (cc/core/cache_alias.h) to fresh memory, once: the values are copied
// unchanged, the variable then holds the new buffer, as after TF's own copy-on-write.
// CPU resource variables only (a ref variable's buffer belongs to its graph node).
#pragma once

#include <cstring>
#include <vector>

#include "cc/core/cache_alias.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/tensor.h"

namespace fusedopt {
namespace tf {

// A tensor's bytes at a chosen offset inside a larger allocation of the device's allocator.
class OffsetBuffer final : public ::tensorflow::TensorBuffer {
 public:
  OffsetBuffer(::tensorflow::Allocator* allocator, void* allocation, char* data, size_t bytes)
      : TensorBuffer(data), allocator_(allocator), allocation_(allocation), bytes_(bytes) {}
  ~OffsetBuffer() override { allocator_->DeallocateRaw(allocation_); }
  size_t size() const override { return bytes_; }
  TensorBuffer* root_buffer() override { return this; }
  void FillAllocationDescription(::tensorflow::AllocationDescription* proto) const override {
    proto->set_requested_bytes(static_cast<int64_t>(bytes_));
    proto->set_allocator_name(allocator_->Name());
    proto->set_ptr(reinterpret_cast<uintptr_t>(data()));
  }

 private:
  ::tensorflow::Allocator* const allocator_;
  void* const allocation_;
  const size_t bytes_;
};

// The buffers of an update in BuffersToSeparate's order: the dense gradient first (it
// stays where it is; nullptr for a sparse update, whose rows do not walk in step with the
// variable's), then vars[0..count), the variable and its slots.
struct UpdateBuffers {
  std::vector<const void*> data;
  std::vector<int64_t> bytes;
  int first_movable = 0;
};

inline UpdateBuffers BuffersOf(::tensorflow::Var* const* vars, int count, const void* grad,
                               int64_t grad_bytes) {
  UpdateBuffers b;
  if (grad != nullptr) {
    b.data.push_back(grad);
    b.bytes.push_back(grad_bytes);
    b.first_movable = 1;
  }
  for (int i = 0; i < count; ++i) {
    const ::tensorflow::Tensor* t = vars[i]->tensor();
    b.data.push_back(t->tensor_data().data());
    b.bytes.push_back(static_cast<int64_t>(t->tensor_data().size()));
  }
  return b;
}

// Whether SeparateAliasedBuffers would move anything (the caller holds the variables' locks,
// shared is enough).
inline bool AnyAliasedBuffer(::tensorflow::Var* const* vars, int count, const void* grad,
                             int64_t grad_bytes) {
  const UpdateBuffers b = BuffersOf(vars, count, grad, grad_bytes);
  return !BuffersToSeparate(b.data, b.bytes, b.first_movable).empty();
}

// Moves the buffers of vars[0..count) (all initialized, locked exclusively by the caller)
// that alias another buffer of the update (BuffersOf). Never fails: a buffer it cannot move
// (no memory) stays, counted in SeparationStats().failures.
inline void SeparateAliasedBuffers(::tensorflow::OpKernelContext* ctx,
                                   ::tensorflow::Var* const* vars, int count, const void* grad,
                                   int64_t grad_bytes) {
  UpdateBuffers b = BuffersOf(vars, count, grad, grad_bytes);
  const std::vector<int> move = BuffersToSeparate(b.data, b.bytes, b.first_movable);
  if (move.empty()) return;
  ::fusedopt::detail::SeparationLedger& ledger = ::fusedopt::detail::SeparationLedger::Get();
  ::tensorflow::Allocator* allocator =
      ctx->device()->GetAllocator(::tensorflow::AllocatorAttributes());
  for (const int i : move) {
    ::tensorflow::Tensor* t = vars[i - b.first_movable]->tensor();
    const size_t n = t->tensor_data().size();
    void* allocation = allocator->AllocateRaw(::tensorflow::Allocator::kAllocatorAlignment,
                                              n + static_cast<size_t>(kSeparationPad));
    if (allocation == nullptr) {
      ledger.Failed();
      continue;
    }
    std::vector<const void*> others;
    for (int j = 0; j < static_cast<int>(b.data.size()); ++j) {
      if (j != i && b.bytes[j] >= kMinSeparatedBytes) others.push_back(b.data[j]);
    }
    const int64_t offset = SeparatingOffset(static_cast<char*>(allocation), others);
    if (offset < 0) {
      allocator->DeallocateRaw(allocation);
      ledger.Failed();
      continue;
    }
    char* data = static_cast<char*>(allocation) + offset;
    std::memcpy(data, t->tensor_data().data(), n);
    auto* buffer = new OffsetBuffer(allocator, allocation, data, n);
    ::tensorflow::Tensor moved(t->dtype(), t->shape(), buffer);  // takes its own reference
    buffer->Unref();
    *t = std::move(moved);
    b.data[i] = data;
    ledger.Moved(static_cast<int64_t>(n));
  }
}

}  // namespace tf
}  // namespace fusedopt
