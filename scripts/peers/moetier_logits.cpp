// moetier_logits: moetier's side of the peer value check (docs/peers.md).
//
//   moetier_logits DIR --prompt TEXT [-n N] [--dump FILE] [--threads T]
//
// Tokenizes the prompt, runs the prompt in one forward pass and then N greedy
// steps (argmax, lowest id on ties, end-of-sequence ignored), and prints one JSON
// object: prompt ids, generated ids. --dump writes the logits of every step as
// raw little-endian f32, [N+1, vocab] (row 0: the last prompt position).
// "route_margin" is, per forward pass, the smallest gap over layers and tokens
// between the k-th and (k+1)-th router probabilities: where it is tiny, an
// engine's rounding can pick a different k-th expert (a discrete jump).
// Built into the worktree's build by scripts/peers/llama.cpp.sh harness-moetier
// (CMAKE_PROJECT_moetier_INCLUDE=scripts/peers/harness.cmake), linked to
// moetier_runtime; the experts are the in-place MappedExperts.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "format/safetensors.h"
#include "format/tokenizer.h"
#include "kernels/cpu/cpu.h"
#include "runtime/mapped_experts.h"
#include "runtime/model.h"
#include "runtime/session.h"

using namespace moetier;

static int32_t argmax(const std::vector<float>& v) {
  size_t best = 0;
  for (size_t i = 1; i < v.size(); ++i)
    if (v[i] > v[best]) best = i;
  return int32_t(best);
}

static void print_ids(const char* key, const std::vector<int32_t>& ids, bool comma) {
  std::printf("\"%s\": [", key);
  for (size_t i = 0; i < ids.size(); ++i) std::printf("%s%d", i ? ", " : "", ids[i]);
  std::printf("]%s\n", comma ? "," : "");
}

int main(int argc, char** argv) {
  std::string dir, prompt, dump;
  int64_t n = 32;
  int threads = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "moetier_logits: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--prompt" || a == "-p") prompt = next();
    else if (a == "-n") n = std::atoll(next().c_str());
    else if (a == "--dump") dump = next();
    else if (a == "--threads" || a == "-t") threads = std::atoi(next().c_str());
    else if (dir.empty() && a[0] != '-') dir = a;
    else {
      std::fprintf(stderr, "usage: moetier_logits DIR --prompt TEXT [-n N] [--dump FILE]\n");
      return 2;
    }
  }
  if (dir.empty() || prompt.empty()) {
    std::fprintf(stderr, "usage: moetier_logits DIR --prompt TEXT [-n N] [--dump FILE]\n");
    return 2;
  }
  try {
    if (threads > 0) cpu::set_threads(threads);
    Tokenizer tok = Tokenizer::load(dir);
    auto ck = Checkpoint::open(dir);
    const std::unique_ptr<Model> model = load_model(*ck);
    MappedExperts experts(*ck, model->spec());
    const std::vector<int32_t> ids = tok.encode(prompt);
    check(!ids.empty(), "--prompt: the prompt encodes to no tokens");
    Session session(*model, experts, int64_t(ids.size()) + n + 1);
    FILE* f = dump.empty() ? nullptr : std::fopen(dump.c_str(), "wb");
    check(dump.empty() || f, "--dump: cannot open {}", dump);
    const int64_t k = model->spec().experts_per_token;
    float margin = 1.0f;
    std::vector<float> margins;
    ForwardOptions fo;
    RoutingObserver obs = [&](const RoutingEvent& ev) {
      const Routing& r = *ev.routing;
      std::vector<float> p(size_t(r.num_experts));
      for (int64_t t = 0; t < r.n_tokens; ++t) {
        std::copy_n(r.probs.begin() + t * r.num_experts, r.num_experts, p.begin());
        std::nth_element(p.begin(), p.begin() + k, p.end(), std::greater<float>());
        const float next = p[size_t(k)];
        const float kth = *std::min_element(p.begin(), p.begin() + k);
        margin = std::min(margin, kth - next);
      }
    };
    fo.observer = &obs;
    std::vector<float> logits = session.prefill(ids, fo);
    margins.push_back(margin);
    std::vector<int32_t> gen;
      for (int64_t s = 0;; ++s) {
      if (f) std::fwrite(logits.data(), sizeof(float), logits.size(), f);
      if (s == n) break;
      const int32_t t = argmax(logits);
      gen.push_back(t);
      margin = 1.0f;
      logits = session.decode(t, fo);
      margins.push_back(margin);
    }
    if (f) std::fclose(f);
    std::printf("{\n\"engine\": \"moetier\",\n\"n_vocab\": %zu,\n", logits.size());
    print_ids("prompt_ids", ids, true);
    print_ids("generated_ids", gen, true);
    std::printf("\"route_margin\": [");
    for (size_t i = 0; i < margins.size(); ++i) std::printf("%s%.3g", i ? ", " : "", margins[i]);
    std::printf("],\n");
    std::string text = tok.decode(gen);
    std::string esc;
    for (unsigned char c : text) {
      if (c == '"' || c == '\\') { esc += '\\'; esc += char(c); }
      else if (c == '\n') esc += "\\n";
      else if (c == '\t') esc += "\\t";
      else if (c < 0x20) { char b[8]; std::snprintf(b, sizeof b, "\\u%04x", c); esc += b; }
      else esc += char(c);
    }
    std::printf("\"text\": \"%s\"\n}\n", esc.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moetier_logits: %s\n", e.what());
    return 1;
  }
  return 0;
}
