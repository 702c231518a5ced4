#!/usr/bin/env python3
"""Select, split and write the moetier-tiny corpora (python3 standard library only).

Called by scripts/build_corpus.sh after the Debian packages are extracted under
data/raw/pkgs/<package>/. Writes data/corpus/:

  train_code.txt.xz, train_prose.txt.xz   training text (xz, the bulk)
  heldout_code.txt, heldout_prose.txt      held-out text (plain, about 1.25 MiB each)
  manifest.json                            packages, versions, licenses, counts, sha256

Every file is a sequence of documents, each followed by the end-of-document token
"<|endoftext|>" (the tokenizer's special token 0). One document is one source file,
except the Austen novels, whose documents are chapters. Documents are assigned to
train or held-out by a seeded hash of their id (never by line), then ordered by a
second seeded hash, so each file mixes its sources. Everything is deterministic:
sorted paths, fixed seed, fixed caps.
"""

import argparse
import gzip
import hashlib
import json
import lzma
import os
import re
import struct
import sys
import unicodedata
import zlib

EOD = "<|endoftext|>"
FORBIDDEN = ("<|endoftext|>", "<|pad|>")
MiB = 1 << 20

# (name, domain, package, root inside the extracted package, selector, train cap in bytes)
# Caps keep data/corpus/ (xz) near 30 MiB so that it travels to the GPU machine with the repo.
SOURCES = [
    ("kernel-doc", "prose", "linux-source-6.1", "src/linux-source-6.1", "kernel_doc", 30 * MiB),
    ("python-doc", "prose", "python3.11-doc", "usr/share/doc/python3.11/html/_sources", "py_doc", 16 * MiB),
    ("austen", "prose", "r-cran-janeaustenr", "usr/lib/R/site-library/janeaustenr/data", "austen", 8 * MiB),
    ("perl-pod", "prose", "perl-doc", "usr/share/perl", "perl_pod", 12 * MiB),
    ("git-doc", "prose", "git-doc", "usr/share/doc/git-doc", "git_doc", 4 * MiB),
    ("go-src", "code", "golang-1.19-src", "usr/share/go-1.19/src", "go_src", 36 * MiB),
    ("python-stdlib", "code", "libpython3.11-stdlib", "usr/lib/python3.11", "py_src", 8 * MiB),
    ("python-minimal", "code", "libpython3.11-minimal", "usr/lib/python3.11", "py_src", 6 * MiB),
    ("kernel-c", "code", "linux-source-6.1", "src/linux-source-6.1", "kernel_c", 30 * MiB),
]

KERNEL_C_DIRS = ("kernel/", "mm/", "lib/", "block/", "ipc/", "init/", "fs/", "net/core/",
                 "net/ipv4/", "include/linux/", "drivers/base/")

# SPDX names for what the packages' debian/copyright files say ("Files: *" stanza). The
# Python packages' copyright files are not machine-readable; their license is the PSF's.
SPDX = {
    "linux-source-6.1": "GPL-2.0-only (Documentation files carry their own SPDX lines)",
    "python3.11-doc": "PSF-2.0",
    "r-cran-janeaustenr": "MIT (the novels themselves are in the public domain)",
    "perl-doc": "GPL-1.0-or-later OR Artistic-1.0-Perl",
    "git-doc": "GPL-2.0-only",
    "golang-1.19-src": "BSD-3-Clause",
    "libpython3.11-stdlib": "PSF-2.0",
    "libpython3.11-minimal": "PSF-2.0",
}

MIN_DOC_BYTES = 200
MAX_DOC_BYTES = 400 * 1024


# ---------------------------------------------------------------------------------------
# Selectors: yield (doc_id, text) for one source. Paths are walked in sorted order.

def walk_sorted(root):
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for f in filenames:
            out.append(os.path.join(dirpath, f))
    out.sort()
    return out


def read_text(path, stats):
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) > MAX_DOC_BYTES:
        stats["skipped_large"] += 1
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        stats["skipped_not_utf8"] += 1
        return None
    return text


def is_generated(text):
    head = text[:2048]
    return "Code generated" in head and "DO NOT EDIT" in head


def sel_files(root, stats, accept):
    for path in walk_sorted(root):
        rel = os.path.relpath(path, root)
        if not accept(rel):
            continue
        stats["files_seen"] += 1
        text = read_text(path, stats)
        if text is None:
            continue
        yield rel, text


def sel_kernel_doc(root, stats):
    def accept(rel):
        return (rel.startswith("Documentation/") and rel.endswith((".rst", ".txt"))
                and not rel.startswith("Documentation/translations/"))
    yield from sel_files(root, stats, accept)


