#!/usr/bin/env bash
# Weak scaling of data-parallel training: gpt-mini (n_layer 4, d_model 256, seq 256),
# micro-batch 8 per rank (the same per-rank batch at every size), fp32 AdamW, 1 compute
# thread per rank, at 1, 2 and 4 ranks (`loom launch -n N -- loom train`). For each: the
# median step time of steps 4..STEPS (metrics.jsonl), tokens/s, the speedup over 1 rank,
# the scaling efficiency (speedup / N), the efficiency per core used (speedup / min(N,
# cores): above the core count the ranks share cores), and the exposed communication share
# of the step. Usage: bench/dp_scaling.sh [STEPS] [ZERO] [RANKS...]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-13}
zero=${2:-0}
shift $(( $# > 2 ? 2 : $# ))
ranks=("${@:-}")
[ -n "${ranks[0]}" ] || ranks=(1 2 4)
source bench/common.sh
cores=$(nproc)

echo "# weak scaling, gpt-mini, micro-batch 8 x 256 tokens per rank, 1 thread per rank, ZeRO $zero, $cores cores"
printf "%5s %10s %10s %9s %11s %15s %9s\n" ranks step_ms tokens/s speedup efficiency "eff/core used" exposed
base=""
for np in "${ranks[@]}"; do
  $loom launch -n "$np" -- $loom train configs/gpt-mini.toml --quiet --job.run_dir="$work" --job.name="n$np" \
    --job.threads=1 --training.steps="$steps" --training.global_batch=$((8 * np)) --training.micro_batch=8 \
    --training.eval_every=0 --checkpoint.every=0 --parallel.zero="$zero" > "$work/n$np.out"
  line=$(/usr/bin/env python3 - "$work/n$np/metrics.jsonl" "$np" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])][3:]
step = statistics.median(r["step_ms"] for r in rows)
exposed = statistics.median(r["exposed_comm_ms"] / r["step_ms"] for r in rows)
print(f"{step:.1f} {int(sys.argv[2]) * 8 * 256 / (step / 1e3):.0f} {100 * exposed:.1f}")
PY
)
  read -r step tps exposed <<< "$line"
  [ -n "$base" ] || base=$tps
  /usr/bin/env python3 -c "
np, tps, base, cores = $np, $tps, $base, $cores
s = tps / base
print(f'{np:5d} {$step:10.1f} {tps:10.0f} {s:8.2f}x {100 * s / np:10.1f}% {100 * s / min(np, cores):14.1f}% {$exposed:8.1f}%')"
done
