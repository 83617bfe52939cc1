#!/usr/bin/env bash
# What the mismatched-collective check costs: all_reduce of 4 KiB (and 8 B) with
# fingerprints on (the default) and off (--no-fingerprints), alternated ROUNDS times on
# each transport and world size so machine noise hits both alike; prints the median
# time of each and the overhead (on/off - 1). Goal: <= 5% at 4 KiB.
# usage: bench/fingerprint_overhead.sh [ROUNDS]   (default 5; needs a release build)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
loom=build/release/loom
printf "%-5s %-3s %-7s %12s %12s %9s\n" transport np bytes on_us off_us overhead
for transport in auto tcp; do
  for np in 2 4; do
    out=$(mktemp)
    for _ in $(seq "$rounds"); do
      for mode in on off; do
        flag=""
        [ $mode = off ] && flag=--no-fingerprints
        $loom launch -n "$np" -- $loom bench comm --op all_reduce --sizes 8,4096 --reps 3 --transport $transport $flag \
          | sed -n 's/^\[rank 0\] *//p' | awk -v m=$mode '/^[0-9]/ {print m, $1, $4}' >>"$out"
      done
    done
    python3 - "$out" "$transport" "$np" <<'PY'
import sys, statistics, collections
t = collections.defaultdict(list)
for line in open(sys.argv[1]):
    mode, size, us = line.split()
    t[(mode, int(size))].append(float(us))
for size in sorted({s for _, s in t}):
    on, off = statistics.median(t[("on", size)]), statistics.median(t[("off", size)])
    print(f"{sys.argv[2]:<9} {sys.argv[3]:<3} {size:<7} {on:12.2f} {off:12.2f} {100 * (on / off - 1):8.1f}%")
PY
    rm -f "$out"
  done
done
