#!/usr/bin/env bash
# Data-parallel training throughput, Loom vs PyTorch DDP (gloo), side by side in one run:
# gpt-mini (n_layer 4, n_head 4, d_model 256, seq 256, vocab 256), micro-batch 8 per rank,
# fp32 AdamW, NP processes x 1 thread each (bench/peers/torch_gpt.py --ddp NP). Loom's
# figure is the median step time of steps 4..N of `loom launch -n NP -- loom train`
# (metrics.jsonl), PyTorch's the median of its timed steps; tokens/s = NP x 8 x 256 / step.
# Also prints Loom's exposed communication share, and how much of it was waiting for the
# slowest rank's compute (the median over steps of the slowest's compute less rank 0's).
# Usage: bench/dp_vs_ddp.sh [NP] [STEPS]
# PYTHON: the peer's interpreter (default /usr/bin/python3, Debian's torch). TRACE=STEPS (as
# profile.trace_steps, e.g. 8-9) also writes Loom's merged trace of those steps, every rank,
# to TRACE_OUT (default dp_trace.json): where each rank's step and gradient buckets went.
# BIND=1 launches Loom's ranks with `loom launch --bind cores` (each on its own cores);
# SKIP_PEER=1 leaves PyTorch out (a second Loom run beside one that had it). LOOM_ARGS: more
# `loom train` flags (e.g. --parallel.bucket_mb=2, gradient units that overlap backward).
set -euo pipefail
cd "$(dirname "$0")/.."
np=${1:-2}
steps=${2:-13}

source bench/common.sh

$loom launch -n "$np" ${BIND:+--bind cores} -- $loom train configs/gpt-mini.toml --quiet --job.run_dir="$work" \
  --job.name=dp --job.threads=1 --training.steps="$steps" --training.global_batch=$((8 * np)) --training.micro_batch=8 \
  --training.eval_every=0 --checkpoint.every=0 ${TRACE:+--profile.trace_steps="$TRACE"} ${LOOM_ARGS:-} > "$work/loom.out"
[ -z "${TRACE:-}" ] || cp "$work/dp/trace.json" "${TRACE_OUT:-dp_trace.json}"
loom_line=$(/usr/bin/env python3 - "$work/dp/metrics.jsonl" "$np" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])][3:]
step = statistics.median(r["step_ms"] for r in rows)
exposed = statistics.median(r["exposed_comm_ms"] for r in rows)
comm = statistics.median(r["comm_ms"] for r in rows)
# Of rank 0's waits, as much as the slowest rank's compute exceeded rank 0's is waiting for
# that rank; the rest is the communication itself (docs/formats.md, compute_ms).
behind = statistics.median(min(r["exposed_comm_ms"], max(r["compute_ms"]) - r["compute_ms"][0]) for r in rows)
tps = int(sys.argv[2]) * 8 * 256 / (step / 1e3)
print(f"{tps:.0f} {step:.1f} {comm:.1f} {exposed:.1f} {100 * exposed / step:.1f} {behind:.1f}")
PY
)
read -r loom_tps loom_step loom_comm loom_exposed loom_share loom_behind <<< "$loom_line"
echo "loom   ${np}x1${BIND:+ bound to cores}${LOOM_ARGS:+ $LOOM_ARGS}: ${loom_tps} tokens/s, step ${loom_step} ms, comm ${loom_comm} ms, exposed ${loom_exposed} ms" \
  "(${loom_share}% of the step; of it, waiting for the slowest rank's compute ${loom_behind} ms)"
[ -z "${SKIP_PEER:-}" ] || exit 0
torch_out=$(OPENBLAS_NUM_THREADS=1 "${PYTHON:-/usr/bin/python3}" bench/peers/torch_gpt.py --ddp "$np" --steps $((steps - 3)) --warmup 3)
echo "$torch_out"
torch_tps=$(echo "$torch_out" | sed -n 's/.*tokens_per_s=\([0-9]*\).*/\1/p')
printf "ratio Loom/PyTorch DDP, %s x 1 thread: %.2fx\n" "$np" "$(echo "$loom_tps / $torch_tps" | bc -l)"
