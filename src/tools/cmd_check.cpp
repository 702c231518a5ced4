// moetier check DIR: validates a checkpoint directory (and the tokenizer.json
// beside it, if any); every problem is one line on stderr and the exit status
// is 1, or "ok: ..." on stdout.
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "format/safetensors.h"
#include "format/tokenizer.h"
#include "model/architecture.h"
#include "model/check.h"
#include "tools/command.h"

namespace moetier::tools {
namespace {

// A tokenizer.json beside a valid checkpoint must load, and its ids must fit
// the model's vocabulary (what every command that loads both refuses).
void check_tokenizer(const Checkpoint& ck, std::vector<std::string>& problems) {
  std::error_code ec;
  if (!std::filesystem::exists(ck.dir() / "tokenizer.json", ec)) return;
  try {
    const Tokenizer tok = Tokenizer::load(ck.dir());
    if (auto p = tokenizer_vocab_problem(tok, model_spec(ck).vocab_size, ck.dir()))
      problems.push_back(*p);
  } catch (const std::exception& e) {
    problems.push_back(e.what());
  }
}

void run_check(const std::string& dir) {
  std::vector<std::string> problems;
  std::unique_ptr<Checkpoint> ck;
  try {
    problems = check_checkpoint(dir);
    if (problems.empty()) ck = Checkpoint::open(dir);
    if (ck) check_tokenizer(*ck, problems);
  } catch (const std::exception& e) {  // check_checkpoint should not throw; never crash if it does
    problems.push_back(e.what());
  }
  if (!problems.empty()) {
    for (const auto& p : problems) std::fprintf(stderr, "%s\n", p.c_str());
    fail("{}: {} problem{} found", dir, problems.size(), problems.size() == 1 ? "" : "s");
  }
  uint64_t bytes = 0;
  for (const auto& t : ck->tensors()) bytes += t.nbytes();
  std::printf("ok: %s (%zu tensors in %zu shards, %llu bytes)\n", dir.c_str(), ck->tensors().size(),
              ck->shards().size(), static_cast<unsigned long long>(bytes));
}

const Registrar kRegister([](CLI::App& app) {
  auto* cmd = app.add_subcommand("check", "Validate a checkpoint directory (config and shards)");
  auto dir = std::make_shared<std::string>();
  cmd->add_option("dir", *dir, "Checkpoint directory")->required();
  cmd->callback([dir] { run_check(*dir); });
});

}  // namespace
}  // namespace moetier::tools
