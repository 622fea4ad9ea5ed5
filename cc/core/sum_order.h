// The order in which a row's duplicate gradients are summed: one definition for the CPU
// and CUDA engines, so their float/double results agree bit for bit.
//
// The `count` gradient rows of one table row (positions ascending) are cut into
// consecutive chunks of DuplicateChunkLength(count) rows; each chunk is summed left to
// right, then the chunk sums left to right:
//   count <= 32      one chunk: ((g0 + g1) + g2) + ...  (plain order of appearance)
//   count <= 1024    chunks of 32
//   larger           chunks of ceil(sqrt(count))
// Neither level is longer than max(32, ceil(sqrt(count))), so a hot row (Zipf ids give one
// row tens of thousands of duplicates per batch) is summed by many GPU threads in parallel
// and in two short dependent chains, and the order is fixed by `count` alone: it never
// depends on thread counts, launch shapes or timing.
#pragma once

#include <cstdint>

#include "cc/core/numeric.h"

namespace fusedopt {

// Up to this many duplicates a row is summed in one left-to-right chain.
constexpr int64_t kSerialSumLength = 32;

FO_HOST_DEVICE int64_t DuplicateChunkLength(int64_t count) {
  if (count <= kSerialSumLength * kSerialSumLength) return kSerialSumLength;
  // ceil(sqrt(count)), exactly: start from the double estimate and correct it.
  int64_t root = static_cast<int64_t>(sqrt(static_cast<double>(count)));
  while (root * root < count) ++root;
  while ((root - 1) * (root - 1) >= count) --root;
  return root;
}

// Number of chunks (the partial sums of the first level); 1 for count <= 32.
FO_HOST_DEVICE int64_t DuplicateChunks(int64_t count) {
  const int64_t length = DuplicateChunkLength(count);
  return (count + length - 1) / length;
}

}  // namespace fusedopt
