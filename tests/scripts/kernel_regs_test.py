#!/usr/bin/env python3
"""scripts/kernel_regs.py's parsing on ptxas output whose answers are known.

Kernel names shortened (namespaces and parameter lists off, template arguments
kept, nested ones too), counts read per kernel and architecture (a kernel with
spills, one compiled for two architectures, a line between entries that
belongs to no kernel), the comparison of two trees (changed, added, removed,
unchanged), and a build without compile commands refused with one line.
"""
import importlib.util
import os
import subprocess
import sys

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
    line = kr.fmt(("k", "sm_90"), {"regs": 96, "stack": 8, "spill_st": 4, "spill_ld": 4})
    check(line.split() == ["96", "8", "4/4", "k", "(sm_90)"], f"fmt: {line}")
    r = subprocess.run([sys.executable, SCRIPT, "--build", "/nonexistent-build"], capture_output=True,
                       text=True, cwd=os.path.join(HERE, "..", ".."))
    err = r.stderr.strip().splitlines()
    check(r.returncode != 0 and len(err) == 1 and "/nonexistent-build/compile_commands.json" in err[0],
          f"a build without compile commands: rc {r.returncode}, {r.stderr!r}")
    print("kernel_regs: all checks passed")


if __name__ == "__main__":
    main()
