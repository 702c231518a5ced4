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

Limits: the sources compiled are this build's; one that REV lacks is compiled
on this side only (its kernels print as new), and one that only REV has is not
compiled. Errors (no build, bad JSON, a bad pattern or revision, a compile
that fails) end with one line naming the file or revision.

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
    """One line: registers, stack, spills, then the key (name, arch[, source])."""
    where = ", ".join(k[1:])
    if v is None:
        return f"{'-':>5} {'-':>6} {'-':>11}  {k[0]} ({where})"
    regs = "?" if v["regs"] is None else v["regs"]
    sp = f"{v['spill_st']}/{v['spill_ld']}"
    return f"{regs:>5} {v['stack']:>6} {sp:>11}  {k[0]} ({where})"


def fail(msg):
    sys.exit(f"kernel_regs: {msg}")


def load_entries(build):
    path = os.path.join(build, "compile_commands.json")
    try:
        with open(path) as f:
            entries = json.load(f)
    except OSError as e:
        fail(f"{path}: {e.strerror} (a CUDA build first)")
    except ValueError as e:
        fail(f"{path}: not JSON ({e})")
    if not isinstance(entries, list):
        fail(f"{path}: not a list of compile commands")
    return path, entries


def commands(build, files, root, new_root):
    """(directory, source, args) of the matching sources, for ptxas -v: no object, no
    depfile; with new_root, the paths under root/src moved to new_root/src (the
    build's own paths stay), and a source missing there left out."""
    path, entries = load_entries(build)
    try:
        pat = re.compile(files)
    except re.error as e:
        fail(f"--files {files!r}: {e}")
    roots = sorted({root, os.path.realpath(root)}, key=len, reverse=True)
    swap = re.compile("|".join(re.escape(r) for r in roots) + r"(?=/src(/|$))")
    cmds = []
    for e in entries:
        src = e.get("file", "") if isinstance(e, dict) else ""
        if not src or not pat.search(src):
            continue
        if "arguments" in e:
            args = list(e["arguments"])
        elif "command" in e:
            args = shlex.split(e["command"])
        else:
            fail(f"{path}: an entry for {src} has no command")
        keep, skip = [], False
        for a in args:
            if skip:
                skip = False
                continue
            if a in ("-o", "-MT", "-MF"):
                skip = True
                continue
            if a != "-MD":
                keep.append(swap.sub(new_root, a) if new_root else a)
        if new_root:
            moved = swap.sub(new_root, src)
            if moved == src:
                fail(f"{src}: not under {root}/src, so --base cannot compile the other tree's copy")
            if not os.path.exists(moved):
                continue  # a source the base lacks: its kernels print as new
            src = moved
        cmds.append((e.get("directory", "."), src, keep + ["-o", os.devnull, "-Xptxas", "-v"]))
    return cmds


def run_all(cmds):
    """{(name, arch, source file name): counts} over the compile commands."""
    def one(c):
        try:
            r = subprocess.run(c[2], cwd=c[0], capture_output=True, text=True)
        except OSError as e:
            fail(f"{c[1]}: cannot run {c[2][0]} ({e.strerror})")
        if r.returncode != 0:
            last = (r.stderr.strip().splitlines() or ["no output"])[-1]
            fail(f"{c[1]}: compile failed (rc {r.returncode}): {last}")
        return os.path.basename(c[1]), r.stderr + r.stdout
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as ex:
        texts = list(ex.map(one, cmds))
    res = {}
    for name, t in texts:
        for (k, arch), v in parse(t).items():
            res[(k, arch, name)] = v
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--base", help="a git revision to compare against")
    ap.add_argument("--files", default=r"src/kernels/cuda/[^/]*\.cu$")
    a = ap.parse_args()
    load_entries(a.build)  # a missing or bad build: one line before anything else
    g = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True)
    if g.returncode != 0:
        fail(f"{os.getcwd()}: not in a git checkout ({g.stderr.strip()})")
    root = g.stdout.strip()
    head = run_all(commands(a.build, a.files, root, None))
    if not head:
        fail(f"no kernel compiled from the sources matching {a.files}")
    header = f"{'regs':>5} {'stack':>6} {'spill st/ld':>11}  kernel (arch, source)"
    if not a.base:
        print(header)
        for k in sorted(head):
            print(fmt(k, head[k]))
        return
    with tempfile.TemporaryDirectory() as tmp:
        wt = os.path.join(tmp, "base")
        r = subprocess.run(["git", "worktree", "add", "--detach", "-q", wt, a.base],
                           capture_output=True, text=True)
        if r.returncode != 0:
            fail(f"--base {a.base}: {(r.stderr.strip().splitlines() or ['git worktree add failed'])[-1]}")
        try:
            base = run_all(commands(a.build, a.files, root, wt))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", wt], capture_output=True)
    changed = diff(base, head)
    print(header)
    for k in changed:
        print(f"{fmt(k, base.get(k))}  [{a.base}]")
        print(f"{fmt(k, head.get(k))}  [this tree]")
    print(f"{len(changed)} of {len(set(base) | set(head))} kernels differ")


if __name__ == "__main__":
    main()
