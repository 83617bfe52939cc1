#!/usr/bin/env bash
# Training throughput, Loom vs PyTorch, side by side in one run on the same model, each in
# fp32 and bf16 (PyTorch: torch.autocast), and each side's best precision against the
# other's: gpt-mini (n_layer 4, n_head 4, d_model 256, seq 256, vocab 256, micro-batch 8)
# at 1 thread and at every core; then gpt2-124m (micro-batch 1, seq 1024; 3 timed steps
# after 1 warm-up; SKIP_GPT2=1 skips it: it takes several minutes). The peer is
# bench/peers/torch_gpt.py on /usr/bin/python3's torch (or PYTHON=...), in its best
# configuration: 1 thread with OPENBLAS_NUM_THREADS=1; more threads with the OpenMP build of
# OpenBLAS sharing torch's OpenMP pool, where Debian has it.
# ROUNDS=N (default 3; gpt2-124m: ROUNDS_GPT2, default 1) runs every measurement N times, the
# rounds alternating Loom and the peer, and compares each side's best: on a shared host a
# phase that slows one side's single run moved the ratio by a fifth; the best of rounds
# interleaved in time is each side at its best, as the comparison asks. Every round's
# figures are printed, and the table gives each cell's spread over the rounds (max / min).
# PEER_PRECISIONS="fp32" (default "fp32 bf16") leaves the peer's bf16 out where it cannot be
# its best: on a CPU without a bf16 instruction (AVX2 only) Debian's PyTorch 1.13 takes
# 17-18 s a gpt-mini step under autocast, 30 times its fp32 (docs/perf.md, Zen 3); its
# cells then read "-" and best vs best is against the peer's fp32.
# Usage: bench/train_vs_pytorch.sh [THREADS ...]   (default: 1 and every core)
set -euo pipefail
cd "$(dirname "$0")/.."
loom=build/release/loom
python=${PYTHON:-/usr/bin/python3}
[ -x $loom ] || { cmake --preset release >/dev/null && cmake --build --preset release --target loom; }
threads=("$@")
peer_precisions=${PEER_PRECISIONS:-fp32 bf16}
for p in $peer_precisions; do
  [[ $p == fp32 || $p == bf16 ]] || { echo "train_vs_pytorch.sh: PEER_PRECISIONS: $p: expected fp32 and/or bf16" >&2; exit 2; }
done
[ ${#threads[@]} -gt 0 ] || threads=(1 "$(nproc)")
ob_omp=/usr/lib/x86_64-linux-gnu/openblas-openmp
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

echo "# CPU: $(lscpu | sed -n 's/^Model name: *//p'); $("$python" -c 'import torch; print("torch", torch.__version__)')"
"$python" -c 'import torch; print("# torch CPU capability:", torch.backends.cpu.get_cpu_capability())' 2>/dev/null || true

# peer PRESET THREADS PRECISION MICRO_BATCH STEPS WARMUP: PyTorch's tokens/s
peer() {
  local env=(OPENBLAS_NUM_THREADS=1)
  [ "$2" -gt 1 ] && [ -d $ob_omp ] && env=(LD_LIBRARY_PATH=$ob_omp)
  env "${env[@]}" "$python" bench/peers/torch_gpt.py --preset "$1" --threads "$2" --precision "$3" \
    --micro-batch "$4" --steps "$5" --warmup "$6" | tee -a /dev/stderr | sed -n 's/.*tokens_per_s=\([0-9]*\).*/\1/p'
}
# loom_tps FILE THREADS PRECISION: Loom's tokens/s from a `loom bench train` table
loom_tps() { awk -v t="$2" -v p="$3" '$1 == "none" && $2 == p && $3 == t {print $5}' "$1"; }

# compare PRESET MICRO_BATCH STEPS WARMUP ROUNDS
compare() {
  local preset=$1 mb=$2 steps=$3 warmup=$4 rounds=$5
  : > "$out/all.txt"  # lines "threads side precision tokens/s", one per round
  for ((r = 1; r <= rounds; ++r)); do
    echo "## $preset, micro-batch $mb, round $r of $rounds: Loom"
    $loom bench train --preset "$preset" --micro-batch "$mb" --threads "${threads[@]}" --precision fp32 bf16 \
      --steps "$steps" --warmup "$warmup" | tee "$out/loom.txt"
    echo "## $preset, round $r of $rounds: PyTorch"
    for t in "${threads[@]}"; do
      for p in fp32 bf16; do
        echo "$t loom $p $(loom_tps "$out/loom.txt" "$t" $p)" >> "$out/all.txt"
      done
      for p in $peer_precisions; do
        echo "$t torch $p $(peer "$preset" "$t" $p "$mb" "$steps" "$warmup")" >> "$out/all.txt"
      done
    done
  done
  echo "## $preset: Loom / PyTorch, tokens/s, best of $rounds round(s) (spread: best / worst)"
  echo "| threads | Loom fp32 | Loom bf16 | PyTorch fp32 | PyTorch bf16 | best vs best | bf16 vs bf16 | fp32 vs fp32 |"
  echo "|---|---|---|---|---|---|---|---|"
  for t in "${threads[@]}"; do
    awk -v t="$t" '$1 == t {
      k = $2 " " $3
      if (!(k in hi) || $4 > hi[k]) hi[k] = $4
      if (!(k in lo) || $4 < lo[k]) lo[k] = $4
    }
    function cell(k) { return (k in hi) ? sprintf("%d (%.2f)", hi[k], hi[k] / lo[k]) : "-" }
    function get(k) { return (k in hi) ? hi[k] : 0 }  # reading hi[k] would make the key
    function ratio(a, b) { return (a in hi) && (b in hi) ? sprintf("%.2fx", hi[a] / hi[b]) : "-" }
    END {
      l32 = get("loom fp32"); l16 = get("loom bf16"); p32 = get("torch fp32"); p16 = get("torch bf16")
      lb = l32 > l16 ? l32 : l16; pb = p32 > p16 ? p32 : p16
      printf "| %s | %s | %s | %s | %s | %.2fx | %s | %s |\n", t, cell("loom fp32"), cell("loom bf16"),
        cell("torch fp32"), cell("torch bf16"), lb / pb, ratio("loom bf16", "torch bf16"), ratio("loom fp32", "torch fp32")
    }' "$out/all.txt"
  done
}

compare gpt-mini 8 10 3 "${ROUNDS:-3}"
[ "${SKIP_GPT2:-0}" = 1 ] && exit 0
compare gpt2-124m 1 3 1 "${ROUNDS_GPT2:-1}"
