#!/usr/bin/env bash
# Per-rank memory of each ZeRO stage at NP ranks (default 4): a GPT large enough that model
# state dominates (n_layer 8, d_model 512: 25.4M parameters, 16P = 406 MB) with small
# activations (micro-batch 1 x 64 tokens), 4 MiB units, a few steps per stage. Prints, from rank 0's last
# metrics line, the resident model state after the step (parameters + gradients + optimizer,
# measured with mincore) against docs/parallelism.md's formula, and the process's peak RSS
# (mem_peak_mb: everything, including activations, the shared-memory transport and the
# start, when every rank still builds the full model before it is sharded).
# Usage: bench/zero_memory.sh [NP] [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
np=${1:-4}
steps=${2:-4}
source bench/common.sh

printf "%-6s %12s %12s %12s %12s %14s %10s %12s\n" stage params_MiB grads_MiB optim_MiB state_MiB formula_MiB "state/P" peak_rss_MiB
for zero in 0 1 2 3; do
  $loom launch -n "$np" -- $loom train configs/gpt-mini.toml --quiet --job.run_dir="$work" --job.name="z$zero" \
    --job.threads=1 --model.n_layer=8 --model.d_model=512 --model.n_head=8 --model.seq_len=64 \
    --training.steps="$steps" --training.global_batch="$np" --training.micro_batch=1 \
    --training.eval_every=0 --checkpoint.every=0 --parallel.bucket_mb=4 --parallel.zero=$zero > "$work/z$zero.out"
  /usr/bin/env python3 - "$work/z$zero/metrics.jsonl" "$zero" "$np" <<'PY'
import json, sys
row = [json.loads(l) for l in open(sys.argv[1])][-1]
zero, n = int(sys.argv[2]), int(sys.argv[3])
p = (8 * 12 * 512 * 512 + 8 * 13 * 512 + 256 * 512 + 64 * 512 + 2 * 512) / 2**20  # parameters, in Mi
per_p = {0: 16, 1: 8 + 8 / n, 2: 4 + 12 / n, 3: 16 / n}[zero]
state = row["mem_params_mb"] + row["mem_grads_mb"] + row["mem_optimizer_mb"]
print(f"{zero:<6} {row['mem_params_mb']:12.1f} {row['mem_grads_mb']:12.1f} {row['mem_optimizer_mb']:12.1f} "
      f"{state:12.1f} {per_p * p:14.1f} {state / p:10.2f} {row['mem_peak_mb']:12.1f}")
PY
done