def sel_kernel_c(root, stats):
    def accept(rel):
        return rel.endswith((".c", ".h")) and rel.startswith(KERNEL_C_DIRS)
    yield from sel_files(root, stats, accept)


def sel_py_doc(root, stats):
    yield from sel_files(root, stats, lambda rel: rel.endswith(".rst.txt"))


def sel_perl_pod(root, stats):
    yield from sel_files(root, stats, lambda rel: rel.endswith(".pod"))


def sel_git_doc(root, stats):
    yield from sel_files(root, stats, lambda rel: rel.endswith(".txt") and "/" not in rel)


def sel_go_src(root, stats):
    def accept(rel):
        parts = rel.split("/")
        return rel.endswith(".go") and "testdata" not in parts and "vendor" not in parts
    for rel, text in sel_files(root, stats, accept):
        if is_generated(text):
            stats["skipped_generated"] += 1
            continue
        yield rel, text


def sel_py_src(root, stats):
    def accept(rel):
        parts = rel.split("/")
        return (rel.endswith(".py") and "site-packages" not in parts
                and "dist-packages" not in parts and not rel.startswith("_sysconfigdata"))
    yield from sel_files(root, stats, accept)


CHAPTER_RE = re.compile(r"^(CHAPTER|Chapter) +([IVXLC]+|[0-9]+)\.?$")


def sel_austen(root, stats):
    """The six novels of r-cran-janeaustenr (an R lazy-load database), one doc per chapter."""
    novels = read_r_lazyload(os.path.join(root, "Rdata"))
    for name in sorted(novels):
        stats["files_seen"] += 1
        chapters, cur = [], []
        for line in novels[name]:
            line = line or ""
            if CHAPTER_RE.match(line.strip()) and any(s.strip() for s in cur):
                chapters.append(cur)
                cur = []
            cur.append(line)
        if cur:
            chapters.append(cur)
        for i, lines in enumerate(chapters):
            yield "%s/chapter-%03d" % (name, i), "\n".join(lines)


SELECTORS = {
    "kernel_doc": sel_kernel_doc, "kernel_c": sel_kernel_c, "py_doc": sel_py_doc,
    "perl_pod": sel_perl_pod, "git_doc": sel_git_doc, "go_src": sel_go_src,
    "py_src": sel_py_src, "austen": sel_austen,
}


# ---------------------------------------------------------------------------------------
# A reader for R's XDR serialization, enough for the character vectors of janeaustenr.

class _RReader:
    def __init__(self, data):
        self.d, self.p, self.refs = data, 0, []

    def i32(self):
        v = struct.unpack_from(">i", self.d, self.p)[0]
        self.p += 4
        return v

    def raw(self, n):
        b = self.d[self.p:self.p + n]
        self.p += n
        return b

    def header(self):
        if self.raw(2) != b"X\n":
            raise ValueError("R data: not XDR serialization")
        version = self.i32()
        self.i32()
        self.i32()
        if version == 3:
            self.raw(self.i32())

    def length(self):
        n = self.i32()
        if n == -1:
            hi, lo = self.i32(), self.i32()
            n = (hi << 32) + lo
        return n

    def item(self):
        flags = self.i32()
        t = flags & 0xFF
        has_attr, has_tag = flags & (1 << 9), flags & (1 << 10)
        if t in (254, 242, 241, 253, 252, 251, 247):  # NULL and the singleton environments
            return None
        if t == 255:  # reference
            idx = flags >> 8
            return self.refs[(idx or self.i32()) - 1]
        if t == 1:  # symbol
            s = self.item()
            self.refs.append(s)
            return s
        if t in (2, 3, 5, 6, 17):  # pairlists: a dict tag -> value
            out = {}
            while True:
                if has_attr:
                    self.item()
                tag = self.item() if has_tag else None
                out[tag] = self.item()
                flags = self.i32()
                t = flags & 0xFF
                has_attr, has_tag = flags & (1 << 9), flags & (1 << 10)
                if t != 2:
                    self.p -= 4
                    self.item()
                    return out
        if t == 9:  # CHARSXP
            n = self.i32()
            return None if n == -1 else self.raw(n).decode("utf-8")
        if t in (10, 13):
            n = self.length()
            v = list(struct.unpack_from(">%di" % n, self.d, self.p))
            self.p += 4 * n
        elif t == 14:
            n = self.length()
            v = list(struct.unpack_from(">%dd" % n, self.d, self.p))
            self.p += 8 * n
        elif t in (16, 19, 20):
            v = [self.item() for _ in range(self.length())]
        elif t == 238:  # ALTREP: info, state, attributes
            self.item()
            state = self.item()
            self.item()
            return state
        else:
            raise ValueError("R data: unsupported SEXP type %d at byte %d" % (t, self.p))
        attrs = self.item() if has_attr else {}
        return (v, attrs or {})


