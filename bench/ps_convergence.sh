#!/usr/bin/env bash
# Parameter servers (issue 16, item 5): do async and ssp training reach what sync training
# reaches? gpt-mini (seq_len 64, global batch 16, 400 steps) on fortunes and the Fashion-MNIST
# MLP (configs/mlp.toml: 1400 steps of 128 images), each on 1 server and 2 workers in the
# three modes; prints each run's final validation loss (and the MLP's test accuracy) and its
# difference from sync, and draws the training-loss curves into docs/ps_convergence_gpt.svg
# and docs/ps_convergence_mlp.svg (tools/plot_curves.py).
# Usage: bench/ps_convergence.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh

run() {  # NAME CONFIG MODE FLAGS...
  local name=$1 config=$2 mode=$3
  shift 3
  local flags="--parallel.ps_servers=1 --parallel.ps_mode=$mode"
  [ "$mode" = ssp ] && flags="$flags --parallel.ps_staleness=2"
  $loom launch -n 3 -- $loom train "$config" --quiet --job.run_dir="$work" --job.name="$name" --job.threads=1 \
    --checkpoint.every=0 --training.eval_every=0 $flags "$@" > "$work/$name.out" 2>&1
}

for mode in sync async ssp; do
  run "gpt-$mode" configs/gpt-mini.toml $mode --model.seq_len=64 --training.steps=400 --training.micro_batch=8
  run "mlp-$mode" configs/mlp.toml $mode --training.micro_batch=64
done

python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
def final(name):
    row = [json.loads(l) for l in open(f"{work}/{name}/metrics.jsonl") if "final_val_loss" in l][-1]
    return row["final_val_loss"], row.get("final_val_accuracy")
for model in ("gpt", "mlp"):
    base = final(f"{model}-sync")
    for mode in ("sync", "async", "ssp"):
        loss, acc = final(f"{model}-{mode}")
        extra = f", test accuracy {acc:.4f} ({acc - base[1]:+.4f})" if acc is not None else ""
        print(f"{model} {mode:5}: validation loss {loss:.4f} ({(loss - base[0]) / base[0] * 100:+.2f}% of sync){extra}")
PY
python3 tools/plot_curves.py docs/ps_convergence_gpt.svg "gpt-mini on fortunes: 1 server, 2 workers" \
  "sync=$work/gpt-sync/metrics.jsonl" "async=$work/gpt-async/metrics.jsonl" "ssp (K=2)=$work/gpt-ssp/metrics.jsonl"
python3 tools/plot_curves.py docs/ps_convergence_mlp.svg "MLP on Fashion-MNIST: 1 server, 2 workers" \
  "sync=$work/mlp-sync/metrics.jsonl" "async=$work/mlp-async/metrics.jsonl" "ssp (K=2)=$work/mlp-ssp/metrics.jsonl"
echo "plots: docs/ps_convergence_gpt.svg docs/ps_convergence_mlp.svg"
