#!/usr/bin/env python3
"""scripts/kernel_regs.py's parsing on ptxas output whose answers are known.

Kernel names shortened (namespaces and parameter lists off, template arguments
kept, nested ones too), counts read per kernel and architecture (a kernel with
spills, one compiled for two architectures, a line between entries that
belongs to no kernel), the comparison of two trees (changed, added, removed,
unchanged), the compile commands rewritten for ptxas (no object, no depfile;
for the base tree only the sources' paths moved, the build's kept, a source
the base lacks left out), and bad input (no build, bad JSON, a bad pattern)
refused with one line.
"""
import importlib.util
import os
import json
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "scripts", "kernel_regs.py")
spec = importlib.util.spec_from_file_location("kernel_regs", SCRIPT)
kr = importlib.util.module_from_spec(spec)
spec.loader.exec_module(kr)

PTXAS = """ptxas info    : 272 bytes gmem
ptxas info    : Compiling entry function 'void moetier::cuda::(anonymous namespace)::attn_decode_kernel<1, 128>(float const*, float*, moetier::cuda::DecodePrep, unsigned int*)' for 'sm_90'
ptxas info    : Function properties for void moetier::cuda::(anonymous namespace)::attn_decode_kernel<1, 128>(float const*, float*, moetier::cuda::DecodePrep, unsigned int*)
    40 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 128 registers, used 1 barriers, 40 bytes cumulative stack size, 16 bytes smem
ptxas info    : Function properties for moetier::cuda::helper(float)
    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Compiling entry function 'moetier::cuda::(anonymous namespace)::attn_combine(float const*, long, long, float*)' for 'sm_90'
ptxas info    : Function properties for moetier::cuda::(anonymous namespace)::attn_combine(float const*, long, long, float*)
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers, 400 bytes cmem[0]
ptxas info    : Compiling entry function 'void moetier::cuda::k<moetier::cuda::Pair<2, 3>, (bool)1>(int)' for 'sm_120'
ptxas info    : Function properties for void moetier::cuda::k<moetier::cuda::Pair<2, 3>, (bool)1>(int)
    24 bytes stack frame, 16 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers
ptxas info    : Compiling entry function 'void moetier::cuda::k<moetier::cuda::Pair<2, 3>, (bool)1>(int)' for 'sm_90'
ptxas info    : Function properties for void moetier::cuda::k<moetier::cuda::Pair<2, 3>, (bool)1>(int)
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 168 registers, used 1 barriers
"""


def check(cond, what):
    if not cond:
        print("FAILED:", what)
        sys.exit(1)


def check_commands():
    with tempfile.TemporaryDirectory() as tmp:
        root, base, build = (os.path.join(tmp, d) for d in ("tree", "base", "tree/build"))
        for d in ("tree/src/k", "tree/build", "base/src/k"):
            os.makedirs(os.path.join(tmp, d))
        for f in ("tree/src/k/a.cu", "tree/src/k/b.cu", "base/src/k/a.cu"):  # b.cu: new
            open(os.path.join(tmp, f), "w").close()
        cmd = (f"nvcc -I{root}/src -I{root}/build/gen -MD -MT o.o -MF o.o.d -O3 -c {root}/src/k/a.cu "
               f"-o o.o")
        entries = [{"directory": build, "file": f"{root}/src/k/a.cu", "command": cmd},
                   {"directory": build, "file": f"{root}/src/k/b.cu",
                    "arguments": ["nvcc", "-c", f"{root}/src/k/b.cu", "-o", "b.o"]},
                   {"directory": build, "file": f"{root}/src/x.cpp", "command": "g++ -c x.cpp"}]
        with open(os.path.join(build, "compile_commands.json"), "w") as f:
            json.dump(entries, f)
        tail = ["-o", os.devnull, "-Xptxas", "-v"]
        got = kr.commands(build, r"\.cu$", root, None)
        check(got == [(build, f"{root}/src/k/a.cu", ["nvcc", f"-I{root}/src", f"-I{root}/build/gen", "-O3",
                                                     "-c", f"{root}/src/k/a.cu"] + tail),
                      (build, f"{root}/src/k/b.cu", ["nvcc", "-c", f"{root}/src/k/b.cu"] + tail)],
              f"commands of this tree: {got}")
        got = kr.commands(build, r"\.cu$", root, base)
        check(got == [(build, f"{base}/src/k/a.cu", ["nvcc", f"-I{base}/src", f"-I{root}/build/gen", "-O3",
                                                     "-c", f"{base}/src/k/a.cu"] + tail)],
              f"commands of the base tree: {got}")


