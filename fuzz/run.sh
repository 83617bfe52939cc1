#!/usr/bin/env bash
# Builds the libFuzzer targets (preset "fuzz": clang, ASan + UBSan) and runs each for
# SECONDS (default 20; CI runs the default, a longer run is e.g. `fuzz/run.sh 3600`).
# Seeds come from fuzz/corpus/<target>; what a run finds goes to build/fuzz/corpus.
# Exit status: non-zero when a target crashes (its reproducer lands in build/fuzz/).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-20}
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz --target store_fuzz handshake_fuzz frame_fuzz
for target in store handshake frame; do
  corpus=build/fuzz/corpus/$target
  mkdir -p "$corpus"
  cp -n fuzz/corpus/$target/* "$corpus/" 2>/dev/null || true
  echo "fuzz: $target for ${seconds} s"
  (cd build/fuzz && ./fuzz/${target}_fuzz -max_total_time="$seconds" -rss_limit_mb=2048 -max_len=4096 \
     -print_final_stats=1 "corpus/$target" 2>&1 | grep -E "^(stat::number_of_executed_units|Done|==[0-9]+==ERROR|SUMMARY)" )
done
