#!/usr/bin/env python3
"""Train moetier-tiny's tokenizer and pre-tokenize the corpus (HF tokenizers + numpy).

Byte-level BPE, 8192 ids, the Qwen2 pre-tokenizer: NFC normalizer, then Split on the
Qwen2 regex (Isolated), then ByteLevel(use_regex=False); ByteLevel decoder. Special
tokens: <|endoftext|> (id 0, end of document and eos) and <|pad|> (id 1). Trained on the
training files only (a fixed, balanced prefix of their documents), so it is deterministic.

Writes
  OUT/tokenizer.json, OUT/tokenizer_config.json             (OUT = models/moetier-tiny)
  TOKENS/{train,heldout}_{code,prose}.npy  uint16 ids, each document followed by id 0
  TOKENS/tokens.json                        counts and bytes per token
  FIXTURES/eval_{code,prose}.txt            the held-out text that the eval windows cover
  FIXTURES/eval_ids.json                    its ids (what moetier's tokenizer must reproduce)

The eval text of a domain is the shortest prefix of whole held-out documents whose ids
cover `windows * seq_len` tokens; window w is ids[w*seq_len:(w+1)*seq_len].
"""

import argparse
import hashlib
import json
import lzma
import os
import sys
import time

import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

EOD = "<|endoftext|>"
PAD = "<|pad|>"
# Qwen2's pre-tokenizer pattern (tokenizer.json of Qwen2/Qwen2.5/Qwen3).
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PARTS = ("train_code", "train_prose", "heldout_code", "heldout_prose")


def log(msg):
    print("[tokenizer %7.1fs] %s" % (time.time() - T0, msg), flush=True)


def read_part(corpus, name, manifest):
    """Text of data/corpus/NAME.txt or NAME.txt.xz, checked against manifest.json."""
    plain = os.path.join(corpus, name + ".txt")
    if os.path.exists(plain):
        with open(plain, "rb") as f:
            data = f.read()
    else:
        with open(plain + ".xz", "rb") as f:
            data = lzma.decompress(f.read())
    want = manifest["files"][name + ".txt"]["sha256"]
    got = hashlib.sha256(data).hexdigest()
    if got != want:
        sys.exit("corpus %s: sha256 %s does not match manifest.json (%s); rebuild it" % (name, got, want))
    docs = data.decode("utf-8").split(EOD)
    if docs[-1] != "":
        sys.exit("corpus %s: does not end with %s" % (name, EOD))
    return docs[:-1]


def build_tokenizer():
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    return tok


def sample_docs(docs, budget):
    out, total = [], 0
    for d in docs:
        if total >= budget:
            break
        out.append(d)
        total += len(d.encode("utf-8"))
    return out


def encode_docs(tok, docs, eod_id, chunk=512):
    """uint16 ids of the documents, each followed by eod_id; plus per-document lengths."""
    enc = getattr(tok, "encode_batch_fast", None) or tok.encode_batch
    pieces, lengths = [], []
    for i in range(0, len(docs), chunk):
        for e in enc(docs[i:i + chunk], add_special_tokens=False):
            ids = e.ids
            lengths.append(len(ids) + 1)
            pieces.append(np.asarray(ids + [eod_id], dtype=np.uint16))
    return (np.concatenate(pieces) if pieces else np.zeros(0, np.uint16)), lengths


