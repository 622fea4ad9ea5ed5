// fusedopt._core_cuda's asynchronous index checks (page-locked records the device copies
// verdicts into, PendingCheck for a call still running), its stream-ordered scratch memory,
// and the engine's Status as a Python exception.
#pragma once

#include <cuda_runtime.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "cc/core/gpu/engine_gpu.h"

namespace fusedopt {
namespace cuda_module {

namespace py = pybind11;

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

inline void Check(const gpu::Status& s) {
  if (s.ok()) return;
  if (s.code == gpu::Status::kInvalidArgument) throw py::value_error(s.message);
  if (s.code == gpu::Status::kResourceExhausted) {
    PyErr_SetString(PyExc_MemoryError, s.message.c_str());
    throw py::error_already_set();
  }
  throw std::runtime_error(s.message);
}

}  // namespace cuda_module
}  // namespace fusedopt
