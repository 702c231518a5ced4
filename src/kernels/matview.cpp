#include "kernels/matview.h"

#include "core/error.h"
#include "kernels/cb3.h"

namespace moetier::kernels {

void check_matview(const MatView& w, std::string_view what) {
  check(w.rows > 0 && w.cols > 0, "{}: matrix has shape [{}, {}]", what, w.rows, w.cols);
  check(w.data != nullptr, "{}: matrix [{}, {}] has no data", what, w.rows, w.cols);
  switch (w.enc) {
    case WeightEncoding::F32:
    case WeightEncoding::BF16:
      return;
    case WeightEncoding::MXFP4:
      check(w.cols % 32 == 0, "{}: mxfp4 matrix [{}, {}]: cols must be a multiple of 32", what,
            w.rows, w.cols);
      check(w.scales != nullptr, "{}: mxfp4 matrix [{}, {}] has no scales", what, w.rows, w.cols);
      return;
    case WeightEncoding::CB3:
      check(w.scales != nullptr, "{}: cb3 matrix [{}, {}] has no codebook", what, w.rows, w.cols);
      return;
  }
  fail("{}: encoding {} is not supported by this kernel", what, encoding_name(w.enc));
}

int64_t row_bytes(const MatView& w) {
  switch (w.enc) {
    case WeightEncoding::F32:
      return w.cols * 4;
    case WeightEncoding::BF16:
      return w.cols * 2;
    case WeightEncoding::MXFP4:
      return w.cols / 2;
    case WeightEncoding::CB3:
      return cb3_row_bytes(w.cols);
  }
  return 0;
}

}  // namespace moetier::kernels
