// Fitting CB3 (kernels/cb3.h): per output row, 8 f16 centroids and a 3-bit
// code per element, by weighted k-means in one dimension.
//
// For one row x [cols] with column weights w [cols] (w = 1 without
// calibration; else the mean squared input activation of each column, so the
// fit minimizes the expected squared error of the row's dot product):
//   1. sort the row (ties by column, so the result is deterministic) and take
//      prefix sums of w and w*x;
//   2. initialize centroid k at the weighted quantile (k + 1/2) / 8;
//   3. Lloyd iterations: each element goes to its nearest centroid (in 1-D,
//      a contiguous run of the sorted row cut at the midpoints), each centroid
//      moves to the weighted mean of its run (an empty run keeps its
//      centroid); stop when no centroid moves or after `iterations`;
//   4. round the centroids to f16 (clamped to +-65504), sort them, and code
//      every element as its nearest f16 centroid (ties to the lower one).
// If every weight is zero the row is fitted with unit weights.
#pragma once

#include <cstdint>
#include <vector>

namespace moetier {

struct Cb3Scratch {
  std::vector<int32_t> order;   // [cols]
  std::vector<double> pw, pwx;  // [cols + 1] prefix sums of w and w*x (sorted order)
  std::vector<float> sorted;    // [cols]
  std::vector<uint8_t> codes;   // [cols] unpacked
};

// Fits one row; writes codebook [8] (f16 bits, ascending) and codes [cols]
// (unpacked, 0..7). x must be finite; w may be null (all 1).
void cb3_fit_row(const float* x, const float* w, int64_t cols, int iterations, uint16_t* codebook,
                 uint8_t* codes, Cb3Scratch& s);

// Weighted squared error sum_c w_c (x_c - q_c)^2 and energy sum_c w_c x_c^2.
struct Cb3Error {
  double err = 0, energy = 0;
  double relative() const { return energy > 0 ? err / energy : 0.0; }
};

// Encodes a finite f32 matrix w [rows, cols] into codes [rows,
// cb3_row_bytes(cols)] and codebook [rows, 8] f16 (as bytes, little-endian),
// with column weights col_w [cols] (null: all 1). Parallel over rows (thread pool)
// for matrices of at least 2^16 elements;
// the result does not depend on the thread count.
Cb3Error cb3_encode_matrix(const float* w, int64_t rows, int64_t cols, const float* col_w,
                           int iterations, uint8_t* codes, uint8_t* codebook);

// 3-bit uniform round-to-nearest of one row (8 levels evenly spaced from its
// min to its max), the baseline the fit is compared with in tests and docs.
Cb3Error uniform3_error(const float* x, const float* w, int64_t cols);

}  // namespace moetier
