#include "runtime/moe_block.h"

#include <algorithm>
#include <vector>

#include "core/error.h"

namespace moetier {
namespace {

void check_expert(const ExpertView& v, int64_t layer, int32_t id, int64_t h, int64_t in) {
  check(v.gate.rows == in && v.gate.cols == h && v.up.rows == in && v.up.cols == h &&
            v.down.rows == h && v.down.cols == in,
        "layer {} expert {}: provider returned shapes gate [{}, {}] up [{}, {}] down [{}, {}], "
        "expected [{}, {}], [{}, {}], [{}, {}]",
        layer, id, v.gate.rows, v.gate.cols, v.up.rows, v.up.cols, v.down.rows, v.down.cols, in, h,
        in, h, h, in);
}

}  // namespace

void run_moe_block(Backend& be, ExpertProvider& experts, const MoeBlock& b) {
  const Routing& r = *b.routing;
  const ExpertGroups g = group_by_expert(r);
  be.fill_zero(b.out, r.n_tokens * b.hidden);
  const int64_t batch = experts.max_batch();
  check(batch >= 1, "layer {}: expert provider max_batch() is {}", b.layer, batch);
  std::vector<ExpertView> views;
  std::vector<int64_t> offsets;
  std::vector<float> weights(g.tokens.size());  // [pairs] routing weight of each pair
  for (size_t p = 0; p < g.tokens.size(); ++p)
    weights[p] = r.weights[size_t(g.tokens[p] * r.k + g.slots[p])];
  for (size_t b0 = 0; b0 < g.ids.size(); b0 += size_t(batch)) {
    const size_t cnt = std::min(g.ids.size() - b0, size_t(batch));
    std::span<const int32_t> ids(g.ids.data() + b0, cnt);
    experts.acquire(b.layer, ids, b.phase, views);
    check(views.size() == cnt, "layer {}: expert provider returned {} views for {} experts",
          b.layer, views.size(), cnt);
    for (size_t i = 0; i < cnt; ++i)
      check_expert(views[i], b.layer, ids[i], b.hidden, b.intermediate);
    const int64_t p0 = g.offsets[b0];
    offsets.assign(g.offsets.begin() + int64_t(b0), g.offsets.begin() + int64_t(b0 + cnt + 1));
    for (int64_t& o : offsets) o -= p0;
    ExpertBatch eb;
    eb.experts = views;
    eb.offsets = offsets;
    eb.tokens = std::span<const int64_t>(g.tokens).subspan(size_t(p0), size_t(offsets.back()));
    eb.weights = std::span<const float>(weights).subspan(size_t(p0), size_t(offsets.back()));
    eb.x = b.x;
    eb.n = r.n_tokens;
    eb.hidden = b.hidden;
    eb.intermediate = b.intermediate;
    eb.out = b.out;
    be.expert_batch(eb);
  }
  experts.note_routing(b.layer, r.experts, r.k);  // accounting (all-k-hit share)
}

}  // namespace moetier
