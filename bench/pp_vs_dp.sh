#!/usr/bin/env bash
# Pipeline vs data parallelism on this machine: gpt-mini (n_layer 4, d_model 256, seq 256),
# global batch 16 sequences per step, fp32 AdamW, 1 compute thread per rank, 2 ranks
# (`loom launch -n 2 -- loom train`): dp = 2 (micro-batch 8, one per rank) against pp = 2
# with each schedule at micro-batch 2 (8 micro-batches through the pipeline), and one rank
# alone. For each: the median step time of steps 4..STEPS (metrics.jsonl), tokens/s, the
# ratio to dp = 2, the measured pipeline bubble (pp_bubble) beside the simulator's prediction
# from the stages' measured per-action costs (pp_bubble_predicted) and the closed form for
# uniform stages, and the exposed gradient communication share (dp).
# Usage: bench/pp_vs_dp.sh [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-13}
source bench/common.sh

run() {  # NAME RANKS FLAGS...
  local name=$1
  gpt_mini_run "$@"
  /usr/bin/env python3 - "$work/$name/metrics.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])][3:]
step = statistics.median(r["step_ms"] for r in rows)
bubble = statistics.median(r.get("pp_bubble", 0) for r in rows)
predicted = statistics.median(r.get("pp_bubble_predicted", 0) for r in rows)
exposed = statistics.median(r["exposed_comm_ms"] / r["step_ms"] for r in rows)
print(f"{step:.1f} {16 * 256 / (step / 1e3):.0f} {100 * bubble:.1f} {100 * predicted:.1f} {100 * exposed:.1f}")
PY
}

echo "# gpt-mini, global batch 16 x 256 tokens, 1 thread per rank, $(nproc) cores"
printf "%-26s %10s %10s %9s %9s %10s %9s %9s\n" layout step_ms tokens/s vs_dp2 bubble predicted closed exposed
read -r dstep dtps _ _ dexp <<< "$(run dp2 2 --training.micro_batch=8)"
read -r ostep otps _ _ _ <<< "$(run one 1 --training.micro_batch=8)"
printf "%-26s %10.1f %10.0f %8.2fx %9s %10s %9s %8.1f%%\n" "1 rank" "$ostep" "$otps" "$(python3 -c "print($otps/$dtps)")" - - - 0
printf "%-26s %10.1f %10.0f %8.2fx %9s %10s %9s %8.1f%%\n" "dp 2" "$dstep" "$dtps" 1 - - - "$dexp"
for sched in gpipe 1f1b zb-h1; do
  read -r step tps bubble predicted _ <<< "$(run "pp-$sched" 2 --parallel.pp=2 --parallel.pp_schedule=$sched --training.micro_batch=2)"
  closed=$($loom plan --pp 2 --microbatches 8 --schedule "$sched" | sed -n 's/.*closed form[^:]*: \([0-9.]*\)%.*/\1/p')
  printf "%-26s %10.1f %10.0f %8.2fx %8.1f%% %9.1f%% %8.1f%% %9s\n" "pp 2 $sched (8 x 2 seq)" "$step" "$tps" \
    "$(python3 -c "print($tps/$dtps)")" "$bubble" "$predicted" "$closed" -
done
read -r step tps bubble predicted _ <<< "$(run pp-il 2 --parallel.pp=2 --parallel.pp_schedule=interleaved --parallel.virtual_stages=2 --training.micro_batch=2)"
closed=$($loom plan --pp 2 --microbatches 8 --schedule interleaved --virtual-stages 2 | sed -n 's/.*closed form[^:]*: \([0-9.]*\)%.*/\1/p')
printf "%-26s %10.1f %10.0f %8.2fx %8.1f%% %9.1f%% %8.1f%% %9s\n" "pp 2 interleaved v2" "$step" "$tps" \
  "$(python3 -c "print($tps/$dtps)")" "$bubble" "$predicted" "$closed" -
