#!/usr/bin/env bash
# Pruning (issue 15, item 6): validation loss against sparsity for `loom prune`'s three kinds
# (single weights by magnitude, output channels, attention heads) on gpt-mini trained as the
# main job trains it (configs/gpt-mini.toml, 400 steps on 2 ranks; or CHECKPOINT if given),
# before and after a short fine-tuning run that keeps the zeros (50 steps at the config's
# final learning rate, `--training.keep_zeros=true`; the unpruned model fine-tuned alike is
# the reference at sparsity 0). Prints a table and draws
# docs/pruning.svg (tools/plot_curves.py --xy).
# Usage: bench/prune.sh [CHECKPOINT]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh

base=${1:-}
if [ -z "$base" ]; then
  $loom launch -n 2 -- $loom train configs/gpt-mini.toml --quiet --job.run_dir="$work" --job.name=base \
    --job.threads=1 --training.eval_every=0 > "$work/base.out" 2>&1
  base="$work/base"
fi
val() { $loom eval --checkpoint "$1" --data data/fortunes_val.bin --batch 16 | python3 -c "import json,sys; print(json.load(sys.stdin)['loss'])"; }

echo "kind sparsity val_loss val_loss_after_50_steps_fine_tuning"
for kind in none rows heads; do
  : > "$work/$kind.csv"
  : > "$work/$kind-ft.csv"
  for s in 0 0.25 0.5 0.75 0.9; do
    $loom prune --checkpoint "$base" --sparsity $s --structured $kind --out "$work/p-$kind-$s" > /dev/null
    loss=$(val "$work/p-$kind-$s")
    echo "$s,$loss" >> "$work/$kind.csv"
    # At 0 the fine-tuning is the reference: what 50 more steps give the unpruned model.
    ft="-"
    if [ $s != 0 ] || [ $kind = none ]; then
      $loom launch -n 2 -- $loom train configs/gpt-mini.toml --quiet --job.run_dir="$work" --job.name="ft-$kind-$s" \
        --job.threads=1 --training.eval_every=0 --checkpoint.every=0 --training.steps=50 --training.warmup_steps=0 \
        --training.lr=2e-4 --training.decay=constant --training.keep_zeros=true --init-from "$work/p-$kind-$s" \
        > "$work/ft-$kind-$s.out" 2>&1
      ft=$(val "$work/ft-$kind-$s")
      echo "$s,$ft" >> "$work/$kind-ft.csv"
    fi
    echo "$kind $s $loss $ft"
  done
done
python3 tools/plot_curves.py --xy "sparsity (share of each layer's weights, output channels or heads removed)" \
  "validation loss (nats per byte)" docs/pruning.svg "gpt-mini pruned by magnitude (fortunes)" \
  "weights=$work/none.csv" "output channels=$work/rows.csv" "heads=$work/heads.csv" \
  "weights, fine-tuned 50 steps=$work/none-ft.csv" "output channels, fine-tuned=$work/rows-ft.csv" \
  "heads, fine-tuned=$work/heads-ft.csv"
echo "plot: docs/pruning.svg"
