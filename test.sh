#!/usr/bin/env bash
# The full test suite: installs what is missing, builds (Release, assertions on), runs
# every ctest test (unit, parity, CLI; 11.4-15.4 minutes on 2 cores of an AVX2-only Zen 3,
# by how busy its host is, 6-8.5 of them the main job trained whole, beside the tests that
# mostly wait). Arguments go to
# ctest, e.g. ./test.sh -L unit, or ./test.sh --preset asan to use a sanitizer build.
# --machine MEM:CORES runs the suite as on a machine of that size, whatever this one is:
# every loom process takes MEM as the memory it has free (LOOM_HOST_MEMORY, e.g. 24G) and
# the tests run on the first CORES cores only (taskset), e.g. ./test.sh --machine 24G:2.
set -euo pipefail
cd "$(dirname "$0")"
./scripts/setup.sh
preset=release
machine=""
while [ $# -gt 0 ]; do
  case "$1" in
    --preset) preset=$2; shift 2 ;;
    --machine) machine=$2; shift 2 ;;
    *) break ;;
  esac
done
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset"
if [ -z "$machine" ]; then
  exec ctest --preset "$preset" "$@"
fi
mem=${machine%%:*} cores=${machine##*:}
if ! [[ $machine == *:* && $cores =~ ^[1-9][0-9]*$ && $mem =~ ^[1-9][0-9]*[KMGT]?$ ]]; then
  echo "test.sh: --machine $machine: expected MEM:CORES, e.g. 24G:2" >&2
  exit 2
fi
have=$(nproc --all)
if [ "$cores" -gt "$have" ]; then
  echo "test.sh: --machine $machine: this machine has $have cores" >&2
  exit 2
fi
echo "test.sh: as a machine with $mem of free memory and $cores cores (cores 0-$((cores - 1)))"
export LOOM_HOST_MEMORY=$mem
exec taskset -c "0-$((cores - 1))" ctest --preset "$preset" "$@"
