#!/usr/bin/env bash
# The main job speaks words (issue 43, item 2): run.sh's job as run.sh runs it (a BPE of
# 4,096 ids trained on the fortunes, their token files, configs/gpt-mini-bpe.toml on 2
# data-parallel ranks for its 400 steps), then `loom sample` as run.sh calls it, at six
# seeds; at least 70% of the sampled words (whitespace-separated pieces holding a letter)
# must be words of the training text (tools/word_share.sh). Everything goes to a scratch
# directory; the repository's data/ and runs/ are not touched. About 2.5 minutes on 2 cores of
# a Zen 5 (bf16 products in hardware), 6-8.5 on an AVX2-only Zen 3.
# Exit 77 (ctest: skipped) without Debian's fortunes.
# Usage: main_job_words_test.sh LOOM SOURCE_DIR
set -uo pipefail
LOOM=$1 SRC=$2
text=/usr/share/games/fortunes
[ -d $text ] || { echo "SKIPPED: $text is missing (scripts/setup.sh installs fortunes)"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAILED: $*"; exit 1; }
$LOOM tokenizer train text:$text --vocab-size 4096 --out "$tmp/bpe" || fail "tokenizer train"
$LOOM data prepare text:$text --tokenizer "$tmp/bpe" --out "$tmp/fortunes_bpe.bin" || fail "data prepare"
$LOOM launch -n 2 -- $LOOM train "$SRC/configs/gpt-mini-bpe.toml" --quiet --job.run_dir="$tmp/runs" --job.name=main \
  --data.train="$tmp/fortunes_bpe.bin" --data.val="$tmp/fortunes_bpe_val.bin" --data.tokenizer="$tmp/bpe" \
  >"$tmp/train.out" 2>&1 || { cat "$tmp/train.out"; fail "training"; }
grep "val_loss" "$tmp/train.out" | tail -1
for seed in 1 2 3 4 5 6; do
  $LOOM sample --checkpoint "$tmp/runs/main" --tokens 600 --lines 8 --temperature 0.8 --seed $seed >>"$tmp/sample.txt" ||
    fail "sample --seed $seed"
done
cat "$tmp/sample.txt"
share=$("$SRC/tools/word_share.sh" "$tmp/sample.txt" $text 70) || fail "sampled words found in the training text: $share (expected >= 70%)"
echo "ok: sampled words found in the training text: $share"
