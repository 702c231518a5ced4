#include "runtime/session.h"

#include "core/error.h"
#include "format/safetensors.h"
#include "model/architecture.h"
#include "runtime/mapped_experts.h"

namespace moetier {

Session::Session(const Model& model, ExpertProvider& experts, int64_t capacity)
    : model_(&model), experts_(&experts), state_(model.new_state(capacity)) {}

const std::vector<float>& Session::prefill(std::span<const int32_t> tokens,
                                           const ForwardOptions& opt) {
  check(!tokens.empty(), "session: prefill of no tokens");
  check(pos_ + int64_t(tokens.size()) <= state_->capacity(),
        "session: {} positions + {} tokens exceed the session's capacity {}", pos_, tokens.size(),
        state_->capacity());
  logits_ = model_->forward(tokens, pos_, *state_, *experts_, opt);
  pos_ += int64_t(tokens.size());
  return logits_;
}

const std::vector<float>& Session::decode(int32_t token, const ForwardOptions& opt) {
  const int32_t one[1] = {token};
  return prefill(one, opt);
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
  e->backend_ = make_backend(opt.backend);
  e->model_ = load_model(*e->ck_, *e->backend_);
  e->mapped_ = opt.experts.mapped;
  if (e->mapped_) {
    check(e->backend_->is_host(), "--mapped: only with --backend cpu (experts stay in the mmap)");
    e->experts_ = std::make_unique<MappedExperts>(*e->ck_, spec);
    return e;
  }
  ExpertOptions eo = opt.experts;
  std::string summary;
  auto p = make_expert_provider(*e->ck_, spec, eo, &e->stats_, &summary, e->backend_.get());
  if (log && !eo.quiet) log->push_back(summary);
  e->experts_ = std::move(p);
  return e;
}

std::unique_ptr<Session> Engine::new_session(int64_t capacity) const {
  return std::make_unique<Session>(*model_, *experts_, capacity);
}

}  // namespace moetier
