// llama_logits: llama.cpp's side of the peer value check (docs/peers.md), written
// against llama.cpp's public C API (include/llama.h); no llama.cpp code in it.
//
//   llama_logits MODEL.gguf --prompt TEXT [-n N] [--dump FILE] [--kv f32|f16]
//                [--ngl L] [--threads T]
//
// Same protocol as moetier_logits: prompt in one llama_decode, then N greedy
// steps (argmax, lowest id on ties, end-of-generation ignored); prints one JSON
// object (prompt ids, generated ids, text); --dump writes [N+1, vocab] raw f32
// logits (row 0: the last prompt position). Special-token text in the prompt is
// parsed (as moetier and HF tokenizers do). The KV cache is f32 by default
// (llama.cpp's own default is f16) so that only the weights' and kernels'
// arithmetic differs. Built by scripts/peers/llama.cpp.sh harness-llama.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "llama.h"

static void quiet(enum ggml_log_level level, const char* text, void*) {
  if (level >= GGML_LOG_LEVEL_WARN) std::fputs(text, stderr);
}

static void print_ids(const char* key, const std::vector<llama_token>& ids) {
  std::printf("\"%s\": [", key);
  for (size_t i = 0; i < ids.size(); ++i) std::printf("%s%d", i ? ", " : "", ids[i]);
  std::printf("],\n");
}

int main(int argc, char** argv) {
  std::string path, prompt, dump, kv = "f32";
  int n = 32, ngl = 0, threads = 0;
  bool verbose = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "llama_logits: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--prompt" || a == "-p") prompt = next();
    else if (a == "-n") n = std::atoi(next().c_str());
    else if (a == "--dump") dump = next();
    else if (a == "--kv") kv = next();
    else if (a == "--ngl") ngl = std::atoi(next().c_str());
    else if (a == "--threads" || a == "-t") threads = std::atoi(next().c_str());
    else if (a == "-v") verbose = true;
    else if (path.empty() && a[0] != '-') path = a;
    else {
      std::fprintf(stderr, "usage: llama_logits MODEL.gguf --prompt TEXT [-n N] [--dump FILE]\n");
      return 2;
    }
  }
  if (path.empty() || prompt.empty() || (kv != "f32" && kv != "f16")) {
    std::fprintf(stderr, "usage: llama_logits MODEL.gguf --prompt TEXT [-n N] [--dump FILE] "
                         "[--kv f32|f16]\n");
    return 2;
  }
  if (!verbose) llama_log_set(quiet, nullptr);
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = ngl;
  if (!verbose) mp.progress_callback = [](float, void*) { return true; };  // no dots
  llama_model* model = llama_model_load_from_file(path.c_str(), mp);
  if (!model) {
    std::fprintf(stderr, "llama_logits: cannot load %s\n", path.c_str());
    return 1;
  }
  const llama_vocab* vocab = llama_model_get_vocab(model);
  const int n_vocab = llama_vocab_n_tokens(vocab);
  int np = -llama_tokenize(vocab, prompt.data(), int(prompt.size()), nullptr, 0, true, true);
  std::vector<llama_token> ids(size_t(np > 0 ? np : 0));
  if (np <= 0 ||
      llama_tokenize(vocab, prompt.data(), int(prompt.size()), ids.data(), np, true, true) < 0) {
    std::fprintf(stderr, "llama_logits: tokenization failed\n");
    return 1;
  }
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = uint32_t(np + n + 8);
  cp.n_batch = cp.n_ubatch = uint32_t(np > 32 ? np : 32);
  cp.no_perf = true;
  if (threads > 0) cp.n_threads = cp.n_threads_batch = threads;
  if (kv == "f32") cp.type_k = cp.type_v = GGML_TYPE_F32;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) {
    std::fprintf(stderr, "llama_logits: cannot create a context\n");
    return 1;
  }
  FILE* f = dump.empty() ? nullptr : std::fopen(dump.c_str(), "wb");
  if (!dump.empty() && !f) {
    std::fprintf(stderr, "llama_logits: cannot open %s\n", dump.c_str());
    return 1;
  }
  std::vector<llama_token> gen;
  std::vector<llama_token> in = ids;
  for (int s = 0;; ++s) {
    if (llama_decode(ctx, llama_batch_get_one(in.data(), int32_t(in.size()))) != 0) {
      std::fprintf(stderr, "llama_logits: llama_decode failed at step %d\n", s);
      return 1;
    }
    const float* lg = llama_get_logits_ith(ctx, -1);
    if (f) std::fwrite(lg, sizeof(float), size_t(n_vocab), f);
    if (s == n) break;
    int best = 0;
    for (int i = 1; i < n_vocab; ++i)
      if (lg[i] > lg[best]) best = i;
    gen.push_back(best);
    in.assign(1, best);
  }
  if (f) std::fclose(f);
  std::string text;
  for (llama_token t : gen) {
    char buf[256];
    int k = llama_token_to_piece(vocab, t, buf, sizeof buf, 0, true);
    if (k > 0) text.append(buf, size_t(k));
  }
  std::string esc;
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') { esc += '\\'; esc += char(c); }
    else if (c == '\n') esc += "\\n";
    else if (c == '\t') esc += "\\t";
    else if (c < 0x20) { char b[8]; std::snprintf(b, sizeof b, "\\u%04x", c); esc += b; }
    else esc += char(c);
  }
  std::printf("{\n\"engine\": \"llama.cpp\",\n\"n_vocab\": %d,\n", n_vocab);
  print_ids("prompt_ids", ids);
  print_ids("generated_ids", gen);
  std::printf("\"text\": \"%s\"\n}\n", esc.c_str());
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
