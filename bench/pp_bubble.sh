#!/usr/bin/env bash
# Measured against simulated pipeline bubble for every schedule at p = 2 and 4 stages and
# m = 4, 8 and 16 micro-batches (issue 13, items 4 and 9b): gpt-mini widened to 8 blocks (so
# that 4 stages x 2 virtual stages divide it), global batch 16 sequences (micro-batch 16 / m),
# 1 compute thread per rank, `loom launch -n p`. For each run: the median over steps
# 4..STEPS of the executor's measured bubble (pp_bubble), of the simulator's prediction on
# the same action lists from that step's measured per-stage mean costs (pp_bubble_predicted)
# and of its replay of that step's own action times (pp_bubble_replayed), each prediction's
# relative difference from the measurement, and the closed form for uniform stages and free
# transfers.
# p = 4 puts 4 ranks on this machine's cores: on fewer than 4 cores they share them.
# Usage: bench/pp_bubble.sh [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-20}
source bench/common.sh

echo "# gpt-mini with 8 blocks, global batch 16 x 256 tokens, 1 thread per rank, $(nproc) cores"
printf "%-3s %-3s %-16s %9s %10s %11s %9s %10s %9s %9s\n" p m schedule step_ms bubble predicted rel_diff replayed rel_diff closed
for p in 2 4; do
  for m in 4 8 16; do
    for sched in gpipe 1f1b zb-h1 interleaved; do
      flags=(--parallel.pp=$p --parallel.pp_schedule=$sched --training.micro_batch=$((16 / m)) --model.n_layer=8)
      plan=(--pp $p --microbatches $m --schedule $sched)
      if [ $sched = interleaved ]; then flags+=(--parallel.virtual_stages=2); plan+=(--virtual-stages 2); fi
      name=p$p-m$m-$sched
      gpt_mini_run "$name" $p "${flags[@]}"
      closed=$($loom plan "${plan[@]}" | sed -n 's/.*closed form[^:]*: \([0-9.]*\)%.*/\1/p')
      /usr/bin/env python3 - "$work/$name/metrics.jsonl" $p $m $sched "$closed" <<'PY'
import json, statistics, sys
path, p, m, sched, closed = sys.argv[1:]
rows = [json.loads(l) for l in open(path)][3:]
step = statistics.median(r["step_ms"] for r in rows)
bubble = statistics.median(r["pp_bubble"] for r in rows)
predicted = statistics.median(r["pp_bubble_predicted"] for r in rows)
replayed = statistics.median(r["pp_bubble_replayed"] for r in rows)
rel = lambda x: abs(bubble - x) / bubble if bubble > 0 else 0
print(f"{p:<3} {m:<3} {sched:<16} {step:9.1f} {100 * bubble:9.1f}% {100 * predicted:10.1f}% {100 * rel(predicted):8.0f}% "
      f"{100 * replayed:9.1f}% {100 * rel(replayed):8.0f}% {closed:>8}%")
PY
    done
  done
done
