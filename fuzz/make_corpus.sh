#!/usr/bin/env bash
# Writes the seed files of the file-format fuzz targets into fuzz/corpus/<target>/, from
# real files Loom writes: a tiny GPT's and a tiny MLP's checkpoints (model, optimizer,
# index.json, state.json, latest), a token file from `loom data prepare`, a trained
# tokenizer, the first images
# of Fashion-MNIST's test set, and the configs under configs/. The seeds are committed; run
# this again (after ./build.sh) when a format changes.
set -euo pipefail
cd "$(dirname "$0")/.."
loom=build/release/loom
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
c=fuzz/corpus
mkdir -p $c/safetensors $c/checkpoint $c/tokens $c/tokenizer $c/manifest $c/doc_index $c/idx $c/config

# Checkpoints: one GPT (vocab 256, width 4) and one MLP (one hidden layer of 2), 2 steps each,
# and the GPT on two tensor-parallel ranks (an index whose tensors have several shards).
# The version 1 seeds (gpt-index, mlp-index, as Loom wrote them before sharded checkpoints)
# stay in the corpus; this writes the version 2 ones beside them.
$loom train configs/gpt-nano.toml --model.n_layer=1 --model.n_head=1 --model.d_model=4 --model.seq_len=4 \
  --training.steps=2 --training.global_batch=2 --training.micro_batch=1 --training.warmup_steps=1 \
  --training.eval_every=0 --checkpoint.every=2 --job.run_dir="$tmp" --job.name=gpt >/dev/null
$loom train configs/mlp.toml --model.n_layer=1 --model.hidden=2 --training.steps=2 --training.global_batch=2 \
  --training.micro_batch=2 --training.warmup_steps=1 --training.eval_every=0 --checkpoint.every=2 \
  --job.run_dir="$tmp" --job.name=mlp >/dev/null
$loom launch -n 2 -- $loom train configs/gpt-nano.toml --model.n_layer=1 --model.n_head=2 --model.d_model=4 \
  --model.seq_len=4 --training.steps=2 --training.global_batch=2 --training.micro_batch=1 --training.warmup_steps=1 \
  --training.eval_every=0 --checkpoint.every=2 --job.run_dir="$tmp" --job.name=gpt-tp2 --parallel.tp=2 >/dev/null
for kind in gpt mlp; do
  step=$tmp/$kind/checkpoints/step_2
  cp "$step/model-00000.safetensors" $c/safetensors/$kind-model
  cp "$step/optimizer-00000.safetensors" $c/safetensors/$kind-optimizer
  cp "$step/index.json" $c/checkpoint/$kind-index-v2
  cp "$step/state.json" $c/checkpoint/$kind-state
done
cp "$tmp/gpt-tp2/checkpoints/step_2/index.json" $c/checkpoint/gpt-tp2-index
cp "$tmp/gpt-tp2/checkpoints/step_2/model-00001.safetensors" $c/safetensors/gpt-tp2-model-1
cp "$tmp/gpt/checkpoints/latest" $c/checkpoint/latest

# Token files: a few lines of text through the byte tokenizer (training and validation parts).
printf 'The quick brown fox jumps over the lazy dog.\nPack my box with five dozen liquor jugs.\n' >"$tmp/text.txt"
$loom data prepare "text:$tmp/text.txt" --out "$tmp/tokens.bin" >/dev/null
cp "$tmp/tokens.bin" $c/tokens/train
cp "$tmp/tokens_val.bin" $c/tokens/val

# Tokenizer: a BPE of 300 ids trained on one fortunes file (mode byte 0: encoder.json, a
# NUL, vocab.bpe), and text with accents, spaces and invalid UTF-8 (mode byte 1).
$loom tokenizer train text:/usr/share/games/fortunes/linux --vocab-size 300 --out "$tmp/tok" >/dev/null
(printf '\x00'; cat "$tmp/tok/encoder.json"; printf '\x00'; cat "$tmp/tok/vocab.bpe") >$c/tokenizer/vocab300
printf '\x01Hello world, it'"'"'s me.\n\xff\xfe caf\xc3\xa9   x' >$c/tokenizer/text
# The same vocabulary as a Hugging Face tokenizer.json (mode byte 2).
python3 - "$tmp/tok" $c/tokenizer/hf300 <<'PY'
import json, sys
enc = json.load(open(sys.argv[1] + "/encoder.json"))
merges = [l for l in open(sys.argv[1] + "/vocab.bpe").read().split("\n") if l and not l.startswith("#version")]
j = {"version": "1.0", "added_tokens": [{"id": enc["<|endoftext|>"], "content": "<|endoftext|>", "special": True}],
     "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False},
     "model": {"type": "BPE", "vocab": enc, "merges": merges}}
open(sys.argv[2], "wb").write(b"\x02" + json.dumps(j).encode())
PY
# Manifests: one of a sharded dataset prepare writes, one naming a remote shard.
$loom data prepare text:/usr/share/games/fortunes/linux --out "$tmp/ds" --shard-tokens 3000 >/dev/null
cp "$tmp/ds/train.json" $c/manifest/fortunes
printf '{"format": "loom-dataset", "version": 1, "shards": [{"url": "https://example.invalid/a.bin", "tokens": 5, "dtype": "uint32", "sha256": "%s"}]}' \
  "$(printf 'a%.0s' $(seq 64))" >$c/manifest/remote
# Document indexes: a shard's 4-byte token count, then its index (fuzz/doc_index_fuzz.cc).
$loom data prepare text:/usr/share/games/fortunes --out "$tmp/dsi" --shard-tokens 1000000 >/dev/null
python3 - "$tmp/dsi" $c/doc_index <<'PY'
import json, struct, sys
m = json.load(open(sys.argv[1] + "/train.json"))
for i, s in enumerate(m["shards"][:3]):
    index = open(sys.argv[1] + "/" + s["path"] + ".idx", "rb").read()
    open(f"{sys.argv[2]}/shard{i}", "wb").write(struct.pack("<I", s["tokens"]) + index)
PY

# IDX: the first 3 test images and labels, gzipped and plain; each seed is a 4-byte
# little-endian image-file length, the image file, then the label file (fuzz/idx_fuzz.cc).
python3 - "$c/idx" <<'PY'
import gzip, struct, sys
src = "/usr/share/datasets/fashion-mnist/t10k-"
images = gzip.open(src + "images-idx3-ubyte.gz").read()
labels = gzip.open(src + "labels-idx1-ubyte.gz").read()
n = 3
img = struct.pack(">IIII", 0x803, n, 28, 28) + images[16:16 + n * 784]
lab = struct.pack(">II", 0x801, n) + labels[8:8 + n]
for name, (a, b) in {"plain": (img, lab), "gzip": (gzip.compress(img, mtime=0), gzip.compress(lab, mtime=0))}.items():
    open(f"{sys.argv[1]}/{name}", "wb").write(struct.pack("<I", len(a)) + a + b)
PY

# Configs: each shipped one, and gpt-nano with flags after a NUL byte (fuzz/config_fuzz.cc).
for f in configs/*.toml; do cp "$f" $c/config/"$(basename "$f" .toml)"; done
{ cat configs/gpt-nano.toml; printf '\0--parallel.pp=2\n--parallel.microbatches=4\n--training.micro_batch=2\n'; } >$c/config/gpt-nano-flags
