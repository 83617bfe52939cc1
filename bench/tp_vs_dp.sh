#!/usr/bin/env bash
# Tensor vs data parallelism on this machine: gpt-mini (n_layer 4, n_head 4, d_model 256,
# seq 256), global batch 16 sequences per step, micro-batch 8, fp32 AdamW, 1 compute thread
# per rank, 2 ranks (`loom launch -n 2 -- loom train`): dp = 2 against tp = 2, and one rank
# alone. For each: the median step time of steps 4..STEPS (metrics.jsonl), tokens/s, the
# ratio to dp = 2 (tp = 2 also with sequence parallelism), the tensor-parallel collectives' share of the step (tp_comm_ms) and the
# part of it the training thread waited for (tp_exposed_comm_ms: forward's all, backward's
# what the weight gradients did not hide), and the exposed gradient communication share.
# Usage: bench/tp_vs_dp.sh [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-13}
source bench/common.sh

run() {  # NAME RANKS FLAGS...
  local name=$1
  gpt_mini_run "$@" --training.micro_batch=8
  /usr/bin/env python3 - "$work/$name/metrics.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])][3:]
step = statistics.median(r["step_ms"] for r in rows)
tp = statistics.median(r.get("tp_comm_ms", 0) / r["step_ms"] for r in rows)
tp_exposed = statistics.median(r.get("tp_exposed_comm_ms", 0) / r["step_ms"] for r in rows)
calls = statistics.median(r.get("tp_comm_calls", 0) for r in rows)
exposed = statistics.median(r["exposed_comm_ms"] / r["step_ms"] for r in rows)
print(f"{step:.1f} {16 * 256 / (step / 1e3):.0f} {100 * tp:.1f} {100 * tp_exposed:.1f} {calls:.0f} {100 * exposed:.1f}")
PY
}

echo "# gpt-mini, global batch 16 x 256 tokens, micro-batch 8, 1 thread per rank, $(nproc) cores"
printf "%-10s %10s %10s %9s %9s %11s %9s %12s\n" layout step_ms tokens/s vs_dp2 tp_comm tp_exposed tp_calls dp_exposed
read -r dstep dtps _ _ _ dexp <<< "$(run dp2 2 --parallel.dp=2)"
read -r ostep otps _ _ _ _ <<< "$(run one 1)"
read -r tstep ttps ttp ttpx tcalls texp <<< "$(run tp2 2 --parallel.tp=2)"
read -r sstep stps stp stpx scalls sexp <<< "$(run tp2sp 2 --parallel.tp=2 --parallel.sequence_parallel=true)"
ratio() { python3 -c "print(f'{$1/$dtps:.2f}')"; }
printf "%-10s %10.1f %10.0f %8sx %9s %11s %9s %11s\n" "1 rank" "$ostep" "$otps" "$(ratio "$otps")" - - - -
printf "%-10s %10.1f %10.0f %8sx %9s %11s %9s %10.1f%%\n" "dp 2" "$dstep" "$dtps" 1.00 - - - "$dexp"
printf "%-10s %10.1f %10.0f %8sx %8.1f%% %10.1f%% %9s %10.1f%%\n" "tp 2" "$tstep" "$ttps" "$(ratio "$ttps")" "$ttp" "$ttpx" "$tcalls" "$texp"
printf "%-10s %10.1f %10.0f %8sx %8.1f%% %10.1f%% %9s %10.1f%%\n" "tp 2 + sp" "$sstep" "$stps" "$(ratio "$stps")" "$stp" "$stpx" "$scalls" "$sexp"
# The activation bytes each rank keeps (the memory plan, exact to the arena) with and without
# sequence parallelism.
for flags in "" "--parallel.sequence_parallel=true"; do
  echo "tp 2 ${flags:-(no sp)}: $($loom train configs/gpt-mini.toml --dry-run --parallel.tp=2 --parallel.dp=1 \
    --training.micro_batch=8 --training.global_batch=16 $flags | grep -o 'activations [0-9.]* [MGK]iB + workspace [0-9.]* [MGK]iB')"
done
