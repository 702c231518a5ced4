#!/usr/bin/env python3
"""Combines the rounds of scripts/peers/side_by_side.sh into one moetier-bench/1 file.

    side_by_side_combine.py --moetier R1.json R2.json ... --peer P1.json P2.json ...
        --meta META.json -o OUT.json

Each round file is what one `moetier bench` wrote (the moetier arm, or the peer
driven through --endpoint). Out: two arms, moetier and llama.cpp, each with every
round's runs (a `round` field on each run); median/min/max over the warm runs of
all rounds (the first run of each round is its cold one and stays out, as in
`moetier bench`), the moetier arm's bound from its first round and the fraction
of it recomputed; the llama.cpp arm gets engine "llama.cpp", the peer's version
and the server's flags from META. META's other fields go under `side_by_side`,
with `ratios`: per workload, moetier's median over llama.cpp's for decode_tps,
prompt_tps and ttft_s (for ttft_s lower is better, so a ratio above 1 means
moetier is slower to its first token).
"""
import argparse
import json
import os
import statistics
import sys

FIGURES = ("ttft_s", "prompt_tps", "decode_tps")


def die(msg):
    print("side_by_side_combine.py: " + msg, file=sys.stderr)
    sys.exit(1)


def load(path):
    try:
        with open(path) as f:
            d = json.load(f)
    except (OSError, ValueError) as e:
        die("%s: %s" % (path, e))
    if d.get("schema") != "moetier-bench/1" or len(d.get("arms", [])) != 1:
        die("%s: expected a moetier-bench/1 file with one arm" % path)
    return d


def summarize(wl):
    runs = wl["runs"]
    warm = [r for r in runs if not r.get("cold")] or runs
    for k in ("median", "min", "max"):
        wl[k] = {}
    for key in FIGURES:
        v = [r[key] for r in warm if isinstance(r.get(key), (int, float))]
        if not v:
            continue
        wl["median"][key] = statistics.median(v)
        wl["min"][key] = min(v)
        wl["max"][key] = max(v)
    wl["warm_runs"] = len(warm)
    frac = {}
    for key, b in wl.get("bound", {}).items():
        if key in wl["median"] and b:
            frac[key] = wl["median"][key] / b
    if frac:
        wl["fraction_of_bound"] = frac


def merge(files):
    """One arm from the rounds: the first round's arm with every round's runs."""
    arm = json.loads(json.dumps(files[0]["arms"][0]))
    by_name = {w["name"]: w for w in arm["workloads"]}
    for w in arm["workloads"]:
        w["runs"] = []
    for i, d in enumerate(files, 1):
        a = d["arms"][0]
        if [w["name"] for w in a["workloads"]] != list(by_name):
            die("round %d: other workloads than round 1" % i)
        for w in a["workloads"]:
            for r in w["runs"]:
                r["round"] = i
                by_name[w["name"]]["runs"].append(r)
    for w in arm["workloads"]:
        summarize(w)
    loads = [d["arms"][0]["load_s"] for d in files if "load_s" in d["arms"][0]]
    if loads:
        arm["load_s"] = statistics.median(loads)
        arm["load_s_rounds"] = loads
    return arm


def ratios(m, p):
    out = {}
    pw = {w["name"]: w for w in p["workloads"]}
    for w in m["workloads"]:
        o = pw.get(w["name"])
        if not o:
            continue
        r = {}
        for key in FIGURES:
            a, b = w["median"].get(key), o["median"].get(key)
            if a is not None and b:
                r[key] = a / b
        out[w["name"]] = r
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--moetier", nargs="+", required=True)
    ap.add_argument("--peer", nargs="+", required=True)
    ap.add_argument("--meta", required=True)
    ap.add_argument("-o", "--out", required=True)
    a = ap.parse_args()
    ms, ps = [load(p) for p in a.moetier], [load(p) for p in a.peer]
    with open(a.meta) as f:
        meta = json.load(f)
    m, p = merge(ms), merge(ps)
    peer = meta.get("peer", {})
    p["engine"] = "llama.cpp"
    p["version"] = peer.get("version", {}).get("commit", p.get("version", ""))
    p["flags"] = peer.get("flags", "")
    p["endpoint"] = peer.get("url", "")
    p["model"] = {"gguf": peer.get("gguf", ""), "dir": meta.get("model", "")}
    if "peak_rss_bytes" in peer:  # the server's VmHWM at the end (not per run)
        p["peak_host_bytes"] = peer["peak_rss_bytes"]
    first = ms[0]
    out = {
        "schema": "moetier-bench/1",
        "command": meta.get("command", ""),
        "commit": first.get("commit", ""),
        "started": first.get("started", ""),
        "machine": first.get("machine", {}),
        "bounds": first.get("bounds", {}),
        "arms": [m, p],
    }
    if "monitor" in first:
        out["monitor"] = first["monitor"]
    meta["ratios"] = ratios(m, p)
    meta["round_files"] = {"moetier": a.moetier, "peer": a.peer}
    out["side_by_side"] = meta
    tmp = a.out + ".tmp.%d" % os.getpid()
    with open(tmp, "w") as f:
        json.dump(out, f, indent=2)
        f.write("\n")
    os.replace(tmp, a.out)
    print("%-22s %14s %14s %8s %14s %14s %8s" % ("workload", "moetier dec", "llama dec", "ratio",
                                                  "moetier pp", "llama pp", "ratio"))
    pw = {w["name"]: w for w in p["workloads"]}
    for w in m["workloads"]:
        o = pw[w["name"]]["median"]
        r = meta["ratios"].get(w["name"], {})
        print("%-22s %14.2f %14.2f %7.2fx %14.1f %14.1f %7.2fx" % (
            w["name"], w["median"].get("decode_tps", 0), o.get("decode_tps", 0),
            r.get("decode_tps", 0), w["median"].get("prompt_tps", 0), o.get("prompt_tps", 0),
            r.get("prompt_tps", 0)))


if __name__ == "__main__":
    main()
