#!/usr/bin/env python3
"""Summarize a decode timeline (MOETIER_CUDA_TRACE=FILE, docs/cuda.md).

Each CSV line is one launch (taken in order of its first release): its grid
size, the blocks recorded, the first / median / last block's entering and the
first / last block's leaving of grid_wait (ns).
The decode steps repeat one sequence of launches; this finds its period from
the grid sizes, starts it at the graph's first node (the lowest %gridid), and
prints per position the medians over the last steps of:
  link   next launch's first release - this launch's first release (its cost
         on the critical path, with the next one's wake-up)
  wait   this launch's first release - its first block's entry (how long its
         blocks sat resident before the predecessor completed)
  spread last release - first release (blocks that were not resident in time)
  late   last block's entry - first release (> 0: blocks that came on an SM
         only after the kernel could run)
  marks  id:us, the last block's time at each trace_mark after the first release
Usage: trace_summary.py FILE [STEPS]   (STEPS: the last steps to use, 64)
"""
import signal
import statistics
import sys

from trace_csv import read_rows


def period_of(blocks):
    tail = blocks[-3000:]
    for p in range(1, min(600, len(tail) // 3)):
        same = sum(tail[i] == tail[i + p] for i in range(len(tail) - p))
        if same >= 0.98 * (len(tail) - p):
            return p
    sys.exit("trace_summary: no repeating sequence of launches found")


def marks_of(cells):
    by_id = {}
    for c in cells:
        for m in (c or "").split():
            k, v = m.split(":")
            by_id.setdefault(int(k), []).append(float(v))
    return " ".join(f"{k}:{statistics.median(v):.2f}" for k, v in sorted(by_id.items()))


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    rows = read_rows(sys.argv[1], "trace_summary",
                     ("grid", "blocks", "rows", "enter_min", "enter_med", "enter_max", "leave_min",
                      "leave_max", "marks"), text=("marks",))
    rows.sort(key=lambda r: r["leave_min"])  # releases follow the chain; entries need not
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    if len(rows) < 100:
        sys.exit(f"trace_summary: {sys.argv[1]}: only {len(rows)} launches")
    blocks = [r["blocks"] for r in rows]
    p = period_of(blocks)
    n = len(rows) - 1  # the last launch has no next one
    first = max(0, n - p * (steps + 1))
    link = [rows[i + 1]["leave_min"] - rows[i]["leave_min"] for i in range(n)]
    # Align: position 0 is the step's first launch, the graph node captured
    # first (the lowest %gridid of the period: a graph's nodes count up).
    by_phase = [statistics.median(rows[i]["grid"] for i in range(first + ph, n, p))
                for ph in range(p)]
    start = first + min(range(p), key=lambda ph: by_phase[ph])
    # Whole steps only, and only those whose grid sizes match the last step's
    # (prefill and the steps before the graph was captured launch otherwise).
    starts = list(range(start, n - p + 1, p))
    ref = blocks[starts[-1]:starts[-1] + p]
    starts = [s0 for s0 in starts if blocks[s0:s0 + p] == ref][-steps:]
    nsteps = len(starts)
    if nsteps < 2:
        sys.exit(f"trace_summary: {sys.argv[1]}: fewer than two whole steps")
    print(f"period {p} launches, {nsteps} steps; medians in us")
    print(f"{'pos':>4} {'blocks':>7} {'link':>7} {'wait':>7} {'spread':>7} {'late':>7}  marks")
    total = 0.0
    for k in range(p):
        sel = [s0 + k for s0 in starts]
        med = lambda f: statistics.median(f(rows[i], i) for i in sel) / 1000.0
        lk = med(lambda r, i: link[i])
        total += lk
        print(f"{k:>4} {rows[sel[0]]['blocks']:>7} {lk:>7.2f}"
              f" {med(lambda r, i: r['leave_min'] - r['enter_min']):>7.2f}"
              f" {med(lambda r, i: r['leave_max'] - r['leave_min']):>7.2f}"
              f" {med(lambda r, i: r['enter_max'] - r['leave_min']):>7.2f} "
              + marks_of([rows[i]["marks"] for i in sel]))
    step = statistics.median(
        rows[b]["leave_min"] - rows[a]["leave_min"]
        for a, b in zip(starts, starts[1:]) if b == a + p) / 1000.0
    print(f"sum of links {total:.2f} us; step (release to release) {step:.2f} us")


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # | head: end quietly
    main()
