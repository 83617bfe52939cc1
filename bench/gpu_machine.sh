#!/usr/bin/env bash
# One prepared run on the GPU machine (docs/gpu.md, ../shared/gpu-machine/README.md): builds
# Loom there with the carried kit (.devkit, made here by bench/gpu_kit.sh) and CUDA, runs the `gpu`
# tests, then the GPT-2 124M step on the GPU beside PyTorch (eager and torch.compile, bf16,
# the same batch), then the CPU figures docs/perf.md keeps per CPU (gpt-mini at 1 and all
# cores, fp32 and bf16, Loom and PyTorch, and where Loom's step goes at each; data parallel
# on every core beside torch DDP, with its exposed communication and trace). Everything
# goes to $OUT (default /tmp/loom-gpu): summary.txt has the figures, build.txt and
# gpu_test.txt the logs.
#
#   bench/gpu_machine.sh [STEP...]    steps: tests cli bench peer cpu dp compile gemm amx
#                                     (default: all), run in the order given
#
# amx: the AMX path of bf16 products (GemmPath::kAmx, never run before on a CPU with AMX): the
# GEMM tests on every path of this CPU, AMX's included, then its products and a bf16 step.
#
# Each step has its own time limit, so that one that hangs leaves the others' figures.
set -u
steps=" ${*:-tests cli bench peer cpu dp compile gemm amx} "
OUT=${OUT:-/tmp/loom-gpu}
mkdir -p "$OUT"
S=$OUT/summary.txt
say() { echo "== $*" | tee -a "$S"; }
run() {  # run LIMIT_S CMD...: output to the summary, a failure noted and passed over
  local limit=$1; shift
  say "$*"
  timeout "$limit" "$@" 2>&1 | tee -a "$S" | tail -40
  local rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] || say "exit $rc"
}

say "$(date -u) $(hostname)"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1 | tee -a "$S"
lscpu | grep -E "Model name|^CPU\(s\)" | tee -a "$S"
grep -o -w -E "avx512_bf16|avx512_fp16|amx_bf16|amx_tile" /proc/cpuinfo | sort -u | tr '\n' ' ' | tee -a "$S"
nvcc --version | tail -2 | tee -a "$S"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" 2>&1 | tee -a "$S"

B=/tmp/loom-gpu-build
say "build"
if ! CMAKE_ARGS="-DLOOM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLOOM_WERROR=OFF -DLOOM_BUILD_BENCH=OFF" \
    timeout 400 .devkit/build.sh . $B loom gpu_test gpu_cli_test kernels_test >"$OUT/build.txt" 2>&1; then
  tail -60 "$OUT/build.txt"
  say "build failed"
  exit 1
fi
grep -c "warning:" "$OUT/build.txt" | sed 's/^/compiler warnings: /' | tee -a "$S"
export LD_LIBRARY_PATH=/opt/devkit/usr/lib/x86_64-linux-gnu:/opt/devkit/usr/lib/x86_64-linux-gnu/openblas-openmp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

step_tests() {
  say "gpu tests"
  OMP_NUM_THREADS=16 timeout 300 $B/src/gpu/gpu_test >"$OUT/gpu_test.txt" 2>&1
  echo "gpu_test exit $?" | tee -a "$S"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure|Expected|Which is|actual|step|device 0|epilogues|^attention|^layernorm|^cross-entropy|^data parallel|^ZeRO" "$OUT/gpu_test.txt" | head -70 | tee -a "$S"
}
step_cli() {  # loom train --job.device=cuda, CPU -> GPU -> CPU through --resume
  say "gpu cli tests"
  OMP_NUM_THREADS=16 timeout 300 $B/tests/gpu_cli_test >"$OUT/gpu_cli_test.txt" 2>&1
  echo "gpu_cli_test exit $?" | tee -a "$S"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure|Expected|Which is|actual|step|error" "$OUT/gpu_cli_test.txt" | head -40 | tee -a "$S"
}
step_bench() {  # the step with the epilogues fused on cuBLASLt, then with Loom's kernels, side by side;
  # the attention's mma-x4 kernels (mma's bits: ldmatrix.x4 fragments, dk/dv at three blocks an SM) beside mma
  run 180 $B/loom bench gpu --preset gpt2-124m --micro-batch 16 --steps 20 --warmup 5 --profile
  run 180 $B/loom bench gpu --preset gpt2-124m --micro-batch 16 --steps 20 --warmup 5 --profile --attention mma-x4
  run 120 $B/loom bench gpu --preset gpt2-124m --micro-batch 16 --steps 20 --warmup 5 --epilogues kernels
  run 120 $B/loom bench gpu --preset gpt-mini --micro-batch 64 --steps 20 --warmup 5
}
peer=(python3 bench/peers/torch_gpt.py --device cuda --preset gpt2-124m --micro-batch 16 --precision bf16 --sdpa
      --vocab 50304 --steps 20 --warmup 5)