def _unserialize(data):
    r = _RReader(data)
    r.header()
    return r.item()


def read_r_lazyload(base):
    """{name: list of str} from an R lazy-load database base.rdx/base.rdb (zlib blobs)."""
    with open(base + ".rdx", "rb") as f:
        idx_raw = f.read()
    idx_raw = gzip.decompress(idx_raw) if idx_raw[:2] == b"\x1f\x8b" else zlib.decompress(idx_raw[4:])
    values, attrs = _unserialize(idx_raw)
    top = dict(zip(attrs["names"][0], values))
    var_values, var_attrs = top["variables"]
    with open(base + ".rdb", "rb") as f:
        rdb = f.read()
    out = {}
    for name, (offlen, _) in zip(var_attrs["names"][0], var_values):
        off, ln = offlen
        blob = rdb[off:off + ln]
        vec, _ = _unserialize(zlib.decompress(blob[4:]))
        out[name] = vec
    return out


# ---------------------------------------------------------------------------------------

def clean(text):
    text = text.replace("\ufeff", "").replace("\r\n", "\n").replace("\r", "\n")
    text = unicodedata.normalize("NFC", text)
    text = text.rstrip() + "\n"
    return text


def unit_hash(seed, key):
    h = hashlib.sha256(("%d:%s" % (seed, key)).encode()).digest()
    return int.from_bytes(h[:8], "big") / 2.0 ** 64


def package_license(pkg_dir, pkg):
    """The License: of the 'Files: *' stanza of the Debian copyright file (or the first one)."""
    path = os.path.join(pkg_dir, "usr/share/doc", pkg, "copyright")
    if os.path.islink(os.path.join(pkg_dir, "usr/share/doc", pkg)) or not os.path.exists(path):
        cands = [p for p in walk_sorted(os.path.join(pkg_dir, "usr/share/doc")) if p.endswith("/copyright")]
        if not cands:
            return "unknown"
        path = cands[0]
    with open(path, "rb") as f:
        text = f.read().decode("utf-8", "replace")
    for stanza in text.split("\n\n"):
        if re.search(r"^Files:\s*\*\s*$", stanza, re.M):
            m = re.search(r"^License:\s*(.+)$", stanza, re.M)
            if m:
                return m.group(1).strip()
    m = re.search(r"^License:\s*(.+)$", text, re.M)
    return m.group(1).strip() if m else "see copyright file"


def collect(args, versions):
    """Returns (docs, source_stats); docs: list of dicts with domain, source, id, text."""
    docs, stats_all = [], {}
    for name, domain, pkg, root, selector, cap in SOURCES:
        pkg_dir = os.path.join(args.raw, pkg)
        stats = {"package": pkg, "version": versions.get(pkg, "?"), "domain": domain,
                 "license": SPDX.get(pkg, "?"), "debian_copyright_license": package_license(pkg_dir, pkg),
                 "train_cap_bytes": cap,
                 "files_seen": 0, "skipped_large": 0, "skipped_not_utf8": 0,
                 "skipped_generated": 0, "skipped_small": 0, "skipped_forbidden": 0,
                 "docs": 0}
        for rel, text in SELECTORS[selector](os.path.join(pkg_dir, root), stats):
            text = clean(text)
            if len(text.encode()) < MIN_DOC_BYTES:
                stats["skipped_small"] += 1
                continue
            if any(tok in text for tok in FORBIDDEN):
                stats["skipped_forbidden"] += 1
                continue
            stats["docs"] += 1
            docs.append({"domain": domain, "source": name, "id": "%s:%s" % (name, rel), "text": text})
        stats_all[name] = stats
        print("  %-15s %6d docs from %s %s" % (name, stats["docs"], pkg, stats["version"]), flush=True)
    return docs, stats_all