def run_script(*args, cwd):
    r = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, cwd=cwd)
    return r.returncode, r.stderr.strip().splitlines()


def check_bad_input():
    top = os.path.join(HERE, "..", "..")
    rc, err = run_script("--build", "/nonexistent-build", cwd=top)
    check(rc != 0 and len(err) == 1 and "/nonexistent-build/compile_commands.json" in err[0],
          f"a build without compile commands: rc {rc}, {err}")
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "compile_commands.json"), "w") as f:
            f.write("[{not json")
        rc, err = run_script("--build", tmp, cwd=top)
        check(rc != 0 and len(err) == 1 and "compile_commands.json: not JSON" in err[0],
              f"bad JSON: rc {rc}, {err}")
        with open(os.path.join(tmp, "compile_commands.json"), "w") as f:
            f.write("[]")
        rc, err = run_script("--build", tmp, "--files", "([", cwd=top)
        check(rc != 0 and len(err) == 1 and "--files" in err[0], f"a bad pattern: rc {rc}, {err}")


def main():
    check(kr.short_name("void a::(anonymous namespace)::f<1, 128>(float const*, int)") == "f<1, 128>",
          "short name of a template kernel")
    check(kr.short_name("a::b::g(float*)") == "g", "short name of a plain kernel")
    check(kr.short_name("void a::k<a::P<2, 3>, (bool)1>(int)") == "k<a::P<2, 3>, (bool)1>",
          "nested template arguments kept")
    got = kr.parse(PTXAS)
    want = {
        ("attn_decode_kernel<1, 128>", "sm_90"): {"regs": 128, "stack": 40, "spill_st": 0, "spill_ld": 0},
        ("attn_combine", "sm_90"): {"regs": 32, "stack": 0, "spill_st": 0, "spill_ld": 0},
        ("k<moetier::cuda::Pair<2, 3>, (bool)1>", "sm_120"): {"regs": 255, "stack": 24, "spill_st": 16,
                                                             "spill_ld": 12},
        ("k<moetier::cuda::Pair<2, 3>, (bool)1>", "sm_90"): {"regs": 168, "stack": 0, "spill_st": 0,
                                                            "spill_ld": 0},
    }
    check(got == want, f"parse: {got}")
    base = dict(want)
    head = dict(want)
    head[("attn_decode_kernel<1, 128>", "sm_90")] = dict(want[("attn_decode_kernel<1, 128>", "sm_90")], regs=177)
    del head[("attn_combine", "sm_90")]
    head[("new_kernel", "sm_90")] = {"regs": 64, "stack": 0, "spill_st": 0, "spill_ld": 0}
    check(kr.diff(base, head) == [("attn_combine", "sm_90"), ("attn_decode_kernel<1, 128>", "sm_90"),
                                  ("new_kernel", "sm_90")], f"diff: {kr.diff(base, head)}")
    check(kr.diff(want, dict(want)) == [], "no difference between equal trees")
    line = kr.fmt(("k", "sm_90", "a.cu"), {"regs": 96, "stack": 8, "spill_st": 4, "spill_ld": 4})
    check(line.split() == ["96", "8", "4/4", "k", "(sm_90,", "a.cu)"], f"fmt: {line}")
    line = kr.fmt(("k", "sm_90"), {"regs": None, "stack": 0, "spill_st": 0, "spill_ld": 0})
    check(line.split()[0] == "?", f"fmt without a register count: {line}")
    check_commands()
    check_bad_input()
    print("kernel_regs: all checks passed")


if __name__ == "__main__":
    main()
