#!/usr/bin/env bash
# Mismatched collectives under mpirun with the mpi transport: rank 0 calls all_reduce
# (a Loom algorithm over MPI point-to-point) while the others call broadcast (MPI's
# native one), then a rank skips a call. Every rank must fail with a MismatchError
# naming both calls, well within the 5 s timeout.
# Usage: mpi_mismatch_test.sh MPIEXEC COMM_WORKER
set -uo pipefail
MPIEXEC=$1 WORKER=$2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for mode in mismatch skip; do
  start=$(date +%s%3N)
  out=$(timeout 60 "$MPIEXEC" -np 3 --oversubscribe "$WORKER" --transport mpi --timeout-ms 5000 "$mode" 2>&1)
  took=$(($(date +%s%3N) - start))
  n=$(echo "$out" | grep -c "^ERROR MismatchError .*called .* but rank [0-9] called ")
  if [ "$n" -lt 3 ]; then
    echo "$out"
    echo "FAILED: $mode: $n of 3 ranks reported a MismatchError naming both calls"
    exit 1
  fi
  if [ "$took" -gt 4000 ]; then
    echo "$out"
    echo "FAILED: $mode: took $took ms (timeout 5000 ms: the mismatch was not caught at once)"
    exit 1
  fi
  echo "ok: $mode ($took ms for the whole mpirun)"
done
