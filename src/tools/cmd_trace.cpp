// moetier trace DIR --corpus FILE... --tokens N -o TRACE [--window W]
//   [--decode D] [--ctx N] [--weights f16|f32] [--threads T]
// Runs the model over text the way the engine runs prompts and records, for
// every token and MoE layer, the selected experts and their weights
// (docs/trace-and-simulate.md). Each corpus file gets an equal share of the N
// tokens; its token stream is cut into windows of W tokens, each prefilled as
// one prompt chunk and followed by D greedy decode steps; W + D must fit the
// context (--ctx, else max_position_embeddings) or nothing runs. Writes TRACE (binary),
// TRACE.json (summary) and TRACE.ranking (for --policy pinned --ranking), each
// atomically. "-" reads a corpus from stdin.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/progress.h"
#include "core/units.h"
#include "experts/trace.h"
#include "format/safetensors.h"
#include "format/tokenizer.h"
#include "kernels/cpu/cpu.h"
#include "runtime/mapped_experts.h"
#include "runtime/model.h"
#include "runtime/trace_recorder.h"
#include "tools/command.h"
#include "tools/context.h"

namespace moetier::tools {
namespace {

namespace fs = std::filesystem;

struct TraceArgs {
  std::string dir, out;
  std::vector<std::string> corpus;
  int64_t tokens = 0, window = 256, decode = 0;
  int64_t ctx = 0;  // 0: max_position_embeddings
  std::string weights = "f16";
  int threads = 0;
};

// Text of a corpus file, tokenized piece by piece (pieces end at a newline).
class CorpusStream {
 public:
  explicit CorpusStream(const std::string& name) : name_(name) {
    if (name == "-") return;
    file_.open(name, std::ios::binary);
    check(bool(file_), "--corpus: {}: cannot open", name);
  }
  // Tokenizes more text until `buf` holds at least `want` tokens or the text
  // ends; returns false once the text is exhausted and nothing was added.
  bool fill(const Tokenizer& tok, std::vector<int32_t>& buf, size_t want) {
    while (buf.size() < want && !done_) {
      std::string piece = rest_;
      rest_.clear();
      char block[1 << 16];
      std::istream& in = name_ == "-" ? std::cin : file_;
      in.read(block, sizeof block);
      const std::streamsize got = in.gcount();
      check(got > 0 || in.eof(), "--corpus: {}: read failed", name_);
      piece.append(block, size_t(got));
      if (got == 0) done_ = true;
      if (!done_) {  // keep the text after the last newline for the next piece
        size_t cut = piece.rfind('\n');
        if (cut == std::string::npos && piece.size() < (1u << 20)) {
          rest_ = std::move(piece);
          continue;
        }
        if (cut == std::string::npos) {  // a 1 MiB line: cut before its last UTF-8 character
          cut = piece.size() - 1;
          while (cut > 0 && (uint8_t(piece[cut]) & 0xc0) == 0x80) --cut;
          if (cut == 0) cut = piece.size();
          --cut;
        }
        rest_ = piece.substr(cut + 1);
        piece.resize(cut + 1);
      }
      bytes_ += piece.size();
      const auto ids = tok.encode(piece, /*add_special_tokens=*/false);
      buf.insert(buf.end(), ids.begin(), ids.end());
    }
    return !buf.empty();
  }
  uint64_t bytes() const { return bytes_; }

