#!/usr/bin/env python3
"""Per-block view of one decode step's timeline (MOETIER_CUDA_TRACE=FILE writes
FILE.rows: every block of one step; docs/cuda.md, "The decode timeline").

Each row of FILE.rows is one block's record: grid (%gridid, counting up in the
step's launch order), block, blocks (the grid's size), sm, mark, enter, leave
(ns). Mark 0 is the block's grid_wait: enter = when its thread 0 reached the
wait, leave = when it left (its release); start (where the trace build's
kernel recorded it, else empty) = when its thread 0 began the kernel. Marks
1.. are trace_mark points, their time in enter.

For the launches FROM .. TO (positions in the step, 0 = its first launch) this
prints, in us after the first release of launch REF, the quantiles (min, p10,
median, p90, max; interpolated between ranks) of each launch's start (where
recorded), wait entry, release and marks. With
--split S it prints them twice: over the blocks on SMs that ran a block of
launch S, and over the others (e.g. gate/up's blocks beside the router's).
With --after S:M it also prints, per launch, on each SM where launch S
recorded mark M (its last on that SM), how long after it the 1st, 2nd, ...
block of the launch on that SM reached its wait (quantiles over those SMs; a
block entering before the mark counts negative): e.g. --after 10:4 for
gate/up's blocks after the router's block on the same SM has ended.
Usage: trace_blocks.py FILE.rows --ref REF [--from A --to B] [--split S] [--after S:M]
"""
import argparse
import collections
import signal
import statistics
import sys

from trace_csv import read_rows


def quantiles(v):
    """min, p10, median, p90, max (interpolated, as statistics.median)."""
    if len(v) == 1:
        return v * 5
    q = statistics.quantiles(v, n=10, method="inclusive")
    return [min(v), q[0], statistics.median(v), q[8], max(v)]


def load(path):
    launches = collections.defaultdict(list)
    for r in read_rows(path, "trace_blocks", ("grid", "block", "blocks", "sm", "mark", "enter",
                                                "leave"), optional=("start",)):
        launches[r["grid"]].append(r)
    return [launches[g] for g in sorted(launches)]


def fmt(v):
    """v's quantiles, as each line prints them."""
    return " ".join(f"{x:7.2f}" for x in quantiles(v))


def release(launch):
    return min(r["leave"] for r in launch if r["mark"] == 0)


def series(rows, t0):
    """{name: [us after t0]} for the start (where recorded), the wait entry, the
    release and each mark, in that order."""
    out = collections.defaultdict(list)
    for r in rows:
        if r["mark"] == 0:
            if r.get("start") is not None:  # the kernel's start, where the trace build recorded it
                out["start"].append((r["start"] - t0) / 1000.0)
            out["entry"].append((r["enter"] - t0) / 1000.0)
            out["release"].append((r["leave"] - t0) / 1000.0)
        else:
            out[f"mark {r['mark']}"].append((r["enter"] - t0) / 1000.0)
    marks = sorted((k for k in out if k.startswith("mark ")), key=lambda k: int(k[5:]))
    return collections.OrderedDict((k, out[k]) for k in ["start", "entry", "release"] + marks
                                   if k in out)


def after_mark(rows, ends):
    """{rank: [us]}: on each SM of ends (sm -> ns), the k-th block of rows to
    reach its wait there (k = 1, 2, ...), its entry minus the SM's end."""
    entries = collections.defaultdict(list)
    for r in rows:
        if r["mark"] == 0 and r["sm"] in ends:
            entries[r["sm"]].append(r["enter"])
    out = collections.defaultdict(list)
    for sm, es in entries.items():
        for k, e in enumerate(sorted(es), 1):
            out[k].append((e - ends[sm]) / 1000.0)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("rows")
    ap.add_argument("--ref", type=int, required=True, help="launch whose first release is 0")
    ap.add_argument("--from", dest="first", type=int, help="first launch (default REF)")
    ap.add_argument("--to", type=int, help="last launch (default FROM + 3)")
    ap.add_argument("--split", type=int, help="split blocks by the SMs of this launch")
    ap.add_argument("--after", help="S:M: each block's wait entry after launch S's mark M on its SM")
    a = ap.parse_args()
    launches = load(a.rows)
    first = a.ref if a.first is None else a.first
    last = first + 3 if a.to is None else a.to
    for k in (a.ref, first, last) + ((a.split,) if a.split is not None else ()):
        if not 0 <= k < len(launches):
            sys.exit(f"trace_blocks: {a.rows}: launch {k} out of 0..{len(launches) - 1}")
    ends = None
    if a.after is not None:
        try:
            s_launch, s_mark = (int(x) for x in a.after.split(":"))
        except ValueError:
            sys.exit(f"trace_blocks: --after {a.after}: expected S:M (two integers)")
        if not 0 <= s_launch < len(launches):
            sys.exit(f"trace_blocks: {a.rows}: launch {s_launch} out of 0..{len(launches) - 1}")
        ends = {}  # sm -> the latest time of mark s_mark there (mark 0 is no mark)
        for r in launches[s_launch] if s_mark > 0 else ():
            if r["mark"] == s_mark:
                ends[r["sm"]] = max(ends.get(r["sm"], r["enter"]), r["enter"])
        if not ends:
            sys.exit(f"trace_blocks: {a.rows}: launch {s_launch} recorded no mark {s_mark}")
    t0 = release(launches[a.ref])
    split = {r["sm"] for r in launches[a.split]} if a.split is not None else None
    print(f"{len(launches)} launches; us after launch {a.ref}'s first release;"
          " min p10 median p90 max")
    for k in range(first, last + 1):
        rows = launches[k]
        groups = [("", rows)]
        if split is not None:
            groups = [(f" on launch {a.split}'s SMs", [r for r in rows if r["sm"] in split]),
                      (" elsewhere", [r for r in rows if r["sm"] not in split])]
        sms = len({r["sm"] for r in rows})
        print(f"launch {k}: {rows[0]['blocks']} blocks on {sms} SMs")
        for name, sel in groups:
            if not sel:
                print(f"  {name.strip() or 'all'}: no blocks")
                continue
            for what, v in series(sel, t0).items():  # (len(v): the blocks that recorded it)
                print(f"  {what:<8}{name} ({len(v)} blocks) {fmt(v)}")
        for rank, v in sorted(after_mark(rows, ends).items()) if ends is not None else ():
            print(f"  block {rank} on an SM, entry after launch {a.after}'s mark ({len(v)} SMs) {fmt(v)}")


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # | head: end quietly
    main()
