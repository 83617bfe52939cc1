#!/usr/bin/env bash
# Parameter servers (issue 16, item 7): steps/s of sync, async and ssp (K = 2) with 1 and 2
# servers and 2 and 4 workers, each clean, with one worker slowed 3x (debug.delay_ms: it
# sleeps twice a clean sync step before each of its steps), and with every worker jittery
# (debug.jitter_ms: a stall of 4 clean steps in a quarter of its steps, one step's time on
# average, at random: the stragglers ssp is for); and the bytes a step moves
# between workers and servers against data parallelism's ring all-reduce of the same
# gradients (2 (W - 1) x 4 P bytes over all ranks). gpt-mini with seq_len 64, global batch 8,
# one compute thread per rank, every rank on this host.
# A step is one global batch (sync: one update; async and ssp: W pushes of 8 / W sequences).
# Usage: bench/ps_modes.sh [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh
steps=${1:-30}

run() {  # NAME NP FLAGS...: a parameter-server job's summary line and metrics
  local name=$1 np=$2
  shift 2
  $loom launch -n "$np" -- $loom train configs/gpt-mini.toml --job.run_dir="$work" --job.name="$name" \
    --job.threads=1 --model.seq_len=64 --training.micro_batch=1 --training.global_batch=8 --training.steps="$steps" \
    --training.eval_every=0 --checkpoint.every=0 --data.val= "$@" > "$work/$name.out" 2>&1
}

echo "servers workers mode clean_steps_per_s slowed_steps_per_s slowed/clean jittery_steps_per_s jittery/clean ps_bytes_per_step ring_bytes_per_step"
for servers in 1 2; do
  for workers in 2 4; do
    np=$((servers + workers))
    slow_rank=$((np - 1))
    # The clean sync step sets the straggler's delay: two more of them make its step 3x.
    run "sync-$servers-$workers" $np --parallel.ps_servers=$servers
    step_ms=$(grep -o 'step [0-9.]* ms' "$work/sync-$servers-$workers.out" | head -1 | awk '{print $2}')
    delay=$(python3 -c "print(int(round(2 * $step_ms)))")
    for mode in sync async ssp; do
      flags="--parallel.ps_servers=$servers --parallel.ps_mode=$mode"
      [ $mode = ssp ] && flags="$flags --parallel.ps_staleness=2"
      [ $mode = sync ] || run "$mode-$servers-$workers" $np $flags
      run "$mode-$servers-$workers-slow" $np $flags --debug.delay_ms=$slow_rank:$delay
      run "$mode-$servers-$workers-jitter" $np $flags --debug.jitter_ms=$(python3 -c "print(int(round($step_ms)))")
      python3 - "$work" "$mode-$servers-$workers" "$servers" "$workers" "$mode" <<'PY'
import json, re, sys
work, name, servers, workers, mode = sys.argv[1:]
def rate(n):
    ms = float(re.search(r"step ([\d.]+) ms", open(f"{work}/{n}.out").read()).group(1))
    return 1e3 / ms
rows = [json.loads(l) for l in open(f"{work}/{name}/metrics.jsonl") if '"loss"' in l]
ps_bytes = sum(r["ps_bytes"] for r in rows[2:]) / max(1, len(rows[2:]))
params = 0
for line in open(f"{work}/{name}.out"):
    m = re.search(r"\((\d+) parameters\)", line)
    if m: params = int(m.group(1))
w = int(workers)
ring = 2 * (w - 1) * 4 * params if params else float("nan")
clean, slow, jitter = rate(name), rate(name + "-slow"), rate(name + "-jitter")
print(f"{servers} {workers} {mode} {clean:.2f} {slow:.2f} {slow / clean:.2f} {jitter:.2f} {jitter / clean:.2f} "
      f"{ps_bytes:.0f} {ring:.0f}")
PY
    done
  done
done
