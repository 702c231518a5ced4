#include "runtime/session.h"

#include <fmt/format.h>

#include <cstdlib>
#include <string>

#include "core/error.h"
#include "format/safetensors.h"
#include "model/architecture.h"
#include "runtime/mapped_experts.h"
#include "runtime/resident_experts.h"
#include "runtime/sampler.h"

namespace moetier {

Session::Session(const Model& model, ExpertProvider& experts, int64_t capacity)
    : model_(&model), experts_(&experts), state_(model.new_state(capacity)) {
  const char* g = std::getenv("MOETIER_GRAPHS");
  graphs_off_ = g && std::string(g) == "0";
}

Session::~Session() { drop_graph(); }

void Session::drop_graph() {
  if (graph_ >= 0) model_->backend().graph_drop(graph_);
  graph_ = -1;
}

// A graph records a one-token step on the device tables.
bool Session::graphable(const ForwardOptions& opt) const {
  return !graphs_off_ && model_->backend().supports_graphs() && !opt.all_logits &&
         !opt.device_logits && on_device_tables(1, opt);
}

bool Session::on_device_tables(size_t n, const ForwardOptions& opt) const {
  if (n != 1 || (opt.observer && *opt.observer)) return false;
  for (int64_t l : model_->spec().moe_layers())
    if (experts_->device_table(l) < 0) return false;
  return true;
}

std::vector<float> Session::run_forward(std::span<const int32_t> tokens,
                                        const ForwardOptions& opt) {
  const bool dev = on_device_tables(tokens.size(), opt);
  if (dev) experts_->before_device_step();
  std::vector<float> logits = model_->forward(tokens, pos_, *state_, *experts_, opt);
  if (dev) experts_->after_device_step();
  return logits;
}

// Records the step the first time (after one plain decode step has sized
// every buffer), then replays it; a recording that fails turns graphs off.
bool Session::decode_graph(int32_t token, bool logits) {
  Backend& be = model_->backend();
  const int64_t vocab = model_->spec().vocab_size;
  if (graph_ < 0) {
    if (plain_decodes_ == 0) return false;
    if (!device_logits_.data()) device_logits_ = be.alloc(size_t(vocab) * sizeof(float));
    if (!device_argmax_.data()) device_argmax_ = be.alloc(sizeof(int32_t));
    ForwardOptions fo;
    fo.device_logits = device_logits_.as<float>();
    const int32_t one[1] = {token};
    const int64_t size = state_->size();
    try {
      be.graph_begin(pos_, state_->capacity());
      model_->forward(one, pos_, *state_, *experts_, fo);
      be.argmax_advance(device_logits_.as<float>(), vocab, device_argmax_.as<int32_t>());
      graph_ = be.graph_end();
    } catch (const Error&) {
      be.graph_abort();
      state_->set_size(size);
      graphs_off_ = true;
      return false;
    }
  }
  experts_->before_device_step();
  be.graph_launch(graph_, pos_, token);
  experts_->after_device_step();
  state_->set_size(pos_ + 1);
  if (logits) {
    logits_.resize(size_t(vocab));
    be.to_host(logits_.data(), device_logits_.data(), size_t(vocab) * sizeof(float));
  } else {
    logits_.clear();
  }
  ++pos_;
  return true;
}

const std::vector<float>& Session::prefill(std::span<const int32_t> tokens,
                                           const ForwardOptions& opt) {
  check(!tokens.empty(), "session: prefill of no tokens");
  check(pos_ + int64_t(tokens.size()) <= state_->capacity(),
        "session: {} positions + {} tokens exceed the session's capacity {}", pos_, tokens.size(),
        state_->capacity());
  drop_graph();  // a longer chunk may have grown the buffers a recorded graph uses
  logits_ = run_forward(tokens, opt);
  pos_ += int64_t(tokens.size());
  return logits_;
}

const std::vector<float>& Session::decode(int32_t token, const ForwardOptions& opt) {
  if (graphable(opt)) {
    check(pos_ + 1 <= state_->capacity(),
          "session: {} positions + 1 token exceed the session's "
          "capacity {}",
          pos_, state_->capacity());
    if (decode_graph(token, true)) return logits_;
    ++plain_decodes_;
    const int32_t one[1] = {token};
    logits_ = run_forward(one, opt);
    ++pos_;
    return logits_;
  }
  const int32_t one[1] = {token};
  return prefill(one, opt);
}

int32_t Session::decode_greedy(int32_t token, const ForwardOptions& opt) {
  if (graph_ >= 0 && graphable(opt)) {
    check(pos_ + 1 <= state_->capacity(),
          "session: {} positions + 1 token exceed the session's capacity {}", pos_,
          state_->capacity());
    if (decode_graph(token, false)) {
      int32_t next = 0;
      model_->backend().to_host(&next, device_argmax_.data(), sizeof next);
      return next;
    }
  }
  return argmax(decode(token, opt));
}

bool Session::can_decode_ahead(const ForwardOptions& opt) const {
  const char* v = std::getenv("MOETIER_DECODE_AHEAD");  // read at each run: an A/B switch
  check(!v || std::string(v) == "0" || std::string(v) == "1",
        "MOETIER_DECODE_AHEAD={}: expected 0 or 1", v ? v : "");
  return !(v && std::string(v) == "0") && graph_ >= 0 && graphable(opt) &&
         !experts_->device_steps_need_host();
}

void Session::launch_ahead(const int32_t* token) {
  check(pos_ + 1 <= state_->capacity(),
        "session: {} positions + 1 token exceed the session's capacity {}", pos_,
        state_->capacity());
  Backend& be = model_->backend();
  if (token)
    be.graph_launch(graph_, pos_, *token);
  else
    be.graph_launch_next(graph_, pos_);
  state_->set_size(pos_ + 1);
  ++pos_, ++ahead_;
}

int32_t Session::take_ahead() {
  const int32_t t = model_->backend().graph_token(pos_ - ahead_);
  --ahead_;
  return t;
}

int64_t Session::decode_greedy_run(int32_t token, int64_t n,
                                   const std::function<bool(int32_t)>& on_token,
                                   const ForwardOptions& opt) {
  int64_t done = 0;
  while (done < n) {
    if (!can_decode_ahead(opt)) {  // one step at a time (and the step that records the graph)
      token = decode_greedy(token, opt);
      ++done;
      if (!on_token(token)) break;
      continue;
    }
    logits_.clear();
    auto settle = [&] {  // steps launched past the stop: their positions are taken back
      if (ahead_ == 0) return;
      model_->backend().synchronize();
      pos_ -= ahead_, ahead_ = 0;
      state_->set_size(pos_);
    };
    bool go = true;
    try {
      launch_ahead(&token);
      while (go && ahead_ > 0) {  // one step in flight behind the one whose token is read next
        if (done + ahead_ < n && pos_ < state_->capacity()) launch_ahead(nullptr);
        token = take_ahead();
        ++done;
        go = on_token(token) && done < n;
      }
    } catch (...) {
      settle();
      throw;
    }
    settle();
    if (!go) break;
  }
  return done;
}

void Session::rewind(int64_t position) {
  check(position >= 0 && position <= pos_, "session: rewind to {} outside [0, {}]", position, pos_);
  pos_ = position;
}

Engine::~Engine() = default;

std::unique_ptr<Engine> Engine::open(const std::filesystem::path& dir, const EngineOptions& opt,
                                     std::vector<std::string>* log) {
  return open(Checkpoint::open(dir), opt, log);
}

std::unique_ptr<Engine> Engine::open(std::unique_ptr<Checkpoint> ck, const EngineOptions& opt,
                                     std::vector<std::string>* log) {
  std::unique_ptr<Engine> e(new Engine());
  e->ck_ = std::move(ck);
  const ModelSpec spec = model_spec(*e->ck_);  // refuses an unsupported architecture first
  auto stage = [&opt](int64_t done, const char* what) {
    if (opt.on_load) opt.on_load(done, 3, what);
  };
  stage(0, "backend");
  e->backend_ = make_backend(opt.backend);
  stage(1, "core weights");
  e->model_ = load_model(*e->ck_, *e->backend_);
  stage(2, "experts");
  e->mapped_ = opt.experts.mapped;
  const bool arena_flags = !opt.experts.arena.empty() || opt.experts.arena_experts >= 0 ||
                           !opt.experts.host_cache.empty();
  if (!e->backend_->is_host() && (e->mapped_ || !arena_flags)) {
    // Every expert in device memory (the arena on a device comes with its flags).
    e->mapped_ = true;
    e->experts_ = std::make_unique<ResidentExperts>(*e->ck_, spec, *e->backend_);
    if (log && !opt.experts.quiet)
      log->push_back(fmt::format("experts: all {} resident on {}",
                                 spec.moe_layers().size() * size_t(spec.num_experts),
                                 e->backend_->name()));
    stage(3, "ready");
    return e;
  }
  if (e->mapped_) {
    e->experts_ = std::make_unique<MappedExperts>(*e->ck_, spec);
    stage(3, "ready");
    return e;
  }
  ExpertOptions eo = opt.experts;
  std::string summary;
  auto p = make_expert_provider(*e->ck_, spec, eo, &e->stats_, &summary, e->backend_.get());
  if (log && !eo.quiet) log->push_back(summary);
  e->experts_ = std::move(p);
  stage(3, "ready");
  return e;
}

std::unique_ptr<Session> Engine::new_session(int64_t capacity) const {
  return std::make_unique<Session>(*model_, *experts_, capacity);
}

}  // namespace moetier
