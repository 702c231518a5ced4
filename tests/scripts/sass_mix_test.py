#!/usr/bin/env python3
"""scripts/sass_mix.py on made-up cuobjdump -sass output whose counts are known.

Two functions (one matched, one not), predicated instructions, dotted forms of
one family; then the errors: no function matched, a bad expression, a missing
file. Each must end with one line on stderr and exit status 1.
"""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "scripts", "sass_mix.py")

SASS = """
	code for sm_90
		Function : _ZN7moetier4cuda22moe_gate_up_q8_kernelILi8EEEvPKi
	.headerflags	@"EF_CUDA_TEXMODE_UNIFIED EF_CUDA_64BIT_ADDRESS EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                          /* 0x00000a00ff017b82 */
        /*0010*/                   IMAD.MOV.U32 R2, RZ, RZ, 0x10 ;                 /* 0x00000010ff027424 */
        /*0020*/                   PRMT R4, R5, 0x5410, R6 ;                       /* 0x0000541005047816 */
        /*0030*/               @P0 PRMT R7, R5, R8, R6 ;                           /* 0x0000000805070216 */
        /*0040*/              @!P1 IMAD.HI.U32 R9, R9, c[0x3][0x0], RZ ;           /* 0x0000c00009099a27 */
        /*0050*/                   IDP.4A.S8.S8 R10, R4, R11, R10 ;                /* 0x0000000b040a7226 */
        /*0060*/             @!UP0 SHF.R.U32.HI R12, RZ, 0x10, R5 ;                /* 0x00000010ff0c8819 */
        /*0070*/                   LOP3.LUT R13, R5, 0x77777777, RZ, 0xc0, !PT ;   /* 0x77777777050d7812 */
        /*0080*/                   IMAD R14, R2, R3, R14 ;                         /* 0x00000003020e7224 */
        /*0090*/                   EXIT ;                                          /* 0x000000000000794d */
		..........

		Function : _ZN7moetier4cuda11attn_kernelEPKf
        /*0000*/                   PRMT R4, R5, 0x5410, R6 ;                       /* 0x0000541005047816 */
        /*0010*/                   EXIT ;                                          /* 0x000000000000794d */
"""


def run(args, stdin=None):
    return subprocess.run([sys.executable, SCRIPT, *args], input=stdin, capture_output=True, text=True)


def main():
    r = run(["--funcs", "gate_up", "--ops", "PRMT,IMAD,IMAD.HI,IMAD.MOV,IDP,SHF,LOP3,FFMA"], SASS)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 2 and lines[0].endswith("moe_gate_up_q8_kernelILi8EEEvPKi"), lines
    assert lines[1].split() == ["PRMT=2", "IMAD=3", "IMAD.HI=1", "IMAD.MOV=1", "IDP=1", "SHF=1",
                                "LOP3=1", "FFMA=0", "total=10"], lines[1]
    # Both functions, from a file.
    with tempfile.NamedTemporaryFile("w", suffix=".sass") as f:
        f.write(SASS)
        f.flush()
        r = run([f.name, "--funcs", "moetier", "--ops", "PRMT"])
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == ["_ZN7moetier4cuda22moe_gate_up_q8_kernelILi8EEEvPKi", "PRMT=2",
                                    "total=10", "_ZN7moetier4cuda11attn_kernelEPKf", "PRMT=1",
                                    "total=2"], r.stdout
    # Errors: one line, status 1.
    for args, stdin, want in ((["--funcs", "nothing_like_it"], SASS, "no function matches"),
                              (["--funcs", "("], SASS, "--funcs '('"),
                              (["/nonexistent/x.sass", "--funcs", "a"], None, "/nonexistent/x.sass")):
        r = run(args, stdin)
        assert r.returncode == 1 and want in r.stderr and len(r.stderr.splitlines()) == 1, (args, r)
    print("sass_mix_test: ok")


if __name__ == "__main__":
    main()
