#!/usr/bin/env bash
# The main job: installs what is missing, builds Release, prepares Debian's fortunes as a
# byte-level token file, trains gpt-mini on it for a few minutes with data parallelism on
# 2 local ranks (LOOM_RANKS=N for another count), prints the scaling figures, sampled text
# and the run directory. Extra arguments go to `loom train` (e.g. ./run.sh --training.steps=100).
set -euo pipefail
cd "$(dirname "$0")"
./scripts/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release --target loom
LOOM=build/release/loom
if [ ! -f data/fortunes.bin ]; then
  $LOOM data prepare text:/usr/share/games/fortunes --out data/fortunes.bin
fi
name="gpt-mini-$(date +%Y%m%d-%H%M%S)"
$LOOM launch -n "${LOOM_RANKS:-2}" -- $LOOM train configs/gpt-mini.toml --job.name="$name" "$@"
echo
echo "Sampled text:"
$LOOM sample --checkpoint "runs/$name" --tokens 600 --lines 8 --temperature 0.8
echo
echo "run directory: runs/$name"
