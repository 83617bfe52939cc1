#!/usr/bin/env bash
# The largest GPT each layout trains inside a per-rank memory budget ([job] mem_limit_mb,
# enforced by loom train after every step): width 512 (n_head 8, vocab 256 bytes, seq 256),
# micro-batch 1, 2 ranks, two steps each. For dp 2 (each rank holds the whole model), pp 2
# (each rank half the blocks) and tp 2 (each rank half of every block's matrices and of the
# vocabulary; also with sequence parallelism, which splits the rest of the activations) it
# doubles n_layer until a run is stopped, then bisects;
# printed: the largest n_layer that trained, its parameters, and rank 0's peak memory.
# Usage: bench/largest_model.sh [LIMIT_MB]
set -euo pipefail
cd "$(dirname "$0")/.."
limit=${1:-1200}
source bench/common.sh

fits() {  # LAYOUT_FLAGS N_LAYER: 0 when two steps train within the limit
  local name="r$RANDOM$RANDOM"
  $loom launch -n 2 -- $loom train configs/gpt-mini.toml --quiet --job.run_dir="$work" --job.name="$name" --job.threads=1 \
    --model.preset=gpt --model.n_layer="$2" --model.d_model=512 --model.n_head=8 --model.vocab_size=256 --model.seq_len=256 \
    --training.steps=2 --training.global_batch=2 --training.micro_batch=1 --training.eval_every=0 --checkpoint.every=0 \
    --job.mem_limit_mb="$limit" $1 > "$work/$name.out" 2>&1 && peak=$(python3 -c "
import json; print(round(max(json.loads(l)['mem_peak_mb'] for l in open('$work/$name/metrics.jsonl'))))")
}

echo "# largest GPT (d_model 512) that trains inside job.mem_limit_mb = $limit MiB per rank, 2 ranks, $(nproc) cores"
printf "%-8s %8s %12s %16s\n" layout n_layer parameters "rank 0 peak MiB"
for layout in "dp2:--parallel.pp=1" "pp2:--parallel.pp=2 --training.global_batch=2" "tp2:--parallel.tp=2" \
              "tp2sp:--parallel.tp=2 --parallel.sequence_parallel=true"; do
  name=${layout%%:*} flags=${layout#*:}
  lo=0 hi=2 best_peak=0
  while fits "$flags" "$hi"; do lo=$hi best_peak=$peak; hi=$((hi * 2)); done
  while [ $((hi - lo)) -gt 2 ]; do  # n_layer even, so pp 2 splits it
    mid=$(( (lo + hi) / 4 * 2 ))
    if fits "$flags" "$mid"; then lo=$mid best_peak=$peak; else hi=$mid; fi
  done
  params=$(python3 -c "print(f'{$lo * (12 * 512 * 512 + 13 * 512) + 256 * 512 + 256 * 512 + 2 * 512:,}')")
  printf "%-8s %8d %12s %16s\n" "$name" "$lo" "$params" "$best_peak"
done
