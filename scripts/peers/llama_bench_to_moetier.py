#!/usr/bin/python3
"""llama-bench's JSON (-o json) -> a moetier-bench/1 result (docs/bench-format.md).

    llama_bench_to_moetier.py RAW.json -o OUT.json [--like MOETIER.json]
        [--workload NAME=P,G ...] [--name ARM] [--command TEXT] [--version-file FILE]

llama-bench measures prompt processing (a test with n_prompt = P, n_gen = 0) and
generation (n_prompt = 0, n_gen = G) as separate tests, each repeated -r times
after a warm-up. A workload of the schema is one pp test and one tg test:
  --workload NAME=P,G   pairs the pp test of P tokens with the tg test of G tokens;
  --like FILE           takes the names, prompt_tokens and gen_tokens of FILE's
                        workloads (a moetier bench result), so that `moetier report`
                        puts both engines side by side under the same names; a
                        workload with neither test is skipped (a note on stderr);
  neither               pairs the pp and tg tests in the order llama-bench ran them
                        (-p 412,380 -n 512,512), named "ppP+tgG"; an unpaired test
                        becomes a workload of its own ("ppP" or "tgG").
The tg test run at depth P (-d P: generation after a P-token context) is preferred
for a workload of P prompt tokens; without one, the depth-0 test stands in (the
flags say which depth).
Run i of a workload holds repetition i of its pp test (prompt_tps) and of its tg
test (decode_tps); median, min and max are over the repetitions. All runs are
warm (llama-bench warms up first). TTFT, expert reads and memory are not
measured by llama-bench and are left out (absent = not measured). Combined
tests (-pg) report one rate over prompt and generated tokens together; they
are skipped, with a note on stderr.

The engine is "llama.cpp", version its commit (the full one from --version-file,
llama.cpp.sh's record, when it starts with llama-bench's build_commit), flags
rebuilt from the fields llama-bench records. Output is written atomically.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile

SCHEMA = "moetier-bench/1"


def die(msg):
    print("llama_bench_to_moetier.py: " + msg, file=sys.stderr)
    sys.exit(1)


def load_json(path, what):
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as e:
        die("%s: cannot read (%s)" % (path, e.strerror))
    except json.JSONDecodeError as e:
        die("%s: not JSON (%s)" % (path, e))


def read_records(path):
    recs = load_json(path, "llama-bench output")
    if not isinstance(recs, list) or not recs:
        die("%s: expected llama-bench's JSON array (-o json), got %s" % (path, type(recs).__name__))
    for i, r in enumerate(recs):
        for k in ("n_prompt", "n_gen", "samples_ts", "build_commit"):
            if not isinstance(r, dict) or k not in r:
                die("%s: [%d].%s: missing" % (path, i, k))
    return recs


def flags_of(r):
    """The llama-bench options that shape speed and memory, as its CLI spells them."""
    parts = ["-t %s" % r.get("n_threads")]
    for key, opt in (("n_gpu_layers", "-ngl"), ("n_cpu_moe", "--n-cpu-moe"), ("n_batch", "-b"),
                     ("n_ubatch", "-ub"), ("type_k", "-ctk"), ("type_v", "-ctv"),
                     ("flash_attn", "-fa")):
        if key in r:
            parts.append("%s %s" % (opt, r[key]))
    ot = r.get("tensor_buft_overrides")
    if ot and ot != "none":
        parts.append("-ot %s" % ot)
    if r.get("backends"):
        parts.append("(backends %s)" % r["backends"])
    return " ".join(parts)


def stats(values):
    return statistics.median(values), min(values), max(values)


def workload(name, pp, tg):
    runs = []
    n = max(len(pp["samples_ts"]) if pp else 0, len(tg["samples_ts"]) if tg else 0)
    for i in range(n):
        run = {"cold": False}
        if pp and i < len(pp["samples_ts"]):
            run["prompt_tps"] = pp["samples_ts"][i]
        if tg and i < len(tg["samples_ts"]):
            run["decode_tps"] = tg["samples_ts"][i]
        runs.append(run)
    w = {"name": name, "runs": runs, "median": {}, "min": {}, "max": {}}
    if pp:
        w["prompt_tokens"] = pp["n_prompt"]
    if tg:
        w["gen_tokens"] = tg["n_gen"]
        w["tg_depth"] = tg.get("n_depth", 0)  # context the generation ran after
    for key, rec in (("prompt_tps", pp), ("decode_tps", tg)):
        if rec and rec["samples_ts"]:
            w["median"][key], w["min"][key], w["max"][key] = stats(rec["samples_ts"])
    return w


def pick(recs, key, n, depth):
    """The test of N tokens (KEY n_prompt or n_gen), at DEPTH when one was run there."""
    same = [r for r in recs if r[key] == n]
    return next((r for r in same if r.get("n_depth", 0) == depth), same[0] if same else None)


def pairs_from_specs(specs, pps, tgs, where, strict):
    out = []
    for name, p, g in specs:
        pp = pick(pps, "n_prompt", p, 0) if p else None
        # decode after a P-token prompt is llama-bench's tg at depth P (-d P), if run
        tg = pick(tgs, "n_gen", g, p) if g else None
        if not pp and not tg:
            msg = "%s: no pp test of %s tokens nor tg test of %s tokens in the llama-bench output" \
                % (where(name), p, g)
            if strict:
                die(msg)
            print("llama_bench_to_moetier.py: skipping " + msg, file=sys.stderr)
            continue
        out.append((name, pp, tg))
    return out


def default_pairs(pps, tgs):
    if len(pps) == len(tgs):
        return [("pp%d+tg%d" % (p["n_prompt"], t["n_gen"]), p, t) for p, t in zip(pps, tgs)]
    return ([("pp%d" % p["n_prompt"], p, None) for p in pps] +
            [("tg%d" % t["n_gen"], None, t) for t in tgs])


def parse_spec(text):
    try:
        name, rest = text.split("=", 1)
        p, g = rest.split(",", 1)
        return name, int(p), int(g)
    except ValueError:
        die("--workload %r: expected NAME=PROMPT_TOKENS,GEN_TOKENS (e.g. code=412,512)" % text)


def like_specs(path):
    doc = load_json(path, "--like")
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        die("%s: schema: expected \"%s\"" % (path, SCHEMA))
    specs = []
    for a in doc.get("arms", []):
        for w in a.get("workloads", []):
            if w.get("name") and not any(s[0] == w["name"] for s in specs):
                specs.append((w["name"], w.get("prompt_tokens", 0), w.get("gen_tokens", 0)))
    if not specs:
        die("%s: arms[].workloads: no workload to take names from" % path)
    return specs


def full_commit(short, version_file):
    if version_file and os.path.exists(version_file):
        for line in open(version_file):
            if line.startswith("commit=") and line[7:].strip().startswith(short):
                return line[7:].strip()
    return short


def convert(recs, args):
    pps = [r for r in recs if r["n_prompt"] > 0 and r["n_gen"] == 0]
    tgs = [r for r in recs if r["n_prompt"] == 0 and r["n_gen"] > 0]
    for r in recs:
        if r["n_prompt"] > 0 and r["n_gen"] > 0:
            print("llama_bench_to_moetier.py: skipping the combined test pp%d+tg%d (one rate for "
                  "both; use -p and -n)" % (r["n_prompt"], r["n_gen"]), file=sys.stderr)
    if args.like:
        pairs = pairs_from_specs(like_specs(args.like), pps, tgs,
                                 lambda n: "%s: workload %s" % (args.like, n), False)
    elif args.workload:
        pairs = pairs_from_specs([parse_spec(s) for s in args.workload], pps, tgs,
                                 lambda n: "--workload " + n, True)
    else:
        pairs = default_pairs(pps, tgs)
    r0 = recs[0]
    arm = {"name": args.name or "llama.cpp %s t%s" % (r0.get("backends", "").lower() or "cpu",
                                                       r0.get("n_threads")),
           "engine": "llama.cpp", "version": full_commit(r0["build_commit"], args.version_file),
           "flags": flags_of(r0),
           "model": {"dir": r0.get("model_filename", ""), "architecture": r0.get("model_type", "")},
           "workloads": [workload(n, p, t) for n, p, t in pairs]}
    if isinstance(r0.get("model_size"), (int, float)):
        arm["model"]["total_bytes"] = r0["model_size"]
    machine = {"cpu": r0.get("cpu_info", "")}
    if r0.get("gpu_info"):
        machine["gpu"] = r0["gpu_info"]
    doc = {"schema": SCHEMA, "command": args.command or "llama-bench -o json (%s)" % flags_of(r0),
           "started": min(r.get("test_time", "") for r in recs), "machine": machine, "arms": [arm]}
    return doc


def write_atomic(path, text):
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".tmp.", dir=d)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("raw", help="llama-bench -o json output")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--like", help="a moetier-bench/1 file whose workload names to use")
    ap.add_argument("--workload", action="append", help="NAME=PROMPT_TOKENS,GEN_TOKENS")
    ap.add_argument("--name", help="the arm's name (default: llama.cpp BACKENDS tTHREADS)")
    ap.add_argument("--command", help="the command that produced RAW")
    ap.add_argument("--version-file", help="llama.cpp.sh's record ($PEERS_DIR/llama.cpp.version)")
    args = ap.parse_args()
    doc = convert(read_records(args.raw), args)
    write_atomic(args.output, json.dumps(doc, indent=1) + "\n")
    print("llama_bench_to_moetier.py: wrote %s (%d workloads)" %
          (args.output, len(doc["arms"][0]["workloads"])), file=sys.stderr)


if __name__ == "__main__":
    main()
