// ggml_dequant: decode GGUF tensors with ggml's own type traits (to_float, i.e.
// dequantize_row_mxfp4 for MXFP4) and write them as raw f32, for
// check_gguf_values.py --ggml-dequant (docs/peers.md). Our code, against
// ggml's public headers (ggml.h, gguf.h).
//
//   ggml_dequant MODEL.gguf OUT_DIR NAME...     writes OUT_DIR/NAME.f32
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "ggml.h"
#include "gguf.h"

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: ggml_dequant MODEL.gguf OUT_DIR NAME...\n");
    return 2;
  }
  ggml_context* ctx = nullptr;
  gguf_init_params ip = {/*no_alloc=*/false, /*ctx=*/&ctx};
  gguf_context* g = gguf_init_from_file(argv[1], ip);
  if (!g || !ctx) {
    std::fprintf(stderr, "ggml_dequant: cannot read %s\n", argv[1]);
    return 1;
  }
  for (int i = 3; i < argc; ++i) {
    ggml_tensor* t = ggml_get_tensor(ctx, argv[i]);
    if (!t) {
      std::fprintf(stderr, "ggml_dequant: no tensor %s\n", argv[i]);
      return 1;
    }
    const int64_t n = ggml_nelements(t);
    std::vector<float> out(static_cast<size_t>(n));
    const ggml_type_traits* tr = ggml_get_type_traits(t->type);
    if (t->type == GGML_TYPE_F32) {
      std::copy_n(static_cast<const float*>(t->data), n, out.data());
    } else if (tr->to_float) {
      tr->to_float(t->data, out.data(), n);
    } else {
      std::fprintf(stderr, "ggml_dequant: %s: type %s has no to_float\n", argv[i], tr->type_name);
      return 1;
    }
    std::string path = std::string(argv[2]) + "/" + argv[i] + ".f32";
    FILE* f = std::fopen(path.c_str(), "wb");
    if (!f || std::fwrite(out.data(), sizeof(float), out.size(), f) != out.size()) {
      std::fprintf(stderr, "ggml_dequant: cannot write %s\n", path.c_str());
      return 1;
    }
    std::fclose(f);
  }
  gguf_free(g);
  ggml_free(ctx);
  return 0;
}
