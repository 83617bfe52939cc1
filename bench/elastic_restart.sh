#!/usr/bin/env bash
# Elastic restarts (issue 14, items 7 and 9): the time from a failure to the first step
# after the restart, and the steps lost, with a real checkpoint to load. One elastic job of
# 2 to 4 ranks (`loom launch -n 2:4 --max-restarts 2`) trains a 25.4M-parameter GPT
# (gpt-mini with n_layer 8, d_model 512: a 305 MB checkpoint of weights and AdamW moments,
# ZeRO 1) with a global batch of 12 sequences, saving every 4 steps, and goes through:
#   1. rank 2 SIGKILLed after step 6: the job restarts on 3 ranks from step 4's checkpoint;
#   2. a launcher joins with one rank: the job saves at its next checkpoint and goes on with 4;
#   3. that launcher gets SIGTERM (its machine preempted): every rank saves, the job goes on
#      with 3.
# For each restart: elastic_restart_s (the metrics field: from the failure the launcher saw,
# or its decision to resize, to the end of the new generation's first step), that first
# step's own time, and the steps lost (the log's count: steps done but not in the
# checkpoint resumed from). Goal: restart <= 10 s.
# Usage: bench/elastic_restart.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh

head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$work/secret"
chmod 600 "$work/secret"
export LOOM_SECRET_FILE="$work/secret"
train="$loom train configs/gpt-mini.toml --job.run_dir=$work --job.name=el --job.threads=1 --model.n_layer=8
  --model.d_model=512 --model.n_head=8 --model.seq_len=64 --training.micro_batch=1 --training.global_batch=12
  --training.steps=40 --training.eval_every=0 --parallel.zero=1 --checkpoint.every=4 --checkpoint.keep=2"
metrics="$work/el/metrics.jsonl"
lines() { [ -f "$metrics" ] && wc -l < "$metrics" || echo 0; }
restarts() { [ -f "$metrics" ] && grep -c elastic_restart_s "$metrics" || true; }
wait_until() { for _ in $(seq 6000); do eval "$1" && return 0; sleep 0.05; done; echo "timed out: $1" >&2; exit 1; }

$loom launch -n 2:4 --max-restarts 2 -- $train > "$work/el.out" 2>&1 &
launcher=$!
wait_until '[ "$(lines)" -ge 6 ]'
victim=$(for p in $(pgrep -P $launcher); do tr '\0' '\n' < /proc/$p/environ | grep -qx RANK=2 && echo $p; done; true)
kill -9 "$victim"
wait_until '[ "$(restarts)" -ge 1 ]'
master=$(grep -o -- '--master [0-9.:]*' "$work/el.out" | head -1)
$loom launch --join $master --local 1 -- $train > "$work/join.out" 2>&1 &
joiner=$!
wait_until '[ "$(restarts)" -ge 2 ]'
kill -TERM $joiner
wait $joiner
wait $launcher

python3 - "$work" <<'PY'
import json, re, sys
work = sys.argv[1]
out = open(f"{work}/el.out").read()
rows = [json.loads(l) for l in open(f"{work}/el/metrics.jsonl")]
lost = [int(x) for x in re.findall(r"; (\d+) step\(s\) lost", out)]
causes = re.findall(r"loom launch: generation \d+: (\d+) rank\(s\) \((.*)\)\n", out)[1:]
mib = re.findall(r"read ([\d.]+) MiB of shards in ([\d.]+) ms", out)
restarts = [r for r in rows if "elastic_restart_s" in r]
print(f"elastic job, 25.4M-parameter GPT, 305 MB checkpoints every 4 steps, global batch 12, {len(rows)} steps")
for i, (r, (world, cause)) in enumerate(zip(restarts, causes)):
    print(f"restart {i + 1} to {world} ranks ({cause[:60]}): first step {r['elastic_restart_s']:.2f} s after "
          f"(its own step {r['step_ms'] / 1e3:.2f} s; rank 0 read {float(mib[i][0]):.0f} MiB in {float(mib[i][1]) / 1e3:.2f} s), "
          f"{lost[i]} step(s) lost (goal <= 10 s)")
PY
