#!/usr/bin/env bash
# How much of a training step runs outside any OpenMP region (issue 42, item 4: the Amdahl
# bound on what more threads can gain). Builds loom with frame pointers (build/framepointers,
# the release flags otherwise), samples `loom bench train` ARGS with `perf record -g` under
# OMP_WAIT_POLICY=passive (idle team threads sleep instead of spinning, so every sample is
# work), and splits the samples: the main thread inside a parallel region (a frame of an
# outlined *_omp_fn* or of libgomp on its stack), the main thread outside one (serial), the
# team's other threads. Only the steps count: the samples between the first and the last
# with the model's forward or backward on a stack (no set-up, peak measurement or teardown).
# Prints the split and the serial samples by their innermost Loom frames; the serial share s
# bounds the speed-up on N threads at 1 / (s + (1 - s) / N).
# Needs perf (linux-perf) and permission to sample (perf_event_paranoid <= 1, or root).
# Usage: bench/serial_share.sh [loom bench train ARGS...]
#   default ARGS: --threads 2 --steps 8 --warmup 2 --precision fp32
set -euo pipefail
cd "$(dirname "$0")/.."
command -v perf >/dev/null || { echo "serial_share.sh: needs perf (apt-get install linux-perf)" >&2; exit 1; }
[ $# -gt 0 ] || set -- --threads 2 --steps 8 --warmup 2 --precision fp32
build=build/framepointers
cmake -S . -B $build -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOOM_BUILD_TESTS=OFF -DLOOM_BUILD_BENCH=OFF -DLOOM_CUDA=OFF \
  "-DCMAKE_CXX_FLAGS=-fno-omit-frame-pointer -mno-omit-leaf-frame-pointer" >/dev/null
cmake --build $build --target loom
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
OMP_WAIT_POLICY=passive perf record -q -F 1999 -g -o "$work/perf.data" $build/loom bench train "$@"
perf script -i "$work/perf.data" -F pid,tid,time,ip,sym 2>/dev/null | python3 -S -c '
import collections, re, sys
samples = []  # (time, main thread, frames)
for sample in sys.stdin.read().split("\n\n"):
    lines = [l for l in sample.split("\n") if l.strip()]
    if not lines or "/" not in lines[0].split()[0]:
        continue
    head = lines[0].split()
    pid, tid = head[0].split("/")
    frames = [re.sub(r"^\s*[0-9a-f]+\s+", "", l).strip() for l in lines[1:]]
    samples.append((float(head[1].rstrip(":")), pid == tid, frames))
in_model = [t for t, _, frames in samples if any(re.match(r"loom::nn::Gpt::(forward|backward)", f) for f in frames)]
if not in_model:
    sys.exit("serial_share.sh: no sample inside the model (perf without call graphs?)")
parallel = serial = other = 0
by = collections.Counter()
for t, main, frames in samples:
    if not in_model[0] <= t <= in_model[-1]:
        continue
    if not main:
        other += 1
    elif re.search(r"_omp_fn|GOMP_|gomp_|libgomp", "\n".join(frames)):
        parallel += 1
    else:
        serial += 1
        inner = [re.sub(r"\(.*", "", f)[:60] for f in frames if "loom::" in f][:3]
        by[" <- ".join(inner) if inner else "(outside Loom) " + re.sub(r"\+0x.*", "", frames[0])[:60]] += 1
total = max(parallel + serial + other, 1)
print(f"steps: {in_model[-1] - in_model[0]:.2f} s, samples {total}: main thread in parallel regions {parallel}, "
      f"other threads {other}, serial {serial} ({100 * serial / total:.2f}%)")
for where, n in by.most_common(12):
    print(f"  {n:6d} {100 * n / total:5.2f}%  {where}")
'
