// Folding a group of any size onto a power of two, for the recursive algorithms.
//
// With p the largest power of two <= N and e = N - p: among the first 2e ranks, each even rank
// hands its data to the odd rank above it and sits out ("extra"); the p remaining ranks take
// new ranks 0..p-1, run the power-of-two algorithm, and the odd ranks hand the result back.
// Cost of the fold: 2 alpha + 2 M beta + M gamma when e > 0, nothing otherwise.
#pragma once

#include <bit>

namespace dtrain::comm::algo {

struct Fold {
  int p = 1;          // power of two taking part
  int extra = 0;      // e = N - p
  int new_rank = -1;  // -1 for a rank that sits out
  int partner = -1;   // the rank that hands over / receives back (-1 if none)

  Fold(int n, int rank) {
    p = static_cast<int>(std::bit_floor(static_cast<unsigned>(n)));
    extra = n - p;
    if (rank < 2 * extra) {
      if (rank % 2 == 0) {
        partner = rank + 1;
      } else {
        partner = rank - 1;
        new_rank = rank / 2;
      }
    } else {
      new_rank = rank - extra;
    }
  }
  // The group rank of new rank v.
  int old_rank(int v) const { return v < extra ? 2 * v + 1 : v + extra; }
};

}  // namespace dtrain::comm::algo
