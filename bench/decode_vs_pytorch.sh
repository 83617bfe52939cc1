#!/usr/bin/env bash
# Batch-1 decoding, side by side in one run (issue 15, items 5 and 10): `loom sample` with f32
# and int8 weights, with its key/value cache and without, against a PyTorch generation loop
# on the same weights (bench/torch_generate.py, with and without its cache). gpt-mini
# (n_layer 4, d_model 256, seq 256) as the main job trains it, or CHECKPOINT; TOKENS tokens
# from a one-byte prompt (past the window: the caches' restarts count), 1 and 2 threads.
# Tokens/s of the decoding loop alone (each program's own clock, not its start or load).
# Usage: bench/decode_vs_pytorch.sh [TOKENS [CHECKPOINT]]
set -euo pipefail
cd "$(dirname "$0")/.."
tokens=${1:-512}
ckpt=${2:-}
steps=1
source bench/common.sh
if [ -z "$ckpt" ]; then
  gpt_mini_run mini 1 --training.micro_batch=16 --checkpoint.every=1
  ckpt="$work/mini/checkpoints/step_1"
fi
$loom ckpt export "$ckpt" --out "$work/model.safetensors" > /dev/null
$loom quantize --checkpoint "$ckpt" --out "$work/q8" > /dev/null
rate() { grep -o '([0-9]* tokens/s' | tr -d '(' | cut -d' ' -f1; }
echo "# gpt-mini, $tokens tokens from a one-byte prompt, batch 1, $(nproc) cores"
printf "%-8s %-26s %10s\n" threads program tokens/s
for threads in 1 2; do
  for mode in "f32 no-kv-cache" "f32 kv-cache" "int8 kv-cache"; do
    set -- $mode
    flags=$([ "$2" = no-kv-cache ] && echo --no-kv-cache || true)
    src=$([ "$1" = int8 ] && echo "$work/q8" || echo "$ckpt")
    r=$($loom sample --checkpoint "$src" --tokens "$tokens" --prompt x --job.threads=$threads $flags 2>&1 >/dev/null | rate)
    printf "%-8s %-26s %10s\n" $threads "loom $1 $2" "$r"
  done
  OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads /usr/bin/python3 bench/torch_generate.py \
    "$work/model.safetensors" 4 "$tokens" $threads | while read -r prog mode r _; do
    printf "%-8s %-26s %10s\n" $threads "$prog f32 $mode" "$r"
  done
done
