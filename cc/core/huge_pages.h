// Transparent huge pages for the big buffers the CPU engine updates.
//
// A sparse step over a table of millions of rows touches rows scattered over gigabytes:
// with 4 KB pages nearly every row costs a TLB miss, and the step time grows with the
// table (BENCHMARKS.md, "table size"). Linux backs memory with 2 MB pages where a mapping
// asks for them (THP "madvise" mode, the common default) or always ("always"). So before
// updating a buffer of at least kMinBytes, the engine advises MADV_HUGEPAGE on it (a cheap
// flag on the mapping, repeated every call because a freed and reallocated buffer is a new
// mapping) and, once per buffer, MADV_COLLAPSE (Linux >= 6.1) in a background thread: the
// buffer was written before it reached us (initialisation), so its pages are already
// small, and only a collapse makes them huge now rather than whenever khugepaged gets to
// them (at its default pace, hours for gigabytes).
//
// Advice never changes a value; failures (no THP, old kernel, not anonymous memory) are
// ignored. FUSEDOPT_HUGE_PAGES=0 turns it off (=1 or unset: on); `HugePageStats()` says
// what was done (fusedopt.info and the tests read it through _core).
#pragma once

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace fusedopt {

struct HugePageCounters {
  bool enabled = false;
  int64_t advised_calls = 0;     // MADV_HUGEPAGE calls that succeeded
  int64_t collapsed_buffers = 0;  // buffers MADV_COLLAPSE succeeded on, every chunk
  int64_t collapsed_bytes = 0;    // bytes of the chunks it succeeded on
  int64_t collapse_failures = 0;  // buffers with a chunk it failed on (no free huge page,
                                  // buffer freed meanwhile, no MADV_COLLAPSE)
  int64_t pending_bytes = 0;      // queued for the background thread, not done yet
};

namespace detail {

constexpr int64_t kHugePage = int64_t{2} << 20;
// Smaller buffers mostly live in the caches, where the page size does not matter.
constexpr int64_t kMinHugePageBytes = int64_t{32} << 20;
// Buffers already collapsed, by (aligned start, length); bounded: the oldest are
// forgotten (at worst one more collapse of a buffer that is already huge: no change).
constexpr size_t kMaxCollapsedBuffers = 1024;

class HugePageAdvisor {
 public:
  static HugePageAdvisor& Get() {
    static HugePageAdvisor* advisor = new HugePageAdvisor();  // never destroyed
    return *advisor;
  }

  void Advise(const void* data, int64_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (!enabled_ || bytes < kMinHugePageBytes) return;
    // Only whole 2 MB pages inside the buffer: never advise a neighbour's memory.
    const auto address = reinterpret_cast<uintptr_t>(data);
    const uintptr_t begin = (address + kHugePage - 1) & ~static_cast<uintptr_t>(kHugePage - 1);
    const uintptr_t end = (address + bytes) & ~static_cast<uintptr_t>(kHugePage - 1);
    if (end <= begin) return;
    if (madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE) != 0) return;
    advised_calls_.fetch_add(1, std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(mu_);
    if (!collapse_supported_) return;
    // Collapsing copies the buffer (about a second per GB): a background thread does it,
    // a chunk at a time, so no step waits for it and each chunk helps as soon as it is
    // done. Advice is safe on memory freed or reused meanwhile: it never changes a value.
    // Advice is an optimisation: out of memory for the lists or a thread for the worker,
    // the buffer is simply not collapsed (and the update goes on).
    try {
      if (!FirstTime(begin, end - begin)) return;
      queue_.emplace_back(begin, end - begin);
    } catch (const std::exception&) {
      return;
    }
    counters_.pending_bytes += static_cast<int64_t>(end - begin);
    if (!worker_started_) {
      try {
        std::thread([this] { CollapseLoop(); }).detach();
        worker_started_ = true;
      } catch (const std::exception&) {
        return;  // queued: the next advice tries to start the worker again
      }
    }
    wake_.notify_one();
#else
    (void)data;
    (void)bytes;
#endif
  }

  HugePageCounters Counters() {
    std::lock_guard<std::mutex> lock(mu_);
    HugePageCounters counters = counters_;
    counters.enabled = enabled_;
    counters.advised_calls = advised_calls_.load(std::memory_order_relaxed);
    return counters;
  }

 private:
  static constexpr int kCollapse = 25;  // MADV_COLLAPSE (Linux 6.1), absent from older headers
  static constexpr size_t kChunk = size_t{32} << 20;

  HugePageAdvisor() {
    const char* setting = std::getenv("FUSEDOPT_HUGE_PAGES");
    enabled_ = setting == nullptr || std::strcmp(setting, "0") != 0;
  }

  // Called with mu_ held.
  bool FirstTime(uintptr_t begin, size_t length) {
    for (const auto& buffer : collapsed_) {
      if (buffer.first == begin && buffer.second == length) return false;
    }
    if (collapsed_.size() == kMaxCollapsedBuffers) collapsed_.erase(collapsed_.begin());
    collapsed_.emplace_back(begin, length);
    return true;
  }

  // Whether this kernel collapses at all: MADV_COLLAPSE on a small region of our own,
  // written first. EINVAL there means no MADV_COLLAPSE (Linux < 6.1) or THP off. On a
  // buffer, EINVAL says only that this range failed: Linux 6.18 returns it for ranges
  // never written (np.zeros slots), and later buffers still collapse.
  static bool KernelCollapses() {
#if defined(__linux__)
    const size_t bytes = 2 * static_cast<size_t>(kHugePage);
    void* region = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                        -1, 0);
    if (region == MAP_FAILED) return true;  // cannot tell: try the buffers themselves
    const auto address = reinterpret_cast<uintptr_t>(region);
    char* page = reinterpret_cast<char*>((address + kHugePage - 1) &
                                         ~static_cast<uintptr_t>(kHugePage - 1));
    std::memset(page, 1, static_cast<size_t>(kHugePage));
    madvise(page, static_cast<size_t>(kHugePage), MADV_HUGEPAGE);
    const bool collapses = madvise(page, static_cast<size_t>(kHugePage), kCollapse) == 0 ||
                           errno != EINVAL;
    munmap(region, bytes);
    return collapses;
#else
    return false;
#endif
  }

  void CollapseLoop() {
#if defined(__linux__)
    const bool collapses = KernelCollapses();
    std::unique_lock<std::mutex> lock(mu_);
    collapse_supported_ = collapses;
    for (;;) {
      wake_.wait(lock, [this] { return !queue_.empty(); });
      const auto [begin, length] = queue_.front();
      queue_.erase(queue_.begin());
      bool collapsed = collapse_supported_;  // every chunk of it, once tried
      size_t remaining = length;
      for (size_t done = 0; done < length && collapse_supported_; done += kChunk) {
        const size_t chunk = std::min(kChunk, length - done);
        lock.unlock();
        const int rc = madvise(reinterpret_cast<void*>(begin + done), chunk, kCollapse);
        lock.lock();
        counters_.pending_bytes -= static_cast<int64_t>(chunk);
        remaining -= chunk;
        if (rc == 0) {
          counters_.collapsed_bytes += static_cast<int64_t>(chunk);
        } else {
          collapsed = false;  // this chunk only (EINVAL, EAGAIN, ENOMEM, buffer freed)
        }
      }
      counters_.pending_bytes -= static_cast<int64_t>(remaining);  // skipped: unsupported
      if (collapsed) {
        ++counters_.collapsed_buffers;
      } else {
        ++counters_.collapse_failures;
      }
    }
#endif
  }

  bool enabled_ = true;
  std::atomic<int64_t> advised_calls_{0};
  std::mutex mu_;  // guards everything below
  std::condition_variable wake_;
  bool collapse_supported_ = true;
  bool worker_started_ = false;
  HugePageCounters counters_;
  std::vector<std::pair<uintptr_t, size_t>> collapsed_;  // buffers queued once
  std::vector<std::pair<uintptr_t, size_t>> queue_;
};

}  // namespace detail

// Advises huge pages for a buffer the engine is about to update (see the file comment).
inline void AdviseHugePages(const void* data, int64_t bytes) {
  detail::HugePageAdvisor::Get().Advise(data, bytes);
}

inline HugePageCounters HugePageStats() { return detail::HugePageAdvisor::Get().Counters(); }

}  // namespace fusedopt