step_peer() { run 180 "${peer[@]}"; }
step_compile() { run 300 "${peer[@]}" --compile; }
step_cpu() {
  local cores
  cores=$(nproc)
  # --breakdown: each part's ms at 1 thread and all cores, and its speed-up (issue 42, item 4);
  # at all cores op(B) is packed once for the threads' bands of rows (--shared-pack auto), then
  # once per band as before (off), for the A/B never run on more than 2 cores
  run 300 $B/loom bench train --preset gpt-mini --threads 1 "$cores" --precision fp32 bf16 --steps 8 --warmup 2 --breakdown
  run 200 $B/loom bench train --preset gpt-mini --threads "$cores" --precision fp32 bf16 --steps 8 --warmup 2 --breakdown \
    --shared-pack off
  # how busy each part keeps the threads: with passive waits, a waiting thread uses no CPU
  OMP_WAIT_POLICY=passive run 200 $B/loom bench train --preset gpt-mini --threads "$cores" --precision fp32 bf16 \
    --steps 8 --warmup 2 --breakdown
  # item 4's gpt2-124m at all cores (micro-batch 4: 48 heads' backward tasks, 3 a thread at 16)
  run 240 $B/loom bench train --preset gpt2-124m --micro-batch 4 --threads "$cores" --precision fp32 bf16 --steps 3 \
    --warmup 1 --breakdown
  for th in 1 "$cores"; do
    for p in fp32 bf16; do
      run 120 python3 bench/peers/torch_gpt.py --preset gpt-mini --threads "$th" --precision "$p" --steps 8 --warmup 2
    done
  done
}
step_dp() {  # issue 42, item 5: data parallel on every core (a rank each, 1 thread) beside torch DDP, with
  # the exposed gradient communication and a merged trace of two steps (dp_trace.json)
  # (the token file made from the repository's docs: this machine has no fortunes)
  LOOM=$B/loom TEXT='docs/*.md' PYTHON=python3 TRACE=8-9 TRACE_OUT="$OUT/dp_trace.json" \
    run 300 bench/dp_vs_ddp.sh "$(nproc)" 13
  # the same with each rank bound to its own core (loom launch --bind cores), then with 2 MiB
  # gradient units (gpt-mini's 13 MB are one 25 MiB unit by default: all-reduced after backward)
  LOOM=$B/loom TEXT='docs/*.md' BIND=1 SKIP_PEER=1 run 120 bench/dp_vs_ddp.sh "$(nproc)" 13
  LOOM=$B/loom TEXT='docs/*.md' LOOM_ARGS=--parallel.bucket_mb=2 SKIP_PEER=1 run 120 bench/dp_vs_ddp.sh "$(nproc)" 13
}
step_gemm() { run 120 $B/loom bench gemm --threads 1; }
step_amx() {
  say "gemm tests (every path this CPU has)"
  OMP_NUM_THREADS=4 timeout 300 $B/src/kernels/kernels_test --gtest_filter='Gemm.*:GemmHalf.*' >"$OUT/kernels_test.txt" 2>&1
  echo "kernels_test exit $?" | tee -a "$S"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure|Which is|of [0-9]+ lanes|amx" "$OUT/kernels_test.txt" | head -40 | tee -a "$S"
  run 120 $B/loom bench gemm --threads 1 --path amx
  run 300 $B/loom bench train --preset gpt-mini --threads 1 "$(nproc)" --precision bf16 --steps 8 --warmup 2 --gemm-path amx
}
for step in $steps; do
  case $step in
    tests | cli | bench | peer | compile | cpu | dp | gemm | amx) "step_$step" ;;
    *) say "unknown step $step" ;;
  esac
done
say "done $(date -u)"
