#include "core/tensor.h"

namespace moetier {

std::string_view encoding_name(WeightEncoding e) {
  switch (e) {
    case WeightEncoding::F32:
      return "f32";
    case WeightEncoding::BF16:
      return "bf16";
    case WeightEncoding::MXFP4:
      return "mxfp4";
    case WeightEncoding::CB3:
      return "cb3";
  }
  return "unknown";
}

}  // namespace moetier
