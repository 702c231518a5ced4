#!/usr/bin/env python3
"""Reference token ids from Hugging Face `tokenizers` for tests/unit/test_tokenizer.cpp.

Usage (from the repo root, with `pip install tokenizers`):
    scripts/fetch_tokenizers.sh
    python3 scripts/tokenizer_refs.py tests/data/external/qwen3/tokenizer.json \
        tests/data/external/deepseek_v3/tokenizer.json [tests/data/fixtures/NAME/tokenizer.json ...]

For each tokenizer.json, writes tests/data/tokenizer_refs/<NAME>.json, NAME being the
name of the directory that holds the tokenizer.json:
    {"tokenizer": NAME, "source": "external" | "fixtures" | "other",
     "sha256": sha256 of tokenizer.json, "tokenizers_version": ..,
     "corpus": {FILE: sha256 of its bytes, ..},
     "cases": [
       {"file": F, "ids": [..], "ids_no_special": [..],
        "decoded": .., "decoded_skip_special": ..},     # the whole file
       {"file": F, "line": K, "ids": [..], "ids_no_special": [..]},   # line K of the file
       {"text": T, "ids": [..], "ids_no_special": [..], "decoded": ..}  # inline edge cases
     ]}
The text of a corpus file is bytes.decode('utf-8', errors='replace'); its lines are
text.split('\n') (line K is that list's K-th item; empty ones are skipped). "ids" come
from Tokenizer.from_file(path).encode(text, add_special_tokens=True), "ids_no_special"
from add_special_tokens=False, "decoded" from decode(ids, skip_special_tokens=False) and
"decoded_skip_special" from decode(ids, skip_special_tokens=True).

`--skeleton OUT.json` writes the cases with their texts but without ids (no `tokenizers`
needed); scripts/tokenizer_refs_js.mjs fills such a skeleton with a JS tokenizer for an
interim cross-check.
"""
import argparse
import hashlib
import json
import os
import random
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Inline edge cases: stored with their text, so the C++ test needs no generator.
EDGE_CASES = [
    "", " ", "  ", "\n", "\n\n", " \n", "\t", "a", "A", "'s", "'S", "'ſ", "x's", "X'S",
    "don't", "DON'T", "  hello", "hello  ", "hello  world", "hello\n\nworld", "a\r\nb",
    "123", "1234", "12345678", "1,234.56", "3.14", "\u00a0x", "x\u3000y", "x\u180ey",
    "x\u2028y", "x\u0085y", "x\ufeffy", "\u200b", "e\u0301", "\u212b", "\uac00\u11a8",
    "\u1100\u1161\u11a8", "<|endoftext|>", "<|endoftext|><|endoftext|>", " <|endoftext|> ",
    "<|im_start|>user\nhi<|im_end|>", "<\uff5cbegin\u2581of\u2581sentence\uff5c>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>x", "<think></think>", "<|im_start",
    "\ufffd", "\ufffd\ufffd", "\U0001f600", "\U0001f468\u200d\U0001f469\u200d\U0001f467",
    "\U0001f1fa\U0001f1f8", "\u4e2d\u6587", "\u3042\u30a2\u6f22", "\uc548\ub155",
    "\u0000", "\u007f", "\u00ad", "a" * 300, " " * 300, "\n" * 50, "ab" * 200,
    "\u4e00" * 100, "1" * 100, "!" * 100, "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa!",
]

# Random strings over a tricky alphabet (fixed seed; stored with their text).
ALPHABET = (
    list("aZsStTlLdDmrevx07' \t\n\r.,!?-_$({\"#\\/@~")
    + ["  ", "   ", "\n\n", "\r\n", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL"]
    + [chr(c) for c in (0x85, 0xA0, 0x1680, 0x180E, 0x2000, 0x2009, 0x200A, 0x200B, 0x2028,
                        0x2029, 0x202F, 0x205F, 0x3000, 0xFEFF, 0x1C, 0x1F, 0x0B, 0x0C, 0x7F,
                        0xE9, 0x301, 0x17F, 0x212A, 0xDF, 0x130, 0x4E2D, 0x6587, 0x3042, 0x30A2,
                        0xAC00, 0x1100, 0x1161, 0x11A8, 0xFF5C, 0xFF01, 0xFF11, 0x0661, 0xB2,
                        0x2163, 0x1F600, 0x1F468, 0x200D, 0x1F1FA, 0xFE0F, 0x20AC, 0xA7, 0x2014,
                        0x201C, 0x3001, 0x3002, 0x0E01, 0x0E31, 0x0915, 0x094D, 0x05D0, 0x0627,
                        0xFFFD, 0x10FFFF, 0xE000, 0x345, 0x1E9E, 0x2126, 0xFB05, 0x2581)]
    + ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>",
       "<\uff5cend\u2581of\u2581sentence\uff5c>", "<\uff5cUser\uff5c>", "<|", "|>"]
)
N_RANDOM = 300


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read())
    return h.hexdigest()


