// Duplicate-index coalescing for the sparse engine.
//
// Groups the positions of `indices` by row, groups in order of first appearance and
// positions ascending inside a group. The engine then sums each group's gradient
// rows in that order and updates the row once, so results are deterministic and do
// not depend on threading. All arithmetic is 64-bit.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace fusedopt {

struct RowGroups {
  std::vector<int64_t> rows;       // one unique row per group
  std::vector<int64_t> offsets;    // group g owns positions[offsets[g] .. offsets[g+1])
  std::vector<int64_t> positions;  // empty when every index is unique (identity)
  int64_t size() const { return static_cast<int64_t>(rows.size()); }
  bool all_unique() const { return positions.empty(); }
};

// The message for an index outside [0, num_rows) at `position` (CPU and GPU engines).
inline std::string IndexErrorMessage(int64_t position, int64_t value, int64_t num_rows) {
  return "indices[" + std::to_string(position) + "] = " + std::to_string(value) +
         " is not in [0, " + std::to_string(num_rows) + ")";
}

// Groups indices by row, checking each one as it is read: every index is read exactly
// once, and the rows the engine writes are the values that passed the check. (Indices
// may live in memory another thread can change during the call, e.g. a NumPy array or a
// tensor adopting one through DLPack; a second read could name a row outside the table.)
// Keeps its hash table and buffers between calls, so a training step does not pay
// to allocate and page-fault them again (that was a quarter of a 16K-id step).
class Coalescer {
 public:
  // Returns null and sets *error to the message for the first index outside
  // [0, num_rows) (by position), or returns the groups.
  template <typename Index>
  const RowGroups* Group(const Index* indices, int64_t n, int64_t num_rows, std::string* error) {
    RowGroups& groups = groups_;
    groups.rows.clear();
    groups.positions.clear();
    if (num_rows <= 0 && n > 0) {  // no row is valid: the first index is the offender
      *error = IndexErrorMessage(0, static_cast<int64_t>(indices[0]), num_rows);
      return nullptr;
    }
    // At most num_rows distinct valid rows: the table need not outgrow the variable.
    Reserve(n, std::min(n, num_rows));
    const uint64_t mask = static_cast<uint64_t>(keys_.size() - 1);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t row = static_cast<int64_t>(indices[i]);
      if (row < 0 || row >= num_rows) {
        *error = IndexErrorMessage(i, row, num_rows);
        Clear();
        return nullptr;
      }
      uint64_t slot = (static_cast<uint64_t>(row) * 0x9E3779B97F4A7C15ull) >> shift_;
      while (keys_[slot] != -1 && keys_[slot] != row) slot = (slot + 1) & mask;
      if (keys_[slot] == -1) {
        keys_[slot] = row;
        group_of_key_[slot] = groups.size();
        used_slots_.push_back(slot);
        groups.rows.push_back(row);
      }
      group_of_position_[i] = group_of_key_[slot];
    }
    Clear();
    const int64_t num_groups = groups.size();
    groups.offsets.assign(num_groups + 1, 0);
    if (num_groups == n) {  // no duplicates: group g is position g
      for (int64_t g = 0; g <= n; ++g) groups.offsets[g] = g;
    } else {
      // Counting sort of positions by group; stable, so positions stay ascending.
      for (int64_t i = 0; i < n; ++i) ++groups.offsets[group_of_position_[i] + 1];
      for (int64_t g = 0; g < num_groups; ++g) groups.offsets[g + 1] += groups.offsets[g];
      groups.positions.resize(n);
      cursor_.assign(groups.offsets.begin(), groups.offsets.end() - 1);
      for (int64_t i = 0; i < n; ++i) groups.positions[cursor_[group_of_position_[i]]++] = i;
    }
    return &groups;
  }

  // Drops the buffers when the last call needed more than `max_slots` hash slots, so
  // one huge batch does not pin its working memory for the life of the thread.
  void ReleaseIfAbove(int64_t max_slots) {
    if (static_cast<int64_t>(keys_.size()) > max_slots) *this = Coalescer();
  }

 private:
  void Clear() {  // the hash table empty again, in O(groups)
    for (const uint64_t slot : used_slots_) keys_[slot] = -1;
    used_slots_.clear();
  }

  void Reserve(int64_t n, int64_t max_keys) {
    int shift = 64 - 4;
    int64_t capacity = 16;
    while (capacity < 2 * max_keys) {
      capacity *= 2;
      --shift;
    }
    if (static_cast<int64_t>(keys_.size()) < capacity) {
      keys_.assign(capacity, -1);
      group_of_key_.resize(capacity);
      shift_ = shift;
    }
    // A larger table than needed is fine: shift_ matches keys_.size().
    if (static_cast<int64_t>(group_of_position_.size()) < n) group_of_position_.resize(n);
  }

  RowGroups groups_;
  std::vector<int64_t> keys_;  // open addressing keyed by row; -1 marks an empty slot
  std::vector<int64_t> group_of_key_;
  std::vector<uint64_t> used_slots_;
  std::vector<int64_t> group_of_position_;
  std::vector<int64_t> cursor_;
  int shift_ = 64 - 4;
};

// One Coalescer per thread, shared by every rule, dtype and index type: its buffers
// are int64 whatever the index type, and a thread runs one sparse update at a time.
inline Coalescer& ThreadCoalescer() {
  thread_local Coalescer coalescer;
  return coalescer;
}

}  // namespace fusedopt
