// The order in which a rule's per-row phase sums RowTerm(g) over a row's D elements: one
// definition for the CPU, CUDA and XLA engines, so their results agree bit for bit.
//
// Element i goes to lane i % 32; each lane sums its elements left to right (i ascending);
// then the 32 lane sums fold in halves, lane j += lane j + w for w = 16, 8, 4, 2, 1, and
// lane 0 is the row's sum. That is one warp's natural reduction (each thread a lane, the
// fold a shuffle-down tree), four AVX2 registers on the CPU, and a fixed sequence of
// slices and adds in HLO; and it does not depend on threads, launch shapes or timing.
// Lanes past D (D < 32) start at +0 and stay there: RowTerm values are squares here, and
// x + 0 == x for every x but -0 (which a square never is).
#pragma once

#include <cstdint>

#include "cc/core/numeric.h"

namespace fusedopt {

constexpr int kRowSumLanes = 32;

// lanes[0] = the fold of lanes[0 .. 32) (the lanes are overwritten).
template <typename C>
FO_HOST_DEVICE_INLINE C FoldRowLanes(C* lanes) {
  for (int w = kRowSumLanes / 2; w > 0; w /= 2) {
    for (int j = 0; j < w; ++j) lanes[j] += lanes[j + w];
  }
  return lanes[0];
}

// The row sum of Rule::RowTerm over grad[0 .. n), grad in storage type G (a row of the
// caller's gradient) or the compute type (a duplicate-summed row).
template <typename Rule, typename C, typename G>
FO_HOST_DEVICE_INLINE C RowSum(const G* grad, int64_t n) {
  C lanes[kRowSumLanes];
  for (int j = 0; j < kRowSumLanes; ++j) lanes[j] = C(0);
  int64_t i = 0;
  for (; i + kRowSumLanes <= n; i += kRowSumLanes) {
    for (int j = 0; j < kRowSumLanes; ++j) lanes[j] += Rule::RowTerm(C(Load(grad[i + j])));
  }
  for (int j = 0; i + j < n; ++j) lanes[j] += Rule::RowTerm(C(Load(grad[i + j])));
  return FoldRowLanes(lanes);
}

}  // namespace fusedopt
