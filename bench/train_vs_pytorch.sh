#!/usr/bin/env bash
# Training throughput, Loom vs PyTorch, side by side in one run on the same model:
# gpt-mini (n_layer 4, n_head 4, d_model 256, seq 256, vocab 256), micro-batch 8, fp32,
# AdamW, random tokens, at 1 and 2 threads. PyTorch runs in its best configuration
# (../shared/peers/README.md): 1 thread with OPENBLAS_NUM_THREADS=1; 2 threads with the
# OpenMP build of OpenBLAS sharing torch's OpenMP pool. Prints Loom/PyTorch ratios. Then
# the same for one gpt2-124m step (micro-batch 1, seq 1024; 3 timed steps after 1 warm-up;
# SKIP_GPT2=1 skips it: it takes a few minutes).
# Usage: bench/train_vs_pytorch.sh [PEERS_DIR]   (default ../shared/peers)
set -euo pipefail
cd "$(dirname "$0")/.."
peers=${1:-../shared/peers}
loom=build/release/loom
[ -x $loom ] || { cmake --preset release >/dev/null && cmake --build --preset release --target loom; }
ob_omp=/usr/lib/x86_64-linux-gnu/openblas-openmp

echo "## Loom"
$loom bench train --threads 1 2 --steps 10 --warmup 3 | tee /tmp/loom_bench_train.txt
echo "## PyTorch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)')"
t1=$(OPENBLAS_NUM_THREADS=1 /usr/bin/python3 "$peers/torch_gpt.py" --threads 1 | tee -a /dev/stderr | sed -n 's/.*tokens_per_s=\([0-9]*\).*/\1/p')
t2=$(LD_LIBRARY_PATH=$ob_omp /usr/bin/python3 "$peers/torch_gpt.py" --threads 2 | tee -a /dev/stderr | sed -n 's/.*tokens_per_s=\([0-9]*\).*/\1/p')
l1=$(awk '$1 == "none" && $2 == "fp32" && $3 == 1 {print $5}' /tmp/loom_bench_train.txt)
l2=$(awk '$1 == "none" && $2 == "fp32" && $3 == 2 {print $5}' /tmp/loom_bench_train.txt)
echo "## Ratio (Loom tokens/s / PyTorch tokens/s)"
printf "threads 1: %s / %s = %.2fx\n" "$l1" "$t1" "$(echo "$l1 / $t1" | bc -l)"
printf "threads 2: %s / %s = %.2fx\n" "$l2" "$t2" "$(echo "$l2 / $t2" | bc -l)"
[ "${SKIP_GPT2:-0}" = 1 ] && exit 0

echo "## gpt2-124m, micro-batch 1 x seq 1024: Loom"
$loom bench train --preset gpt2-124m --micro-batch 1 --threads 1 2 --steps 3 --warmup 1 | tee /tmp/loom_bench_gpt2.txt
echo "## gpt2-124m: PyTorch"
p1=$(OPENBLAS_NUM_THREADS=1 /usr/bin/python3 bench/torch_gpt2_step.py "$peers" 1 3 1 | tee -a /dev/stderr | sed -n 's/.*tokens_per_s=\([0-9]*\).*/\1/p')
p2=$(LD_LIBRARY_PATH=$ob_omp /usr/bin/python3 bench/torch_gpt2_step.py "$peers" 2 3 1 | tee -a /dev/stderr | sed -n 's/.*tokens_per_s=\([0-9]*\).*/\1/p')
g1=$(awk '$1 == "none" && $2 == "fp32" && $3 == 1 {print $5}' /tmp/loom_bench_gpt2.txt)
g2=$(awk '$1 == "none" && $2 == "fp32" && $3 == 2 {print $5}' /tmp/loom_bench_gpt2.txt)
echo "## gpt2-124m ratio (Loom tokens/s / PyTorch tokens/s)"
printf "threads 1: %s / %s = %.2fx\n" "$g1" "$p1" "$(echo "$g1 / $p1" | bc -l)"
printf "threads 2: %s / %s = %.2fx\n" "$g2" "$p2" "$(echo "$g2 / $p2" | bc -l)"
