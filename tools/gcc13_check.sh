#!/usr/bin/env bash
# Builds this tree with GCC 13 and runs the tests that need no prepared data, in a Debian 13
# chroot made with debootstrap (Debian 12 has no g++-13): every target under -Werror, and the
# layout hashes GCC 12 pinned, which GCC 13 must reproduce bit for bit (docs/numerics.md,
# "-ffp-contract=off"). Needs root and Debian's archive; about 25 minutes on 2 cores the
# first time (the chroot is kept in ROOT and reused).
# Usage: tools/gcc13_check.sh [ROOT]   (default /var/tmp/loom-gcc13)
set -euo pipefail
cd "$(dirname "$0")/.."
root=${1:-/var/tmp/loom-gcc13}
if [ ! -x "$root/usr/bin/g++-13" ]; then
  command -v debootstrap >/dev/null || apt-get install -y -qq debootstrap >/dev/null
  # libopenmpi-dev's dependencies fail to configure under debootstrap; apt finishes them below.
  debootstrap --variant=minbase --include=g++-13,cmake,ninja-build,pkg-config,libtomlplusplus-dev,libcli11-dev,nlohmann-json3-dev,libcpp-httplib-dev,libboost-dev,libgtest-dev,libgmock-dev,libbenchmark-dev,libssl-dev,zlib1g-dev \
    trixie "$root" http://deb.debian.org/debian || true
  cp /etc/resolv.conf "$root/etc/resolv.conf"
  echo "deb http://deb.debian.org/debian trixie main" > "$root/etc/apt/sources.list"
  chroot "$root" /bin/bash -c "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get -f install -y -qq >/dev/null &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libopenmpi-dev libopenblas0-openmp libopenblas-openmp-dev libomp-dev >/dev/null"
fi
# Libraries added since the chroot was made (the tokenizer's ICU, the remote shards' libcurl).
chroot "$root" /bin/bash -c "dpkg -s libicu-dev libcurl4-openssl-dev >/dev/null 2>&1 ||
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libicu-dev libcurl4-openssl-dev >/dev/null)"
rm -rf "$root/src/loom" && mkdir -p "$root/src/loom"
git archive HEAD | tar -x -C "$root/src/loom"
# Debian 13's gtest and toml++ are built by GCC 14: link against the system libstdc++, which
# has the symbols they need (GCC 13's own copy does not).
chroot "$root" /bin/bash -c "cd /src/loom && CC=gcc-13 CXX=g++-13 cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CXX_STANDARD_LIBRARIES=/usr/lib/x86_64-linux-gnu/libstdc++.so.6 >/dev/null && cmake --build build -j\$(nproc) &&
  ctest --test-dir build -R '^(core_test|kernels_test|nn_test|optim_test|data_test|checkpoint_test|obs_test|data_parallel_test|schedule_test|pipeline_test|tensor_parallel_test|param_server_test|serve_unit_test|golden_test|layering_test|layout_hashes_test|precision_test)$' -j2"
