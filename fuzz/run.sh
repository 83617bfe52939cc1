#!/usr/bin/env bash
# Builds the libFuzzer targets (preset "fuzz": clang, ASan + UBSan) and runs each for
# SECONDS (default 20; CI runs the default, a longer run is e.g. `fuzz/run.sh 3600`), or
# only the TARGETs named. Seeds come from fuzz/corpus/<target> (file formats: written by
# fuzz/make_corpus.sh from real files); what a run finds goes to build/fuzz/corpus.
# Exit status: non-zero when a target crashes, breaks a property it checks or spends more than
# 10 s on one input (its reproducer lands in build/fuzz/).
# Usage: fuzz/run.sh [SECONDS [TARGET...]]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-20}
shift || true
# Each target's largest input: its seeds fit, with room to grow.
declare -A max_len=([store]=4096 [handshake]=4096 [frame]=4096 [safetensors]=32768 [checkpoint]=32768
                    [tokens]=4096 [tokenizer]=16384 [manifest]=8192 [doc_index]=8192 [idx]=8192 [config]=8192 [completion]=4096)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(store handshake frame safetensors checkpoint tokens tokenizer manifest doc_index idx config completion)
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz --target "${targets[@]/%/_fuzz}"
for target in "${targets[@]}"; do
  corpus=build/fuzz/corpus/$target
  mkdir -p "$corpus"
  cp -n fuzz/corpus/$target/* "$corpus/" 2>/dev/null || true
  echo "fuzz: $target for ${seconds} s"
  (cd build/fuzz && ./fuzz/${target}_fuzz -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -max_len="${max_len[$target]}" \
     -print_final_stats=1 "corpus/$target" 2>&1 | grep -E "^(stat::number_of_executed_units|Done|==[0-9]+==ERROR|SUMMARY|INFO: Seed)|deadly signal|abort|^finding: |terminate called|what\(\):" )
done
