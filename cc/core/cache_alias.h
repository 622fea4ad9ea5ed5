// Buffers the L1 data cache cannot hold together, and where to move one so it can.
//
// AMD Zen cores choose an L1D way by a micro-tag hashed from linear address bits 12-27:
// two lines in the same set with the same micro-tag cannot be cached at once. Buffers
// whose addresses agree modulo 2^28 therefore evict each other at every index when a
// loop walks them in step, as an update walks var, its slots and the gradient. TF's CPU
// allocator places equal-size large tensors (a variable and its slots) at exact 2^28 or
// 2^29 byte distances: a 128M-parameter Adam step measured 260-540 ms on such buffers
// against 80 ms on the same buffers 4 KB apart (BENCHMARKS.md, "Buffers the L1 cannot
// hold together"). Lines a little apart in the period collide too (with each other's
// neighbours, which the prefetcher brings in), so "aliased" here means closer than
// kAliasWindow modulo kAliasPeriod.
//
// The TF kernels (cc/tf/separate_buffers.h) move a variable's or slot's buffer that
// aliases another buffer of the same update to a fresh one, once: values unchanged, the
// copy paid once. FUSEDOPT_SEPARATE_BUFFERS=0 turns it off; `SeparationStats()` says what
// was done (fusedopt.ops.buffer_separation_stats(), fusedopt.info).
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace fusedopt {

constexpr uint64_t kAliasPeriod = uint64_t{1} << 28;
constexpr uint64_t kAliasWindow = uint64_t{64} << 10;
// Smaller buffers rarely come from the allocator's large, page-aligned mappings, and
// moving them would cost more than it saves.
constexpr int64_t kMinSeparatedBytes = int64_t{1} << 20;
// A moved buffer starts at one of kSeparationSteps offsets kSeparationStep apart inside
// a slightly larger allocation; their span (1 MB) exceeds the windows that up to
// kMaxSeparatedPeers other buffers can exclude (2 x kAliasWindow each), so one is free.
constexpr uint64_t kSeparationStep = uint64_t{16} << 10;
constexpr int kSeparationSteps = 64;
constexpr int64_t kSeparationPad = static_cast<int64_t>(kSeparationStep) * kSeparationSteps;
constexpr int kMaxSeparatedPeers = 7;

inline bool CacheAliased(const void* a, const void* b) {
  const uint64_t d =
      (reinterpret_cast<uintptr_t>(a) - reinterpret_cast<uintptr_t>(b)) & (kAliasPeriod - 1);
  return d < kAliasWindow || d > kAliasPeriod - kAliasWindow;
}

// The first offset (a multiple of kSeparationStep below kSeparationPad) at which a buffer
// starting at base + offset aliases none of `others`; -1 if every one does (more than
// kMaxSeparatedPeers others).
inline int64_t SeparatingOffset(const char* base, const std::vector<const void*>& others) {
  for (int step = 0; step < kSeparationSteps; ++step) {
    const char* candidate = base + step * kSeparationStep;
    bool free = true;
    for (const void* other : others) free = free && !CacheAliased(candidate, other);
    if (free) return step * static_cast<int64_t>(kSeparationStep);
  }
  return -1;
}

// Which of `buffers` (each at least kMinSeparatedBytes, or ignored) to move so that none
// aliases another: buffers[i] for i < first_movable stay (a gradient); of the rest, in
// order, each one that aliases a buffer staying or kept before it moves.
inline std::vector<int> BuffersToSeparate(const std::vector<const void*>& buffers,
                                          const std::vector<int64_t>& bytes, int first_movable) {
  std::vector<int> move;
  std::vector<int> kept;
  for (int i = 0; i < static_cast<int>(buffers.size()); ++i) {
    if (bytes[i] < kMinSeparatedBytes) continue;
    bool aliased = false;
    for (int j : kept) aliased = aliased || CacheAliased(buffers[i], buffers[j]);
    if (aliased && i >= first_movable) {
      move.push_back(i);
    } else {
      kept.push_back(i);
    }
  }
  return move;
}

struct SeparationCounters {
  bool enabled = false;
  int64_t moved_buffers = 0;  // buffers moved away from one they aliased
  int64_t moved_bytes = 0;
  int64_t failures = 0;       // aliased but left: no memory for the copy, or no free offset
};

namespace detail {

class SeparationLedger {
 public:
  static SeparationLedger& Get() {
    static SeparationLedger* ledger = new SeparationLedger();  // never destroyed
    return *ledger;
  }
  bool enabled() const { return enabled_; }
  void Moved(int64_t bytes) {
    moved_buffers_.fetch_add(1, std::memory_order_relaxed);
    moved_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  }
  void Failed() { failures_.fetch_add(1, std::memory_order_relaxed); }
  SeparationCounters Counters() const {
    SeparationCounters c;
    c.enabled = enabled_;
    c.moved_buffers = moved_buffers_.load(std::memory_order_relaxed);
    c.moved_bytes = moved_bytes_.load(std::memory_order_relaxed);
    c.failures = failures_.load(std::memory_order_relaxed);
    return c;
  }

 private:
  SeparationLedger() {
    const char* setting = std::getenv("FUSEDOPT_SEPARATE_BUFFERS");
    enabled_ = setting == nullptr || std::strcmp(setting, "0") != 0;
  }
  bool enabled_ = true;
  std::atomic<int64_t> moved_buffers_{0}, moved_bytes_{0}, failures_{0};
};

}  // namespace detail

inline bool SeparationEnabled() { return detail::SeparationLedger::Get().enabled(); }
inline SeparationCounters SeparationStats() { return detail::SeparationLedger::Get().Counters(); }

}  // namespace fusedopt
