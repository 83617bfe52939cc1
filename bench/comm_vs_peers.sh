#!/usr/bin/env bash
# Loom's collectives side by side with OpenMPI (shared memory: vader with CMA) and Gloo (TCP
# on 127.0.0.1), in one run: the same sizes, world sizes and timing (bench/peers/mpi_coll.c
# and gloo_coll.cc, this repository's own peer programs, time as `loom bench comm` does: a
# checked call, warm-up, at least MIN_ITERS calls a rep, the median of REPS reps and their
# spread). Prints each side's busbw (or, up to 4 KiB, its time) with the spread, and the
# Loom/peer ratios.
# Usage: bench/comm_vs_peers.sh [NP ...]   (default: 2 4; REPS=5 MIN_ITERS=100 SIZES="..."
# OPS=all_reduce,all_gather,reduce_scatter,broadcast, any of them, for every side)
# DIRTY=1: every side writes each call's input first (--dirty-inputs: one byte of every 64-byte
# line, as a backward pass writes a gradient), timed with the call; without it the inputs stay
# as the first call left them, in every core's cache (as nccl-tests runs).
# SHARED=1: Loom's inputs lie in alloc_shared memory (--shared-inputs), which its same-host
# peers read in place as OpenMPI's CMA reads any buffer; the peers' buffers are unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."
nps=${*:-2 4}
sizes=${SIZES:-8 4096 262144 1048576 4194304 16777216 67108864}
reps=${REPS:-5}
export OPS=${OPS:-all_reduce,all_gather,reduce_scatter,broadcast}
min_iters=${MIN_ITERS:-100}
dirty=()
[ "${DIRTY:-0}" = 1 ] && dirty=(--dirty-inputs)
shared=()
[ "${SHARED:-0}" = 1 ] && shared=(--shared-inputs)
loom=build/release/loom
[ -x $loom ] || { cmake --preset release >/dev/null && cmake --build --preset release --target loom; }
work=build/peers
mkdir -p "$work"
mpicc.openmpi -O2 bench/peers/mpi_coll.c -o "$work/mpi_coll"
g++ -O3 -march=native -std=c++17 bench/peers/gloo_coll.cc -o "$work/gloo_coll" -lgloo -lpthread
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "# CPU: $(lscpu | sed -n 's/^Model name: *//p'); $reps reps of at least $min_iters calls each${dirty:+; inputs rewritten before each call}${shared:+; Loom inputs in shared memory (--shared-inputs)}" >&2
for np in $nps; do
  echo "== np=$np: loom" >&2
  $loom launch -n "$np" -- $loom bench comm "${dirty[@]}" "${shared[@]}" --op "$OPS" \
    --sizes "${sizes// /,}" --reps "$reps" --min-iters "$min_iters" | sed 's/^\[rank 0\] //' \
    | awk -v np="$np" '/^# [a-z_]+$/ {op=$2} /^ +[0-9]/ {print "loom", np, op, $1, $4, $6, $9}' >> "$out/rows"
  echo "== np=$np: openmpi" >&2
  timeout 1800 mpirun.openmpi --allow-run-as-root --oversubscribe --bind-to none -np "$np" \
    --mca btl self,vader --mca oob_tcp_if_include lo "$work/mpi_coll" "${dirty[@]}" openmpi "$reps" "$min_iters" $sizes \
    | awk '!/^#/ {print $1, $2, $3, $4, $5, $7, $9}' >> "$out/rows"
  echo "== np=$np: gloo" >&2
  timeout 1800 bench/peers/run_gloo.sh "$work/gloo_coll" "$np" "${dirty[@]}" gloo "$reps" "$min_iters" $sizes \
    | awk '!/^#/ {print $1, $2, $3, $4, $5, $7, $9}' >> "$out/rows"
done
/usr/bin/env python3 - "$out/rows" <<'PY'
import collections, sys
rows = collections.defaultdict(dict)  # (np, op, bytes) -> impl -> (time_us, busbw, spread %)
for line in open(sys.argv[1]):
    impl, np, op, size, t, bus, spread = line.split()
    rows[(int(np), op, int(size))][impl] = (float(t), float(bus), float(spread))
print(f"{'np':>3} {'op':<15} {'bytes':>10} {'loom':>16} {'openmpi':>16} {'gloo':>16} {'loom/ompi':>10} {'loom/gloo':>10}")
for (np, op, size), r in sorted(rows.items()):
    if "loom" not in r:
        continue
    small = size <= 4096  # latency (us) for small messages, busbw (GB/s) for the rest
    def cell(impl):
        if impl not in r: return "-"
        t, b, s = r[impl]
        return f"{t if small else b:.3f}+-{s / 2:.0f}%"
    def ratio(impl):
        if impl not in r: return "-"
        t, b, _ = r[impl]
        lt, lb, _ = r["loom"]
        return f"{(t / lt if small else lb / b if b else 0):.2f}x"
    print(f"{np:>3} {op:<15} {size:>10} {cell('loom'):>16} {cell('openmpi'):>16} {cell('gloo'):>16} "
          f"{ratio('openmpi'):>10} {ratio('gloo'):>10}")
print("cells: time in us up to 4 KiB, busbw in GB/s above, +- half the spread of the reps (slowest - fastest)")
print("ratios > 1 mean Loom is better: the peer's time / Loom's up to 4 KiB, Loom's busbw / the peer's above")
PY
