#!/usr/bin/env python3
"""scripts/trace_blocks.py on a made-up step whose answers are known.

Three launches (grids 7, 8, 9, listed out of order): the reference's 4 blocks
on SMs 0-3, released at 1 ms with one mark each; the next launch's 6 blocks,
those on SMs 0-3 entering their wait late (a block beside the reference's;
their kernel's start recorded 2 us before) and those on SMs 4-5 early (no
start recorded); a third launch of one block. The quantiles, the split
by the reference's SMs, the entries after the reference's mark on the same SM
(--after) and the errors must come out as computed
by hand (quantiles interpolated between ranks, as statistics.quantiles'
inclusive method; the median as statistics.median).
"""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "scripts", "trace_blocks.py")
T0 = 1_000_000  # ns: the reference's first release


def made_up(path):
    lines = ["grid,block,blocks,sm,mark,enter,leave,start"]
    for b in range(4):  # reference: entries 500 ns before, releases 0 / 40 ns after T0
        lines.append(f"7,{b},4,{b},0,{T0 - 500},{T0 + 40 * (b % 2)}")
        lines.append(f"7,{b},4,{b},1,{T0 + 1000 * (b + 1)},{T0 + 1000 * (b + 1)}")
    for b in range(6):  # next: on SMs 0-3 entering at 5, 6, 7, 8 us; on 4-5 at 1, 2 us
        sm = b
        enter = T0 + (5000 + 1000 * b if b < 4 else 1000 * (b - 3))
        start = enter - 2000 if b < 4 else ""  # the kernel's start: only those on SMs 0-3
        lines.append(f"8,{b},6,{sm},0,{enter},{T0 + 9000},{start}")
    lines.append(f"9,0,1,0,0,{T0 + 9500},{T0 + 10000}")
    lines[1:] = lines[1:][::-1]  # the file's order is not the launch order
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)


def main():
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "t.csv.rows")
        made_up(path)
        out = run(path, "--ref", "0", "--from", "0", "--to", "2", "--split", "0")
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        want = [
            "3 launches; us after launch 0's first release; min p10 median p90 max",
            "launch 0: 4 blocks on 4 SMs",
            "  entry    on launch 0's SMs (4 blocks)   -0.50   -0.50   -0.50   -0.50   -0.50",
            "  release  on launch 0's SMs (4 blocks)    0.00    0.00    0.02    0.04    0.04",
            "  mark 1   on launch 0's SMs (4 blocks)    1.00    1.30    2.50    3.70    4.00",
            "  elsewhere: no blocks",
            "launch 1: 6 blocks on 6 SMs",
            "  start    on launch 0's SMs (4 blocks)    3.00    3.30    4.50    5.70    6.00",
            "  entry    on launch 0's SMs (4 blocks)    5.00    5.30    6.50    7.70    8.00",
            "  release  on launch 0's SMs (4 blocks)    9.00    9.00    9.00    9.00    9.00",
            "  entry    elsewhere (2 blocks)    1.00    1.10    1.50    1.90    2.00",
            "  release  elsewhere (2 blocks)    9.00    9.00    9.00    9.00    9.00",
            "launch 2: 1 blocks on 1 SMs",
            "  entry    on launch 0's SMs (1 blocks)    9.50    9.50    9.50    9.50    9.50",
            "  release  on launch 0's SMs (1 blocks)   10.00   10.00   10.00   10.00   10.00",
            "  elsewhere: no blocks",
        ]
        assert lines == want, "\n".join(lines)
        # without --split: one group, all blocks
        out = run(path, "--ref", "1", "--from", "1", "--to", "1")
        assert out.returncode == 0, out.stderr
        assert out.stdout.splitlines()[2:4] == [
            "  start    (4 blocks)   -6.00   -5.70   -4.50   -3.30   -3.00",
            "  entry    (6 blocks)   -8.00   -7.50   -3.50   -1.50   -1.00"], out.stdout
        # --after: each block's wait entry after the reference's mark 1 on its SM
        # (SM b's mark at b + 1 us; launch 1's blocks there enter at 5 + b us;
        # launch 2's one block, on SM 0, at 9.5 us)
        out = run(path, "--ref", "0", "--from", "1", "--to", "2", "--after", "0:1")
        assert out.returncode == 0, out.stderr
        got = [l for l in out.stdout.splitlines() if l.startswith("  block ")]
        assert got == [
            "  block 1 on an SM, entry after launch 0:1's mark (4 SMs)    4.00    4.00    4.00"
            "    4.00    4.00",
            "  block 1 on an SM, entry after launch 0:1's mark (1 SMs)    8.50    8.50    8.50"
            "    8.50    8.50"], out.stdout
        for bad, err in (("0:5", "launch 0 recorded no mark 5"), ("1", "expected S:M")):
            out = run(path, "--ref", "0", "--to", "2", "--after", bad)
            assert out.returncode != 0 and err in out.stderr, out.stderr
        # bad input: one line naming the file (scripts/trace_csv.py), non-zero exit
        bad = os.path.join(d, "bad.rows")
        for text, err in (("grid,block,blocks,sm,mark,enter,leave\n7,0,1,0,0,x,5\n",
                           "line 2: column 'enter' is 'x', not an integer"),
                          ("grid,block,blocks,sm,mark,enter,leave\n7,0,1,0,0,4,5,6\n",
                           "line 2: more cells than the header"),
                          ("grid,block,blocks,sm,mark,enter\n7,0,1,0,0,4\n",
                           "no column 'leave' in its header")):
            with open(bad, "w") as f:
                f.write(text)
            out = run(bad, "--ref", "0")
            assert out.returncode != 0 and out.stderr.strip() == f"trace_blocks: {bad}: {err}", \
                out.stderr
        out = run(os.path.join(d, "none.rows"), "--ref", "0")
        assert out.returncode != 0 and "none.rows: No such file" in out.stderr, out.stderr
        # a launch past the step: one line naming the file, non-zero exit
        out = run(path, "--ref", "3")
        assert out.returncode != 0 and "launch 3 out of 0..2" in out.stderr, out.stderr
    print("trace_blocks: all checks passed")


if __name__ == "__main__":
    main()
