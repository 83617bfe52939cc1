#!/usr/bin/env bash
# Here, before bench/gpu_machine.sh is sent to the GPU machine: fills .devkit/ with the Debian
# packages Loom builds from there (../shared/gpu-machine/pack.sh), adding what the kit lacks:
# libcurl, ICU and Boost's headers, and the shared libraries libcurl and ICU load (that
# machine has none of Debian's packages). About 53 MB; .devkit is ignored by git.
set -euo pipefail
cd "$(dirname "$0")/.."
libs() {  # the Debian packages holding the libraries $1 loads, less the C and C++ runtimes
  ldd "$1" | awk '/=>/ {print $3}' | xargs -n1 readlink -f | xargs -n1 dpkg -S 2>/dev/null | cut -d: -f1 |
    grep -v -x -E "libc6|libgcc-s1|libstdc\+\+6|zlib1g|libssl3" || true
}
curl=$(ldconfig -p | awk '/libcurl.so.4 / {print $NF; exit}')
icu=$(ldconfig -p | awk '/libicuuc.so.72 / {print $NF; exit}')
extra="libcurl4-openssl-dev libcurl4 libicu-dev libicu72 libboost1.74-dev $( (libs "$curl"; libs "$icu") | sort -u | tr '\n' ' ')"
LOOM_DEVKIT_EXTRA="$extra" ../shared/gpu-machine/pack.sh
