// Duplicate-index coalescing for the sparse engine.
//
// Groups the positions of `indices` by row, groups in order of first appearance and
// positions ascending inside a group. The engine then sums each group's gradient
// rows in that order and updates the row once, so results are deterministic and do
// not depend on threading. All arithmetic is 64-bit.
#ifndef FUSEDOPT_CC_CORE_COALESCE_H_
#define FUSEDOPT_CC_CORE_COALESCE_H_

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

// Returns "" when every index is in [0, num_rows), else names the first offender.
template <typename Index>
std::string CheckIndices(const Index* indices, int64_t n, int64_t num_rows) {
  int64_t bad = -1;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = static_cast<int64_t>(indices[i]);
    if (row < 0 || row >= num_rows) {
      bad = i;
      break;
    }
  }
  if (bad < 0) return "";
  return "indices[" + std::to_string(bad) + "] = " +
         std::to_string(static_cast<int64_t>(indices[bad])) + " is not in [0, " +
         std::to_string(num_rows) + ")";
}

// Requires CheckIndices to have passed (indices are non-negative).
template <typename Index>
RowGroups CoalesceIndices(const Index* indices, int64_t n) {
  RowGroups groups;
  groups.rows.reserve(n);
  // Open addressing keyed by row; -1 marks an empty slot (rows are >= 0).
  int shift = 64 - 4;
  int64_t capacity = 16;
  while (capacity < 2 * n) {
    capacity *= 2;
    --shift;
  }
  std::vector<int64_t> keys(capacity, -1);
  std::vector<int64_t> group_of_key(capacity);
  std::vector<int64_t> group_of_position(n);
  const uint64_t mask = static_cast<uint64_t>(capacity - 1);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = static_cast<int64_t>(indices[i]);
    uint64_t slot = (static_cast<uint64_t>(row) * 0x9E3779B97F4A7C15ull) >> shift;
    while (keys[slot] != -1 && keys[slot] != row) slot = (slot + 1) & mask;
    if (keys[slot] == -1) {
      keys[slot] = row;
      group_of_key[slot] = groups.size();
      groups.rows.push_back(row);
    }
    group_of_position[i] = group_of_key[slot];
  }
  const int64_t num_groups = groups.size();
  groups.offsets.assign(num_groups + 1, 0);
  if (num_groups == n) {  // no duplicates: group g is position g
    for (int64_t g = 0; g <= n; ++g) groups.offsets[g] = g;
    return groups;
  }
  // Counting sort of positions by group; stable, so positions stay ascending.
  for (int64_t i = 0; i < n; ++i) ++groups.offsets[group_of_position[i] + 1];
  for (int64_t g = 0; g < num_groups; ++g) groups.offsets[g + 1] += groups.offsets[g];
  groups.positions.resize(n);
  std::vector<int64_t> cursor(groups.offsets.begin(), groups.offsets.end() - 1);
  for (int64_t i = 0; i < n; ++i) groups.positions[cursor[group_of_position[i]]++] = i;
  return groups;
}

}  // namespace fusedopt

#endif  // FUSEDOPT_CC_CORE_COALESCE_H_
