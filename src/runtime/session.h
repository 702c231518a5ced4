// The session API: one Engine opens a checkpoint, loads its model on a
// backend and builds the expert provider from the budget flags; Sessions step
// sequences over it (prefill a chunk, decode a token). Several sessions share
// one model and one expert provider. generate(), eval, trace and the
// benchmark are loops over a Session.
//
// Decode steps of a model whose experts are all resident on a backend with
// decode graphs (CUDA) are recorded once and replayed (MOETIER_GRAPHS=0 turns
// that off); the logits are the same as a plain forward's. Greedy runs
// (decode_greedy_run) launch each replay before the host has read the token
// of the one before; they finish (nothing in flight) before they return.
//
// Protocol: an Engine and its sessions are driven from one thread (the
// provider and the backend are single-caller, see experts/provider.h and
// backend/backend.h); sessions may interleave freely on that thread. They
// share resident experts: a step pins the experts it computes with (reference
// counts, released before the step returns), so one session's step never
// evicts what another holds. The arena's memory comes from the engine's
// backend (device slots when it is not the host). A Session must not outlive
// its Engine.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "experts/options.h"
#include "experts/provider.h"
#include "experts/stats.h"
#include "runtime/model.h"

namespace moetier {

class Checkpoint;

class Session {
 public:
  Session(const Model& model, ExpertProvider& experts, int64_t capacity);
  ~Session();

  // Runs tokens at the current position and advances it. Returns the logits
  // of the last token [vocab], or of every token [n, vocab] with all_logits.
  // Throws Error (position unchanged) when the chunk would pass capacity().
  const std::vector<float>& prefill(std::span<const int32_t> tokens,
                                    const ForwardOptions& opt = {});
  const std::vector<float>& decode(int32_t token, const ForwardOptions& opt = {});
  // decode, returning the greedy next token (argmax, lowest id on ties). On a
  // device with decode graphs the argmax runs on the device and only the token
  // comes back (logits() is then empty); otherwise argmax of the logits.
  int32_t decode_greedy(int32_t token, const ForwardOptions& opt = {});
  // Greedy decoding of up to n steps from token, each step fed the token the
  // one before produced; on_token gets each produced token and returns false
  // to stop there. Returns the steps taken (the position advances by as
  // many). Where steps replay a decode graph and the provider needs no host
  // work between them (ExpertProvider::device_steps_need_host), step t + 1 is
  // launched before step t's token is read (it reads that token on the
  // device: Backend::graph_launch_next), so the device does not wait for the
  // host between steps; a step launched past a stop is discarded and its
  // position taken back. MOETIER_DECODE_AHEAD=0: one step at a time.
  int64_t decode_greedy_run(int32_t token, int64_t n, const std::function<bool(int32_t)>& on_token,
                            const ForwardOptions& opt = {});
  // Moves the position back (later positions are recomputed by the next step).
  void rewind(int64_t position);

  int64_t position() const { return pos_; }
  int64_t capacity() const { return state_->capacity(); }
  const std::vector<float>& logits() const { return logits_; }
  const Model& model() const { return *model_; }

 private:
  bool graphable(const ForwardOptions& opt) const;
  // Whether a forward of n tokens runs its MoE layers on the provider's device
  // tables (the forward's own test: one token, no observer, a table for every
  // MoE layer); such a step is wrapped in before/after_device_step().
  bool on_device_tables(size_t n, const ForwardOptions& opt) const;
  std::vector<float> run_forward(std::span<const int32_t> tokens, const ForwardOptions& opt);
  // false: not replayed, run the plain forward. Copies the logits to the host
  // when `logits`; the argmax of the step is always on the device.
  bool decode_graph(int32_t token, bool logits);
  void drop_graph();
  bool can_decode_ahead(const ForwardOptions& opt) const;
  // decode_greedy_run's steps in flight: launch_ahead(token) the step for a
  // host token, launch_ahead() the step for the token the newest one makes;
  // take_ahead() waits for the oldest and returns its token.
  void launch_ahead(const int32_t* token);
  int32_t take_ahead();

  const Model* model_;
  ExpertProvider* experts_;
  std::unique_ptr<SequenceState> state_;
  int64_t pos_ = 0;
  std::vector<float> logits_;
  // Decode graphs (Backend::graph_*): recorded on the second decode step of a
  // resident model, replayed after; dropped when another forward runs.
  int graph_ = -1;
  int64_t plain_decodes_ = 0;
  bool graphs_off_ = false;
  DeviceBuffer device_logits_;  // [vocab]
  DeviceBuffer device_argmax_;  // [1] int32: the replayed step's argmax
  int64_t ahead_ = 0;           // steps launched by decode_greedy_run, not yet taken
};

struct EngineOptions {
  std::string backend = "cpu";  // --backend cpu | cuda[:N]
  ExpertOptions experts;        // --arena, --mapped, ... (experts/options.h)
  // Called as open() goes through its stages (optional; a progress bar):
  // (0, 3, "backend"), (1, 3, "core weights"), (2, 3, "experts"), (3, 3, "ready").
  std::function<void(int64_t done, int64_t total, const char* stage)> on_load;
};

class Engine {
 public:
  // Opens DIR (refusing what `moetier check` refuses about the architecture),
  // loads the model and builds the provider. Lines describing the choices
  // (expert sizing, reader) are appended to `log` unless experts.quiet.
  static std::unique_ptr<Engine> open(const std::filesystem::path& dir, const EngineOptions& opt,
                                      std::vector<std::string>* log = nullptr);
  // The same on a checkpoint already opened.
  static std::unique_ptr<Engine> open(std::unique_ptr<Checkpoint> ck, const EngineOptions& opt,
                                      std::vector<std::string>* log = nullptr);
  ~Engine();

  std::unique_ptr<Session> new_session(int64_t capacity) const;

  const Checkpoint& checkpoint() const { return *ck_; }
  const Model& model() const { return *model_; }
  const ModelSpec& spec() const { return model_->spec(); }
  ExpertProvider& experts() const { return *experts_; }
  ExpertStats& stats() { return stats_; }
  Backend& backend() const { return *backend_; }
  bool mapped() const { return mapped_; }

 private:
  Engine() = default;
  std::unique_ptr<Checkpoint> ck_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  ExpertStats stats_;
  std::unique_ptr<ExpertProvider> experts_;
  bool mapped_ = false;
};

}  // namespace moetier
