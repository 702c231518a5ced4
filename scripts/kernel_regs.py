#!/usr/bin/env python3
"""Registers, stack and spills of the CUDA kernels, by ptxas, without a GPU.

Recompiles the CUDA sources of a CUDA build (the compile commands of
build/compile_commands.json, configured with -DMOETIER_CUDA=ON) with
`-Xptxas -v`, output to /dev/null, and prints one line per kernel and
architecture: registers, stack frame, spill stores and loads, the kernel's
name (namespaces and parameter list dropped, template arguments kept).

With --base REV the same sources at REV (a temporary git worktree, compiled
with this build's flags) are compiled too, and only the kernels whose counts
differ, or that exist on one side only, are printed, base first. A review
tool: a kernel whose register count jumps (a switch's code compiled into the
default kernel) can lose occupancy and co-residency with the launches around
it, which no CPU test sees (docs/cuda.md, stop 50).

Usage: scripts/kernel_regs.py [--build DIR] [--base REV] [--files REGEX]
"""
import argparse
import concurrent.futures
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

ENTRY = re.compile(r"Compiling entry function '(.+)' for '(sm_\w+)'")
FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
USED = re.compile(r"Used (\d+) registers")


def short_name(name):
    """'void ns::(anonymous namespace)::k<1, (bool)1>(float*, int)' -> 'k<1, (bool)1>'."""
    n = name.replace("(anonymous namespace)::", "")
    if n.startswith("void "):
        n = n[5:]
    depth = 0
    for i, c in enumerate(n):  # the parameter list: the first '(' outside template arguments
        if c == "<":
            depth += 1
        elif c == ">":
            depth -= 1
        elif c == "(" and depth == 0 and i > 0:
            n = n[:i]
            break
    base, lt, args = n.partition("<")  # namespaces off the name, not off its template arguments
    return base.split("::")[-1] + lt + args


def parse(text):
    """ptxas -v output -> {(short name, arch): {regs, stack, spill_st, spill_ld}}."""
    out, cur = {}, None
    for line in text.splitlines():
        m = ENTRY.search(line)
        if m:
            cur = (short_name(demangle(m.group(1))), m.group(2))
            out[cur] = {"regs": None, "stack": 0, "spill_st": 0, "spill_ld": 0}
            continue
        if cur is None:
            continue
        m = FRAME.search(line)
        if m:
            out[cur].update(stack=int(m.group(1)), spill_st=int(m.group(2)), spill_ld=int(m.group(3)))
            continue
        m = USED.search(line)
        if m:
            out[cur]["regs"] = int(m.group(1))
            cur = None
    return out


def demangle(name):
    if not name.startswith("_Z") or not shutil.which("c++filt"):
        return name
    r = subprocess.run(["c++filt", name], capture_output=True, text=True)
    return r.stdout.strip() or name


def diff(base, head):
    """The keys whose counts differ or that one side lacks, sorted."""
    keys = sorted(set(base) | set(head))
    return [k for k in keys if base.get(k) != head.get(k)]


def fmt(k, v):
    if v is None:
        return f"{'-':>5} {'-':>6} {'-':>11}  {k[0]} ({k[1]})"
    sp = f"{v['spill_st']}/{v['spill_ld']}"
    return f"{v['regs']:>5} {v['stack']:>6} {sp:>11}  {k[0]} ({k[1]})"


def commands(build, files, root, new_root):
    """The compile commands of the matching sources, for ptxas -v (no object, no depfile)."""
    with open(os.path.join(build, "compile_commands.json")) as f:
        entries = json.load(f)
    cmds = []
    for e in entries:
        if not re.search(files, e["file"]):
            continue
        args = shlex.split(e["command"])
        keep, skip = [], False
        for a in args:
            if skip:
                skip = False
                continue
            if a in ("-o", "-MT", "-MF"):
                skip = True
                continue
            if a == "-MD":
                continue
            # the sources' paths (root/src...) to the other tree's; the build's stay
            keep.append(re.sub(re.escape(root) + r"(?=/src(/|$))", new_root, a) if new_root else a)
        cmds.append((e["directory"], keep + ["-o", os.devnull, "-Xptxas", "-v"]))
    return cmds


def run_all(cmds):
    def one(c):
        r = subprocess.run(c[1], cwd=c[0], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"kernel_regs: compile failed: {' '.join(c[1])}\n{r.stderr[-2000:]}")
        return r.stderr + r.stdout
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as ex:
        texts = list(ex.map(one, cmds))
    res = {}
    for t in texts:
        res.update(parse(t))
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--base", help="a git revision to compare against")
    ap.add_argument("--files", default=r"src/kernels/cuda/[^/]*\.cu$")
    a = ap.parse_args()
    if not os.path.exists(os.path.join(a.build, "compile_commands.json")):
        sys.exit(f"kernel_regs: {a.build}/compile_commands.json: not found (a CUDA build first)")
    g = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True)
    if g.returncode != 0:
        sys.exit(f"kernel_regs: {os.getcwd()}: not in a git checkout ({g.stderr.strip()})")
    root = g.stdout.strip()
    head = run_all(commands(a.build, a.files, root, None))
    if not head:
        sys.exit(f"kernel_regs: no kernel compiled from sources matching {a.files}")
    print(f"{'regs':>5} {'stack':>6} {'spill st/ld':>11}  kernel (arch)")
    if not a.base:
        for k in sorted(head):
            print(fmt(k, head[k]))
        return
    with tempfile.TemporaryDirectory() as tmp:
        wt = os.path.join(tmp, "base")
        subprocess.run(["git", "worktree", "add", "--detach", "-q", wt, a.base], check=True)
        try:
            base = run_all(commands(a.build, a.files, root, wt))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", wt], check=False)
    changed = diff(base, head)
    for k in changed:
        print(f"{fmt(k, base.get(k))}  [{a.base}]")
        print(f"{fmt(k, head.get(k))}  [this tree]")
    print(f"{len(changed)} of {len(set(base) | set(head))} kernels differ")


if __name__ == "__main__":
    main()
