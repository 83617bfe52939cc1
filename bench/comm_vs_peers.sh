#!/usr/bin/env bash
# Loom's collectives side by side with OpenMPI 4.1 (shared memory, vader+CMA) and Gloo
# (tcp on 127.0.0.1), same sizes, same world sizes, same timing method (see
# ../shared/peers/README.md), in one run; prints Loom/peer busbw ratios and 8-byte latency.
# usage: bench/comm_vs_peers.sh [NP ...]      (default: 2 4; needs ./run.sh or a release build)
set -euo pipefail
cd "$(dirname "$0")/.."
nps=${*:-2 4}
sizes="8 4096 262144 4194304 67108864"
peers=${LOOM_PEERS:-../shared/peers}
work=build/peers
mkdir -p "$work/build"
cp "$peers"/mpi_coll.c "$peers"/gloo_coll.cc "$peers"/run_gloo.sh "$work/"
mpicc.openmpi -O2 "$work/mpi_coll.c" -o "$work/build/mpi_coll_openmpi"
g++ -O3 -march=native -std=c++17 "$work/gloo_coll.cc" -o "$work/build/gloo_coll" -lgloo -lpthread
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for np in $nps; do
  echo "== np=$np: loom" >&2
  build/release/loom launch -n "$np" -- build/release/loom bench comm \
    --op all_reduce,all_gather,reduce_scatter,broadcast --sizes "${sizes// /,}" | sed 's/^\[rank 0\] //' \
    | awk -v np="$np" '/^# [a-z_]+$/ {op=$2} /^ +[0-9]/ {print "loom", np, op, $1, $4, $6}' >> "$out/rows"
  echo "== np=$np: openmpi" >&2
  timeout 900 mpirun.openmpi --allow-run-as-root --oversubscribe --bind-to none -np "$np" \
    --mca btl self,vader --mca oob_tcp_if_include lo "$work/build/mpi_coll_openmpi" openmpi 5 0.1 \
    | awk '!/^#/ {print $1, $2, $3, $4, $5, $7}' >> "$out/rows"
  echo "== np=$np: gloo" >&2
  SIZES="$sizes" "$work/run_gloo.sh" "$np" allreduce allgather reduce_scatter_hd broadcast \
    | awk '!/^#/ {print $1, $2, $3, $4, $5, $7}' >> "$out/rows"
done
/usr/bin/env python3 - "$out/rows" <<'PY'
import sys, collections
rows = collections.defaultdict(dict)   # (np, op, bytes) -> impl -> (time_us, busbw)
norm = {"allreduce": "all_reduce", "allgather": "all_gather", "reduce_scatter_hd": "reduce_scatter"}
for line in open(sys.argv[1]):
    impl, np, op, size, t, bus = line.split()
    rows[(int(np), norm.get(op, op), int(size))][impl] = (float(t), float(bus))
print(f"{'np':>3} {'op':<15} {'bytes':>10} {'loom_us':>10} {'loom_GBps':>10} {'ompi_GBps':>10} {'gloo_GBps':>10} {'loom/ompi':>10} {'loom/gloo':>10}")
for key in sorted(rows):
    np, op, size = key
    r = rows[key]
    if "loom" not in r:
        continue
    lt, lb = r["loom"]
    def ratio(impl):
        if impl not in r: return "-"
        t, b = r[impl]
        # small messages compare latency (peer time / loom time), large ones busbw
        return f"{(t / lt if size <= 4096 else lb / b if b else 0):.2f}x"
    ob = f"{r['openmpi'][1]:.3f}" if "openmpi" in r else "-"
    gb = f"{r['gloo'][1]:.3f}" if "gloo" in r else "-"
    print(f"{np:>3} {op:<15} {size:>10} {lt:>10.2f} {lb:>10.3f} {ob:>10} {gb:>10} {ratio('openmpi'):>10} {ratio('gloo'):>10}")
print("ratios > 1 mean Loom is better: busbw ratio for sizes > 4 KiB, latency ratio (peer time / Loom time) for <= 4 KiB")
PY
