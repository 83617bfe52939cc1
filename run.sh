#!/usr/bin/env bash
# The main job: installs what is missing, builds Release, trains a byte-level BPE tokenizer
# of 4,096 ids on Debian's fortunes, prepares the fortunes as token files with it, trains
# gpt-mini on them for a few minutes with data parallelism on 2 local ranks (LOOM_RANKS=N
# for another count), prints the scaling figures, sampled text with the share of its words
# found in the training text, the run's HTML report (`loom report`) and the run directory.
# Extra arguments go to `loom train` (e.g. ./run.sh --training.steps=100).
set -euo pipefail
cd "$(dirname "$0")"
./scripts/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release --target loom
LOOM=build/release/loom
text=/usr/share/games/fortunes
if [ ! -f data/fortunes-bpe/encoder.json ]; then
  $LOOM tokenizer train text:$text --vocab-size 4096 --out data/fortunes-bpe
fi
if [ ! -f data/fortunes_bpe.bin ] || [ data/fortunes-bpe/vocab.bpe -nt data/fortunes_bpe.bin ]; then
  $LOOM data prepare text:$text --tokenizer data/fortunes-bpe --out data/fortunes_bpe.bin
fi
name="gpt-mini-bpe-$(date +%Y%m%d-%H%M%S)"
$LOOM launch -n "${LOOM_RANKS:-2}" -- $LOOM train configs/gpt-mini-bpe.toml --job.name="$name" "$@"
echo
echo "Sampled text:"
$LOOM sample --checkpoint "runs/$name" --tokens 600 --lines 8 --temperature 0.8 | tee "runs/$name/sample.txt"
echo "words found in the training text: $(tools/word_share.sh "runs/$name/sample.txt" $text)"
echo
$LOOM report "runs/$name"
echo "run directory: runs/$name"
