// pdl_probe.cu: the start of a PDL-launched kernel minus the end of the one
// before it, in a stream and in a graph (negative: the two overlapped).
#pragma once

namespace moetier::bench {

struct PdlProbe {
  double stream_gap_us = 0.0, graph_gap_us = 0.0;
  bool ok = false;
};
PdlProbe pdl_probe();

}  // namespace moetier::bench
