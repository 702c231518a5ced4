#!/usr/bin/env python3
"""scripts/trace_summary.py on a made-up timeline whose answers are known.

A decode step of 6 layers of 7 launches plus 3 (as the DeepSeek-shaped model's),
each launch released a fixed time after the one before it, some launches'
blocks entering before their predecessor's (as with programmatic dependent
launch), preceded by prefill launches of another sequence; marks on one
launch. The summary must find the period, start each step at its first
launch, and give each position's link, wait and marks.
"""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "scripts", "trace_summary.py")

LAYER = [(320, 4700), (8, 8900), (1024, 3100), (128, 6500), (1, 7000), (384, 13800), (1024, 11300)]
TAIL = [(1, 2100), (2048, 19000), (2, 11500)]
STEP = LAYER * 6 + TAIL


def made_up(path):
    lines = ["grid,blocks,rows,enter_min,enter_med,enter_max,leave_min,leave_max,marks"]
    t = 1_000_000
    for g in range(30):  # prefill and the steps before the graph: another sequence
        lines.append(f"{1000 + g},64,64,{t},{t},{t + 100},{t + 500},{t + 900},")
        t += 3000
    for step in range(120):
        for pos, (blocks, link) in enumerate(STEP):
            enter = t - 2000 if blocks == 1024 else t - 700  # o and down: resident early
            marks = " 1:2.30 2:5.38" if blocks == 8 else ""
            lines.append(f"{pos + 1},{blocks},{blocks},{enter},{enter},{t - 100},{t},{t + 30},{marks}")
            t += link
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.csv")
        made_up(path)
        out = subprocess.run([sys.executable, SCRIPT, path, "96"], capture_output=True, text=True,
                             check=True).stdout.splitlines()
    assert out[0].startswith(f"period {len(STEP)} launches, 96 steps"), out[0]
    rows = [ln.split() for ln in out[2:2 + len(STEP)]]
    for (blocks, link), r in zip(STEP, rows):
        assert int(r[1]) == blocks, (r, blocks)  # position 0 is the step's first launch
        assert abs(float(r[2]) - link / 1000) < 0.006, (r, link)
        assert abs(float(r[3]) - (2.0 if blocks == 1024 else 0.7)) < 0.006, r
        assert (r[6:] == ["1:2.30", "2:5.38"]) == (blocks == 8), r
    total = sum(link for _, link in STEP) / 1000
    assert f"sum of links {total:.2f} us" in out[-1], out[-1]
    # Too short a file is an error with a message, not a traceback.
    with tempfile.NamedTemporaryFile("w", suffix=".csv") as f:
        f.write("grid,blocks,rows,enter_min,enter_med,enter_max,leave_min,leave_max,marks\n")
        f.flush()
        r = subprocess.run([sys.executable, SCRIPT, f.name], capture_output=True, text=True)
        assert r.returncode != 0 and "only 0 launches" in r.stderr, r
    # So is a cell that is not an integer, or a missing column (scripts/trace_csv.py).
    for text, err in (("grid,blocks,rows,enter_min,enter_med,enter_max,leave_min,leave_max,marks\n"
                       "1,8,8,0,1,2,x,4,\n", "line 2: column 'leave_min' is 'x', not an integer"),
                      ("grid,blocks\n1,8\n", "no column 'rows' in its header")):
        with tempfile.NamedTemporaryFile("w", suffix=".csv") as f:
            f.write(text)
            f.flush()
            r = subprocess.run([sys.executable, SCRIPT, f.name], capture_output=True, text=True)
            assert r.returncode != 0 and r.stderr.strip() == f"trace_summary: {f.name}: {err}", r
    print("trace_summary: ok")


if __name__ == "__main__":
    main()