 private:
  std::string name_;
  std::ifstream file_;
  std::string rest_;
  bool done_ = false;
  uint64_t bytes_ = 0;
};

TraceHeader make_header(const TraceArgs& a, const Model& model) {
  TraceHeader h;
  h.model = trace_model_of(model);  // encodings included
  for (const std::string& c : a.corpus) h.corpus.push_back(c == "-" ? "stdin" : c);
  h.f32_weights = a.weights == "f32";
  h.settings = {{"tokens", a.tokens},      {"window", a.window},
                {"decode", a.decode},      {"decode_sampling", "greedy, eos not special"},
                {"corpus_split", "equal"}, {"tool", "moetier trace"}};
  return h;
}

void check_args(const TraceArgs& a) {
  check(a.tokens >= 1, "--tokens: {} must be at least 1", a.tokens);
  check(a.window >= 1, "--window: {} must be at least 1", a.window);
  check(a.decode >= 0, "--decode: {} must not be negative", a.decode);
  check(a.threads >= 0, "--threads: {} must not be negative", a.threads);
  check(a.weights == "f16" || a.weights == "f32", "--weights: '{}' (f16 or f32)", a.weights);
  check(!a.corpus.empty(), "--corpus: give at least one file");
  check(std::count(a.corpus.begin(), a.corpus.end(), "-") <= 1, "--corpus: '-' given twice");
  std::error_code ec;
  for (const std::string& c : a.corpus) {
    check(c == "-" || fs::is_regular_file(c, ec), "--corpus: {}: no such file", c);
  }
  check(!fs::is_directory(a.out, ec), "-o: {} is a directory", a.out);
  const fs::path parent = fs::absolute(a.out).parent_path();
  check(fs::is_directory(parent, ec), "-o: {}: directory {} does not exist", a.out,
        parent.string());
}

void trace(const TraceArgs& a) {
  check_args(a);
  if (a.threads > 0) cpu::set_threads(a.threads);
  auto ck = Checkpoint::open(a.dir);                      // "DIR: no such directory", ...
  const std::unique_ptr<Model> loaded = load_model(*ck);  // refuses unsupported architectures
  const Model& model = *loaded;
  const ContextLimit lim = context_limit(a.ctx, model.spec(), a.dir);
  // A window's positions: at most W + D, and at most one corpus's share of N.
  const int64_t share = (a.tokens + int64_t(a.corpus.size()) - 1) / int64_t(a.corpus.size());
  check(std::min(a.window + a.decode, share) <= lim.tokens,
        "--window {} + --decode {} = {} exceed the context of {} ({}); lower --window or "
        "--decode, or {}",
        a.window, a.decode, a.window + a.decode, lim.tokens, lim.source, lim.remedy);
  Tokenizer tok = Tokenizer::load(a.dir);
  check_tokenizer_fits(tok, model.spec().vocab_size, a.dir);
  MappedExperts experts(*ck, model.spec());
  TraceWriter writer(a.out, make_header(a, model));
  TraceRecorder rec(writer, model.spec());
  const int64_t F = int64_t(a.corpus.size());
  uint32_t seq = 0;
  Progress prog("trace", a.tokens);
  int64_t traced = 0;  // tokens over every corpus so far
  for (int64_t i = 0; i < F; ++i) {
    const int64_t quota = a.tokens / F + (i < a.tokens % F ? 1 : 0);
    CorpusStream text(a.corpus[size_t(i)]);
    std::vector<int32_t> buf;
    int64_t done = 0;
    while (done < quota) {
      const int64_t w = std::min(a.window, quota - done);
      if (!text.fill(tok, buf, size_t(w))) {
        check(done > 0, "--corpus: {}: no text to trace", a.corpus[size_t(i)]);
        break;
      }
      const std::vector<int32_t> prompt(buf.begin(),
                                        buf.begin() + std::min<int64_t>(w, buf.size()));
      buf.erase(buf.begin(), buf.begin() + int64_t(prompt.size()));
      const int64_t d = std::min(a.decode, quota - done - int64_t(prompt.size()));
      rec.run_window(model, experts, prompt, d, seq++, uint16_t(i));
      done += int64_t(prompt.size()) + d;
      prog.update(traced + done, "tokens");
    }
    traced += done;
    prog.note(fmt::format("moetier: trace: {}: {} tokens ({} of text read){}", a.corpus[size_t(i)],
                          done, format_bytes(text.bytes()),
                          done < quota ? ", the text ran out before its share" : ""));
  }
  prog.finish();
  check(writer.tokens() > 0, "--corpus: the corpus gave no tokens");
  writer.commit();
  const Trace t = read_trace(a.out);  // validates what was written
  write_file_atomic(a.out + ".json", trace_summary(t).dump(1) + "\n");
  write_file_atomic(a.out + ".ranking", ranking_text(t));
  std::fprintf(stderr, "moetier: trace: %zu tokens in %llu chunks -> %s (+ .json, .ranking)\n",
               t.size(), (unsigned long long)writer.chunks(), a.out.c_str());
}

const Registrar kRegister([](CLI::App& app) {
  auto* cmd = app.add_subcommand("trace", "Record which experts every token routes to");
  auto a = std::make_shared<TraceArgs>();
  cmd->add_option("dir", a->dir, "Checkpoint directory (config.json, weights, tokenizer.json)")
      ->required();
  cmd->add_option("--corpus", a->corpus, "Plain-text files ('-' = stdin); equal shares of N")
      ->required();
  cmd->add_option("--tokens", a->tokens, "Tokens to trace in total (prefill + decode)")->required();
  cmd->add_option("-o,--output", a->out, "Trace file (also writes TRACE.json, TRACE.ranking)")
      ->required();
  cmd->add_option("--window", a->window, "Prompt window: tokens per prefill chunk (default 256)");
  cmd->add_option("--decode", a->decode, "Greedy decode steps after each window (default 0)");
  add_ctx_option(*cmd, a->ctx);
  cmd->add_option("--weights", a->weights, "Routing weights stored as f16 (default) or f32");
  cmd->add_option("-t,--threads", a->threads,
                  "CPU threads (default: MOETIER_THREADS, else the CPUs it may use)");
  cmd->callback([a] { trace(*a); });
});

}  // namespace
}  // namespace moetier::tools
