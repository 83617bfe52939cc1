#!/usr/bin/env bash
# Decoding speed of `loom sample` with the key/value cache against recomputing the whole
# window for every token (--no-kv-cache): gpt-mini (n_layer 4, d_model 256, seq 256),
# weights from one training step (speed does not depend on them), TOKENS tokens from a
# one-byte prompt (past the 256-token window, so the cache's restarts are counted), 1 and 2
# compute threads. Prints the wall time of each and tokens/s.
# Usage: bench/sample_kv_cache.sh [TOKENS]
set -euo pipefail
cd "$(dirname "$0")/.."
tokens=${1:-512}
steps=1
source bench/common.sh
gpt_mini_run mini 1 --training.micro_batch=16 --checkpoint.every=1
ckpt="$work/mini/checkpoints/step_1"
echo "# gpt-mini, $tokens tokens from a one-byte prompt, $(nproc) cores"
printf "%-10s %12s %12s %12s %8s\n" threads cache seconds tokens/s speedup
for threads in 1 2; do
  declare -A secs=()
  for mode in no-kv-cache kv-cache; do
    flag=$([ $mode = no-kv-cache ] && echo --no-kv-cache || true)
    start=$(date +%s.%N)
    $loom sample --checkpoint "$ckpt" --tokens "$tokens" --prompt x --job.threads=$threads $flag > /dev/null 2>&1
    secs[$mode]=$(python3 -c "print($(date +%s.%N) - $start)")
  done
  for mode in no-kv-cache kv-cache; do
    python3 -c "
s = ${secs[$mode]}; base = ${secs[no-kv-cache]}
print(f'{$threads:<10} {\"$mode\":>12} {s:12.2f} {$tokens / s:12.0f} {base / s:7.1f}x')"
  done
done