def write_eval_fixture(tok, name, docs, ids, lengths, need, fixtures):
    """The shortest document prefix with >= need ids. Its ids are the whole text's encoding,
    which must equal the per-document encoding that training used (checked, warned)."""
    n_docs, total = 0, 0
    while total < need:
        if n_docs >= len(docs):
            sys.exit("held-out %s has only %d tokens, %d needed" % (name, total, need))
        total += lengths[n_docs]
        n_docs += 1
    text = "".join(d + EOD for d in docs[:n_docs])
    per_doc = ids[:total].tolist()
    whole = tok.encode(text, add_special_tokens=False).ids
    if whole != per_doc:
        first = next((i for i, (a, b) in enumerate(zip(whole, per_doc)) if a != b), min(len(whole), len(per_doc)))
        log("WARNING eval text %s: whole-text encoding differs from per-document encoding at id %d "
            "(%d vs %d ids); the fixture keeps the whole-text ids" % (name, first, len(whole), len(per_doc)))
    if tok.decode(whole, skip_special_tokens=False) != text:
        log("WARNING eval text %s: decode(encode(text)) != text" % name)
    domain = name.split("_", 1)[1]
    path = os.path.join(fixtures, "eval_%s.txt" % domain)
    with open(path, "wb") as f:
        f.write(text.encode("utf-8"))
    log("eval fixture %s: %d documents, %d bytes, %d ids" % (path, n_docs, len(text.encode()), len(whole)))
    return domain, {"file": os.path.basename(path), "documents": n_docs, "bytes": len(text.encode()),
                    "sha256": hashlib.sha256(text.encode()).hexdigest(), "ids": whole}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default="data/corpus")
    ap.add_argument("--out", default="models/moetier-tiny")
    ap.add_argument("--tokens", default="data/tokens")
    ap.add_argument("--fixtures", default="tests/data/moetier-tiny")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--sample-mib", type=float, default=24.0, help="training text per domain")
    ap.add_argument("--encode-mib", type=float, default=0.0, help="cap on train text encoded (0: all)")
    ap.add_argument("--windows", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=512)
    args = ap.parse_args()

    with open(os.path.join(args.corpus, "manifest.json")) as f:
        manifest = json.load(f)
    docs = {}
    for name in PARTS:
        docs[name] = read_part(args.corpus, name, manifest)
        log("read %s: %d documents" % (name, len(docs[name])))

    tok = build_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=args.vocab, min_frequency=2, show_progress=False,
        special_tokens=[EOD, PAD], initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    budget = int(args.sample_mib * (1 << 20))
    sample = sample_docs(docs["train_code"], budget) + sample_docs(docs["train_prose"], budget)
    log("training BPE on %d documents (%.1f MiB)" % (len(sample), sum(len(d.encode()) for d in sample) / 2**20))
    tok.train_from_iterator(sample, trainer=trainer, length=len(sample))
    eod_id, pad_id = tok.token_to_id(EOD), tok.token_to_id(PAD)
    if (eod_id, pad_id) != (0, 1) or tok.get_vocab_size() != args.vocab:
        log("WARNING: expected ids 0, 1 for the special tokens and %d ids in all" % args.vocab)
    log("vocab %d, %s=%d, %s=%d" % (tok.get_vocab_size(), EOD, eod_id, PAD, pad_id))

    os.makedirs(args.out, exist_ok=True)
    tok.save(os.path.join(args.out, "tokenizer.json"), pretty=False)
    tok = Tokenizer.from_file(os.path.join(args.out, "tokenizer.json"))  # encode with what is saved
    with open(os.path.join(args.out, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOD, "pad_token": PAD,
                   "bos_token": None, "unk_token": None, "add_bos_token": False, "add_eos_token": False,
                   "clean_up_tokenization_spaces": False, "model_max_length": args.seq_len}, f, indent=2)
        f.write("\n")

    os.makedirs(args.tokens, exist_ok=True)
    os.makedirs(args.fixtures, exist_ok=True)
    stats, fixtures = {}, {}
    for name in PARTS:
        part = docs[name]
        if args.encode_mib > 0 and name.startswith("train"):
            part = sample_docs(part, int(args.encode_mib * (1 << 20)))
        ids, lengths = encode_docs(tok, part, eod_id)
        np.save(os.path.join(args.tokens, name + ".npy"), ids)
        nbytes = sum(len(d.encode()) for d in part)
        stats[name] = {"documents": len(part), "bytes": nbytes, "tokens": int(ids.size),
                       "bytes_per_token": round(nbytes / max(1, ids.size), 4)}
        log("encoded %s: %d tokens, %.3f bytes/token" % (name, ids.size, stats[name]["bytes_per_token"]))
        if name.startswith("heldout"):
            bad = sum(1 for d in part if tok.decode(tok.encode(d, add_special_tokens=False).ids) != d)
            log("%s: %d of %d documents do not survive encode/decode%s" % (
                name, bad, len(part), " (WARNING)" if bad else ""))
            domain, fx = write_eval_fixture(tok, name, part, ids, lengths, args.windows * args.seq_len,
                                            args.fixtures)
            fixtures[domain] = fx
    with open(os.path.join(args.tokens, "tokens.json"), "w") as f:
        json.dump({"vocab_size": args.vocab, "eod_id": eod_id, "pad_id": pad_id, "parts": stats}, f, indent=1)
    with open(os.path.join(args.fixtures, "eval_ids.json"), "w") as f:
        json.dump({"tokenizer": os.path.join(args.out, "tokenizer.json"), "seq_len": args.seq_len,
                   "windows": args.windows, "corpora": fixtures}, f, separators=(",", ":"))
        f.write("\n")
    log("done")


if __name__ == "__main__":
    T0 = time.time()
    main()
