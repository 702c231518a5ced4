#include "bench/workloads.h"

#include <fmt/format.h>

#include <random>

#include "core/error.h"
#include "format/tokenizer.h"

namespace moetier {
namespace {

constexpr std::string_view kCode = R"(package main

import (
	"fmt"
	"net/http"
	"sync"
)

// Cache is a concurrency-safe map with a fixed capacity.
type Cache struct {
	mu    sync.Mutex
	items map[string]string
	order []string
	limit int
}

func (c *Cache) Get(key string) (string, bool) {
)";

constexpr std::string_view kProse =
    "The river had been rising for three days when the ferryman finally agreed to take "
    "the last passengers across. He was an old man who had worked the crossing since "
    "before the bridge was built upstream, and he knew the water better than anyone in "
    "the valley. That evening the current was fast and brown, carrying branches and "
    "whole trees from the hills. The travellers stood on the bank with their bags and "
    "watched him check the ropes one by one. Nobody spoke. When he was satisfied he "
    "waved them aboard, and";

constexpr std::string_view kChatShort =
    "User: What are three practical ways to reduce the memory a large language model "
    "needs at inference time? Answer briefly.\nAssistant:";

constexpr std::string_view kCodeGeneration =
    "User: Write a Python function that parses a CSV file of orders (columns: id, "
    "customer, amount, date), groups the orders by customer, and returns the five "
    "customers with the largest total amount, with tests.\nAssistant:";

constexpr std::string_view kLongContext =
    "User: Below is a long report. Read it and summarize its main points.\n\n"
    "Report: Mixture-of-Experts models route every token through a few of many small "
    "feed-forward experts. Most experts are idle at any moment, so an engine can keep "
    "the hot ones in fast memory and read the others from host memory or storage on "
    "demand. The cost of a miss depends on the tier: device memory is about ninety "
    "times faster than the PCIe link, which is itself many times faster than a disk. ";

}  // namespace

std::string workload_names() {
  return "code, prose, random-8k, chat_short, code_generation, chat_long_context";
}

Workload workload(std::string_view name) {
  if (name == "code") return {"code", std::string(kCode), 0, 512};
  if (name == "prose") return {"prose", std::string(kProse), 0, 512};
  if (name == "random-8k") return {"random-8k", "", 8172, 256};
  if (name == "chat_short") return {"chat_short", std::string(kChatShort), 0, 256};
  if (name == "code_generation") return {"code_generation", std::string(kCodeGeneration), 0, 512};
  if (name == "chat_long_context")
    return {"chat_long_context", std::string(kLongContext), 8192, 256};
  throw Error(fmt::format("--workload: unknown workload '{}' (known: {})", name, workload_names()));
}

Workload custom_workload(int64_t prompt_tokens, int64_t gen_tokens) {
  check(prompt_tokens > 0, "--prompt-tokens: {} must be positive", prompt_tokens);
  check(gen_tokens > 0, "--gen: {} must be positive", gen_tokens);
  return {fmt::format("custom-{}+{}", prompt_tokens, gen_tokens), "", prompt_tokens, gen_tokens};
}

std::vector<int32_t> prompt_ids(const Workload& w, const Tokenizer* tok, int64_t vocab,
                                uint32_t seed) {
  std::vector<int32_t> ids;
  if (!w.text.empty() && tok) {
    const std::vector<int32_t> once = tok->encode(w.text);
    check(!once.empty(), "workload {}: the prompt encodes to no tokens", w.name);
    ids = once;
    while (w.prompt_tokens > 0 && int64_t(ids.size()) < w.prompt_tokens)
      ids.insert(ids.end(), once.begin(), once.end());
    if (w.prompt_tokens > 0) ids.resize(size_t(w.prompt_tokens));
    return ids;
  }
  const int64_t n = w.prompt_tokens > 0 ? w.prompt_tokens : 64;
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, int32_t(vocab - 1));
  ids.resize(size_t(n));
  for (auto& t : ids) t = d(rng);
  return ids;
}

}  // namespace moetier
