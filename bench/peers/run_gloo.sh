#!/usr/bin/env bash
# Starts NP ranks of the Gloo peer (bench/peers/gloo_coll.cc, built as BIN) on 127.0.0.1 with
# a fresh FileStore directory, and waits for them all; a rank that fails fails the run.
# Usage: bench/peers/run_gloo.sh BIN NP [--dirty-inputs] LABEL REPS MIN_ITERS SIZE [SIZE ...]
set -euo pipefail
bin=$1 np=$2
shift 2
store=$(mktemp -d /tmp/loom_gloo_store.XXXXXX)
trap 'rm -rf "$store"' EXIT
pids=()
for ((r = 0; r < np; r++)); do
  RANK=$r SIZE=$np STORE=$store "$bin" "$@" &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
exit $rc
