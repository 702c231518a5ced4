#include "runtime/generate.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"

namespace moetier {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Greedy: tok (the prefill's) and the tokens after it, the argmax on the
// device and steps launched ahead where they can be (decode_greedy_run).
void greedy_after(Session& session, int32_t tok, const GenerateOptions& opt,
                  const ForwardOptions& fo, const std::function<void(int32_t)>& on_token,
                  GenerateStats& st) {
  auto take = [&](int32_t t) {  // false at an eos (not emitted)
    if (std::find(opt.eos.begin(), opt.eos.end(), t) != opt.eos.end()) {
      st.stopped_at_eos = true;
      return false;
    }
    st.tokens.push_back(t);
    ++st.generated_tokens;
    if (on_token) on_token(t);
    return true;
  };
  if (!take(tok)) return;
  session.decode_greedy_run(
      tok, opt.max_new_tokens - 1,
      [&](int32_t t) {
        ++st.decode_steps;
        return take(t);
      },
      fo);
}

}  // namespace

GenerateStats generate(Session& session, std::span<const int32_t> prompt,
                       const GenerateOptions& opt, const std::function<void(int32_t)>& on_token) {
  check(!prompt.empty(), "generate: the prompt has no tokens");
  check(opt.max_new_tokens >= 0, "generate: max_new_tokens {} < 0", opt.max_new_tokens);
  GenerateStats st;
  st.prompt_tokens = int64_t(prompt.size());
  if (opt.max_new_tokens == 0) return st;
  Sampler sampler(opt.sampling);
  ForwardOptions fo;
  fo.observer = opt.observer;

  auto t0 = std::chrono::steady_clock::now();
  const std::vector<float>* logits = &session.prefill(prompt, fo);
  st.prefill_seconds = seconds_since(t0);

  t0 = std::chrono::steady_clock::now();
  int32_t tok = sampler.sample(*logits);
  if (sampler.greedy()) {
    greedy_after(session, tok, opt, fo, on_token, st);
    st.decode_seconds = seconds_since(t0);
    return st;
  }
  for (;;) {
    if (std::find(opt.eos.begin(), opt.eos.end(), tok) != opt.eos.end()) {
      st.stopped_at_eos = true;
      break;
    }
    st.tokens.push_back(tok);
    ++st.generated_tokens;
    if (on_token) on_token(tok);
    if (st.generated_tokens == opt.max_new_tokens) break;
    logits = &session.decode(tok, fo);
    tok = sampler.sample(*logits);
    ++st.decode_steps;
  }
  st.decode_seconds = seconds_since(t0);
  return st;
}

GenerateStats generate(const Model& model, ExpertProvider& experts, std::span<const int32_t> prompt,
                       const GenerateOptions& opt, const std::function<void(int32_t)>& on_token) {
  Session s(model, experts, std::max<int64_t>(1, int64_t(prompt.size()) + opt.max_new_tokens));
  return generate(s, prompt, opt, on_token);
}

}  // namespace moetier
