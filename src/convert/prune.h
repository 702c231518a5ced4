// moetier prune: a new checkpoint with only the K most-used experts of every
// MoE layer (docs/prune-repack.md).
//
// The output has num_experts = K (the config field in the source's own form),
// router rows of the kept experts only (the router [K, H]), the kept
// experts renumbered 0..K-1 in ascending original id, in their own encoding,
// byte for byte; every other tensor is copied byte for byte. config.json gains
// "moetier": {"pruned_from": N, "kept_experts": [[original ids per layer]]}
// (composed through an earlier prune, so the ids are always those of the
// unpruned model). The router's softmax then runs over the K kept experts:
// with norm_topk_prob the top-k weights equal the original ones renormalized
// over the kept experts; without it they grow slightly (the softmax lost the
// mass of the removed experts).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "convert/output.h"
#include "model/spec.h"

namespace moetier {

class Checkpoint;

struct PruneReport {
  std::string usage_source;  // file the use counts came from ("" if given explicitly)
  int64_t from = 0, keep = 0;
  std::vector<std::vector<int32_t>> kept;  // [layer] source expert ids, ascending
  std::vector<double>
      coverage;  // [layer] share of traced uses that fall on kept experts (-1: dense)
  uint64_t expert_bytes_before = 0, expert_bytes_after = 0;  // tensors under mlp.experts.
  uint64_t router_bytes_before = 0, router_bytes_after = 0;
};

// --keep as given: a count ("26") or a share of num_experts ("40%", rounded
// up: 40% of 64 is 26). Throws Error "--keep: ..." for anything else; the
// range is check_keep's business.
int64_t parse_keep(std::string_view text, int64_t num_experts);

// Throws Error unless num_experts_per_tok <= keep <= num_experts.
void check_keep(const ModelSpec& cfg, int64_t keep, const std::filesystem::path& config_file);

// Prunes DIR to the `keep` most-used experts per layer (parse_keep: "26" or
// "40%"), by the counts of `trace` (convert/usage.h), into OUT (which must
// not exist).
PruneReport prune_checkpoint(const std::filesystem::path& dir, const std::filesystem::path& trace,
                             std::string_view keep, const std::filesystem::path& out,
                             ConvertControl control = {});

// Same with the kept experts given: kept[layer] = ascending source ids (the
// same count for every MoE layer; empty for dense layers).
PruneReport prune_checkpoint(const Checkpoint& ck, const std::vector<std::vector<int32_t>>& kept,
                             const std::filesystem::path& out, ConvertControl control = {});

}  // namespace moetier
