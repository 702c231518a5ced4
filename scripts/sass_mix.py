#!/usr/bin/env python3
"""Static instruction mix of CUDA kernels from `cuobjdump -sass` output.

For each function whose name matches --funcs (a regular expression), prints
its instruction count and the count of each opcode in --ops: a name without a
dot counts the whole family (IMAD counts IMAD, IMAD.MOV.U32, IMAD.HI, ...), a
dotted one only the forms that start with it (IMAD.HI). The pipes the dot
product's instructions go to (docs/cuda.md, "The dot's high-half selectors on
the FMA pipe"): PRMT, LOP3 and SHF on the ALU pipe; IMAD and IDP (dp4a) on
the FMA pipe.

Usage: cuobjdump -sass BINARY | scripts/sass_mix.py --funcs 'moe_gate_up'
       scripts/sass_mix.py FILE --funcs REGEX [--ops PRMT,LOP3,...]
Bad input (an unreadable file, a bad expression, no function matched) ends
with one line on stderr and exit status 1.
"""
import argparse
import collections
import re
import sys

DEFAULT_OPS = "PRMT,LOP3,SHF,IADD3,IMAD,IMAD.HI,IMAD.MOV,IMAD.SHL,IDP,I2F,FFMA,FMUL,LDS,LDG,LDGSTS,SHFL,BAR"
FUNC = re.compile(r"Function : (\S+)")
# "        /*0090*/                   @!P0 IMAD.HI.U32 R4, R4, c[0x3][0x0], RZ ;   /* 0x... */"
INSN = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[0-9T]\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*)")


def fail(msg):
    print(f"sass_mix: {msg}", file=sys.stderr)
    sys.exit(1)


def mixes(lines, pat):
    """[(function, Counter of full opcodes)] for the functions matching pat, in order."""
    out, cur = [], None
    for line in lines:
        m = FUNC.search(line)
        if m:
            cur = collections.Counter() if pat.search(m.group(1)) else None
            if cur is not None:
                out.append((m.group(1), cur))
            continue
        m = INSN.match(line)
        if m and cur is not None:
            cur[m.group(1)] += 1
    return out


def count(opcodes, op):
    if "." in op:
        return sum(n for o, n in opcodes.items() if o == op or o.startswith(op + "."))
    return sum(n for o, n in opcodes.items() if o.split(".")[0] == op)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", nargs="?", default="-", help="cuobjdump -sass output (default stdin)")
    ap.add_argument("--funcs", required=True, help="regular expression on the function names")
    ap.add_argument("--ops", default=DEFAULT_OPS, help="comma-separated opcodes or families")
    a = ap.parse_args()
    try:
        pat = re.compile(a.funcs)
    except re.error as e:
        fail(f"--funcs {a.funcs!r}: {e}")
    name = "stdin" if a.file == "-" else a.file
    try:
        text = sys.stdin.read() if a.file == "-" else open(a.file, encoding="utf-8").read()
    except (OSError, UnicodeDecodeError) as e:
        fail(f"{name}: {e}")
    found = mixes(text.splitlines(), pat)
    if not found:
        fail(f"{name}: no function matches {a.funcs!r}")
    ops = [o for o in a.ops.split(",") if o]
    for fn, c in found:
        print(fn)
        print("   " + " ".join(f"{o}={count(c, o)}" for o in ops) + f" total={sum(c.values())}")


if __name__ == "__main__":
    main()
