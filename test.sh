#!/usr/bin/env bash
# The full test suite: installs what is missing, builds (Release, assertions on), runs
# every ctest test (unit, parity, CLI; about 8 minutes on 2 cores). Arguments go to ctest,
# e.g. ./test.sh -L unit, or ./test.sh --preset asan to use a sanitizer build.
set -euo pipefail
cd "$(dirname "$0")"
./scripts/setup.sh
preset=release
if [ "${1:-}" = "--preset" ]; then preset=$2; shift 2; fi
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset"
ctest --preset "$preset" "$@"
