#!/usr/bin/env bash
# The replicas' gradient all-reduce under pipeline stages (issue 41, item 2): gpt-mini
# (n_layer 4, d_model 256, seq 256) on dp 2 x pp 2 = 4 ranks, 1 compute thread each, global
# batch 16 (4 micro-batches of 2 per replica), 1 MiB buckets (a stage of gpt-mini is 6 MiB:
# the default 25 MiB would make it one unit, which starts only when all of it is final),
# for each schedule, on rank 0 (stage 0, the last to finish its backward): the median over steps
# 4..STEPS of the step, the dp communication (comm_ms) and the part of it the training
# thread waited for (exposed_comm_ms). Each stage's sums start as its last backward piece
# computes each block's gradients, instead of after the whole pipeline. With LOOM_BEFORE set
# to another build's loom binary, the same runs of that binary follow, for a side-by-side.
# Usage: bench/pp_dp_overlap.sh [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-12}
source bench/common.sh

run() {  # BINARY NAME FLAGS...
  local bin=$1 name=$2
  shift 2
  $bin launch -n 4 -- $bin train configs/gpt-mini.toml --quiet --job.run_dir="$work" --job.name="$name" \
    --job.threads=1 --training.steps="$steps" --training.global_batch=16 --training.micro_batch=2 \
    --training.eval_every=0 --checkpoint.every=0 --parallel.dp=2 --parallel.pp=2 --parallel.bucket_mb=1 "$@" > "$work/$name.out"
  /usr/bin/env python3 - "$work/$name/metrics.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])][3:]
med = lambda k: statistics.median(r[k] for r in rows)
print(f"{med('step_ms'):.1f} {med('comm_ms'):.1f} {med('exposed_comm_ms'):.1f} "
      f"{100 * statistics.median(r['exposed_comm_ms'] / r['step_ms'] for r in rows):.1f}")
PY
}

echo "# gpt-mini, dp 2 x pp 2 = 4 ranks, global batch 16 x 256 tokens, 1 thread per rank, $(nproc) cores"
printf "%-8s %-22s %10s %10s %12s %9s\n" build schedule step_ms dp_comm_ms dp_exposed_ms exposed
for build in this ${LOOM_BEFORE:+before}; do
  bin=$loom
  [ "$build" = before ] && bin=$LOOM_BEFORE
  for sched in 1f1b "interleaved --parallel.virtual_stages=2" zb-h1; do
    read -r step comm exposed share <<< "$(run "$bin" "$build-${sched%% *}" --parallel.pp_schedule=$sched)"
    printf "%-8s %-22s %10s %10s %12s %8s%%\n" "$build" "${sched%% *}" "$step" "$comm" "$exposed" "$share"
  done
done