def random_cases():
    rng = random.Random(20240229)
    out = []
    for _ in range(N_RANDOM):
        n = rng.randint(1, 24)
        out.append("".join(rng.choice(ALPHABET) for _ in range(n)))
    return out


def source_of(path):
    rel = os.path.relpath(os.path.abspath(path), REPO).replace(os.sep, "/")
    if rel.startswith("tests/data/external/"):
        return "external"
    if rel.startswith("tests/data/fixtures/"):
        return "fixtures"
    return "other"


def encode_case(tok, text, with_decode):
    ids = tok.encode(text, add_special_tokens=True).ids
    case = {"ids": ids, "ids_no_special": tok.encode(text, add_special_tokens=False).ids}
    if with_decode:
        case["decoded"] = tok.decode(ids, skip_special_tokens=False)
        case["decoded_skip_special"] = tok.decode(ids, skip_special_tokens=True)
    return case


def skeleton(corpus_dir):
    """The corpus digests and the cases with their texts (under "_text"), without ids."""
    files = sorted(f for f in os.listdir(corpus_dir) if f.endswith(".txt"))
    if not files:
        sys.exit(f"tokenizer_refs: no .txt files in {corpus_dir}")
    corpus, cases = {}, []
    for f in files:
        path = os.path.join(corpus_dir, f)
        corpus[f] = sha256_file(path)
        with open(path, "rb") as fh:
            text = fh.read().decode("utf-8", errors="replace")
        cases.append({"file": f, "_text": text, "_decode": True})
        for k, line in enumerate(text.split("\n")):
            if line:
                cases.append({"file": f, "line": k, "_text": line, "_decode": False})
    for text in EDGE_CASES + random_cases():
        cases.append({"text": text, "_text": text, "_decode": True})
    return corpus, cases


def build(tok_path, corpus_dir):
    import tokenizers
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tok_path)
    corpus, skel = skeleton(corpus_dir)
    cases = []
    for c in skel:
        text, with_decode = c.pop("_text"), c.pop("_decode")
        cases.append({**c, **encode_case(tok, text, with_decode)})
    name = os.path.basename(os.path.dirname(os.path.abspath(tok_path)))
    return name, {
        "tokenizer": name,
        "source": source_of(tok_path),
        "sha256": sha256_file(tok_path),
        "tokenizers_version": tokenizers.__version__,
        "corpus": corpus,
        "cases": cases,
    }


def write(ref, out_path):
    # One case per line: small diffs when a reference changes.
    head = {k: v for k, v in ref.items() if k != "cases"}
    text = json.dumps(head, ensure_ascii=False, indent=1)[:-2]
    text += ',\n "cases": [\n'
    text += ",\n".join(json.dumps(c, ensure_ascii=False) for c in ref["cases"])
    text += "\n ]\n}\n"
    json.loads(text)  # self-check
    with open(out_path + ".tmp", "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(out_path + ".tmp", out_path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("tokenizers", nargs="*", help="paths of tokenizer.json files")
    ap.add_argument("--skeleton", help="write the cases without ids to this file and exit")
    ap.add_argument("--corpus", default=os.path.join(REPO, "tests/data/tokenizer_corpus"))
    ap.add_argument("--out", default=os.path.join(REPO, "tests/data/tokenizer_refs"))
    args = ap.parse_args()
    if args.skeleton:
        corpus, cases = skeleton(args.corpus)
        with open(args.skeleton, "w", encoding="utf-8") as f:
            json.dump({"corpus": corpus, "cases": cases}, f, ensure_ascii=False)
        return
    if not args.tokenizers:
        ap.error("give at least one tokenizer.json")
    os.makedirs(args.out, exist_ok=True)
    for path in args.tokenizers:
        if not os.path.isfile(path):
            sys.exit(f"tokenizer_refs: {path}: no such file (run scripts/fetch_tokenizers.sh?)")
        name, ref = build(path, args.corpus)
        out_path = os.path.join(args.out, f"{name}.json")
        write(ref, out_path)
        print(f"tokenizer_refs: {out_path}: {len(ref['cases'])} cases, "
              f"{os.path.getsize(out_path)} bytes")


if __name__ == "__main__":
    main()