def split(docs, stats, args):
    """Held-out by seeded hash of the document id; caps applied in a second seeded hash order."""
    out = {("train", "code"): [], ("train", "prose"): [], ("heldout", "code"): [], ("heldout", "prose"): []}
    caps = {name: cap for name, _, _, _, _, cap in SOURCES}
    used = {name: 0 for name in caps}
    for d in docs:
        d["u_split"] = unit_hash(args.seed, "split:" + d["id"])
        d["u_order"] = unit_hash(args.seed, "order:" + d["id"])
    for d in sorted(docs, key=lambda d: d["u_order"]):
        st = stats[d["source"]]
        n = len(d["text"].encode())
        if d["u_split"] < args.heldout_fraction:
            out[("heldout", d["domain"])].append(d)
        else:
            if used[d["source"]] + n > caps[d["source"]]:
                st["train_docs_over_cap"] = st.get("train_docs_over_cap", 0) + 1
                continue
            used[d["source"]] += n
            out[("train", d["domain"])].append(d)
    # Held-out files are capped as a whole (hash order, so sources stay mixed).
    for domain in ("code", "prose"):
        kept, total = [], 0
        for d in out[("heldout", domain)]:
            n = len(d["text"].encode())
            if total + n > args.heldout_cap:
                stats[d["source"]]["heldout_docs_over_cap"] = stats[d["source"]].get("heldout_docs_over_cap", 0) + 1
                continue
            kept.append(d)
            total += n
        out[("heldout", domain)] = kept
    for (part, domain), lst in out.items():
        for d in lst:
            st = stats[d["source"]]
            st["%s_docs" % part] = st.get("%s_docs" % part, 0) + 1
            st["%s_bytes" % part] = st.get("%s_bytes" % part, 0) + len(d["text"].encode())
    return out


def write_outputs(parts, args):
    os.makedirs(args.out, exist_ok=True)
    files = {}
    for (part, domain), lst in sorted(parts.items()):
        data = "".join(d["text"] + EOD for d in lst).encode("utf-8")
        base = "%s_%s.txt" % (part, domain)
        entry = {"documents": len(lst), "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        if part == "train":
            path = os.path.join(args.out, base + ".xz")
            comp = lzma.compress(data, preset=6)
            tmp = path + ".tmp"
            with open(tmp, "wb") as f:
                f.write(comp)
            os.replace(tmp, path)
            entry.update({"file": base + ".xz", "xz_bytes": len(comp),
                          "xz_sha256": hashlib.sha256(comp).hexdigest()})
        else:
            path = os.path.join(args.out, base)
            with open(path + ".tmp", "wb") as f:
                f.write(data)
            os.replace(path + ".tmp", path)
            entry["file"] = base
        entry["by_source"] = {}
        for d in lst:
            bs = entry["by_source"].setdefault(d["source"], {"documents": 0, "bytes": 0})
            bs["documents"] += 1
            bs["bytes"] += len(d["text"].encode())
        files[base] = entry
        print("  wrote %-22s %4d docs %10d bytes%s" % (
            entry["file"], len(lst), len(data),
            " (xz %d)" % entry["xz_bytes"] if "xz_bytes" in entry else ""), flush=True)
    return files


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--raw", default="data/raw/pkgs")
    ap.add_argument("--out", default="data/corpus")
    ap.add_argument("--versions", required=True, help="json file {package: version, ...}")
    ap.add_argument("--debs", default="", help="json file {package: {deb, sha256}}")
    ap.add_argument("--seed", type=int, default=20240611)
    ap.add_argument("--heldout-fraction", type=float, default=0.05)
    ap.add_argument("--heldout-cap", type=int, default=1280 * 1024)
    ap.add_argument("--fingerprint", default="")
    args = ap.parse_args()
    with open(args.versions) as f:
        versions = json.load(f)
    debs = {}
    if args.debs:
        with open(args.debs) as f:
            debs = json.load(f)
    print("collecting documents", flush=True)
    docs, stats = collect(args, versions)
    parts = split(docs, stats, args)
    print("writing", args.out, flush=True)
    files = write_outputs(parts, args)
    manifest = {
        "description": "moetier-tiny corpora; rebuilt by scripts/build_corpus.sh",
        "document_separator": EOD,
        "seed": args.seed,
        "heldout_fraction": args.heldout_fraction,
        "heldout_cap_bytes": args.heldout_cap,
        "fingerprint": args.fingerprint,
        "packages": {p: {"version": v, **debs.get(p, {})} for p, v in sorted(versions.items())},
        "sources": {k: {kk: vv for kk, vv in v.items() if not kk.startswith("_")} for k, v in stats.items()},
        "files": files,
    }
    with open(os.path.join(args.out, "manifest.json.tmp"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(os.path.join(args.out, "manifest.json.tmp"), os.path.join(args.out, "manifest.json"))
    print("manifest written", flush=True)


if __name__ == "__main__":
    sys.exit(main())
