// The reference for Loom's GPT-2 tokenizer: OpenAI's tiktoken "gpt2" encoding (WASM).
//   node encode.js FILE            prints FILE's ids (special tokens allowed), space-separated
//   node encode.js --bench FILE N  encodes FILE N times; prints the best MB/s as JSON
// FILE is read as UTF-8; tests give it valid UTF-8 only (tiktoken takes a JS string).
"use strict";
const fs = require("fs");
const { get_encoding } = require("tiktoken");

const args = process.argv.slice(2);
const bench = args[0] === "--bench";
const file = bench ? args[1] : args[0];
if (!file) {
  process.stderr.write("usage: node encode.js [--bench] FILE [N]\n");
  process.exit(2);
}
const text = fs.readFileSync(file, "utf8");
const enc = get_encoding("gpt2");
if (!bench) {
  process.stdout.write(Array.from(enc.encode(text, "all")).join(" ") + "\n");
} else {
  const reps = Number(args[2] || 3);
  const bytes = Buffer.byteLength(text, "utf8");
  let best = Infinity, ids = 0;
  for (let r = 0; r < reps; ++r) {
    const t0 = process.hrtime.bigint();
    ids = enc.encode(text, "all").length;
    const s = Number(process.hrtime.bigint() - t0) / 1e9;
    best = Math.min(best, s);
  }
  process.stdout.write(JSON.stringify({ bytes, ids, seconds: best, mb_per_s: bytes / best / 1e6 }) + "\n");
}
enc.free();
