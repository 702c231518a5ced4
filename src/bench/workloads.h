// Benchmark workloads: the prompts `moetier bench` measures, after the two
// reference reports (shared/seeds): short code and prose prompts generating
// 512 tokens, an 8,172-token random prompt generating 256, and the chat_short /
// code_generation / chat_long_context (8,192-token prompt) trio. Decode always
// runs the full gen_tokens (end-of-sequence is ignored) with greedy choice, so
// runs of one workload do the same work.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace moetier {

class Tokenizer;

struct Workload {
  std::string name;
  std::string text;           // the prompt (empty: random token ids)
  int64_t prompt_tokens = 0;  // 0: the text's own length; else exactly this many
                              // (the text repeated, or random ids)
  int64_t gen_tokens = 0;
};

// "code, prose, random-8k, chat_short, code_generation, chat_long_context".
std::string workload_names();
// The named workload; throws Error naming the known ones.
Workload workload(std::string_view name);
// A random-token workload of the given sizes ("custom").
Workload custom_workload(int64_t prompt_tokens, int64_t gen_tokens);

// The prompt's token ids: the text encoded (repeated, cut to prompt_tokens
// when that is set), or prompt_tokens ids drawn uniformly from [0, vocab)
// with `seed` when the text is empty or there is no tokenizer.
std::vector<int32_t> prompt_ids(const Workload& w, const Tokenizer* tok, int64_t vocab,
                                uint32_t seed);

}  // namespace moetier
