// Checks shared by every kernel that reads a MatView (core/tensor.h).
#pragma once

#include <cstdint>
#include <string_view>

#include "core/tensor.h"

namespace moetier::kernels {

// Throws Error naming `what` unless w is a usable matrix: rows, cols > 0,
// data set, MXFP4 with cols % 32 == 0 and scales set, CB3 with scales (its
// codebook) set.
void check_matview(const MatView& w, std::string_view what);

// Bytes of one row of w's data (MXFP4: cols/2, CB3: ceil(3 cols / 8)).
int64_t row_bytes(const MatView& w);

}  // namespace moetier::kernels
