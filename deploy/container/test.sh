#!/usr/bin/env bash
# The container image, end to end without a registry (docs/deploy.md, "Containers"; label
# "container": it builds Loom inside the image, about 10 minutes on 2 cores, so it runs
# on its own, not in ./test.sh):
#   1. a Debian 12 base from debootstrap, imported into podman; the image built from
#      deploy/Containerfile on it;
#   2. the main job's first steps in a container, the run directory a mounted volume;
#   3. a two-rank `loom launch` across two containers on the host network (node 0 serves
#      the rendezvous; LOOM_HOST_ID makes them two hosts, talking over TCP);
#   4. a container whose run directory is not mounted: one line, exit 2, nothing trained.
# Podman's state lives under STATE (default /var/tmp/loom-podman) with this VM's settings:
# the runc runtime with cgroupfs, and file limits set in a containers.conf of its own.
# Usage: deploy/container/test.sh [STATE]
set -euo pipefail
cd "$(dirname "$0")/../.."
STATE=${1:-/var/tmp/loom-podman}
fail() { echo "FAILED: $*"; exit 1; }
for tool in podman debootstrap runc; do
  command -v $tool >/dev/null || { echo "SKIPPED: $tool is not installed (apt-get install podman runc debootstrap)"; exit 77; }
done
[ -f data/fortunes_bpe.bin ] || fail "data/fortunes_bpe.bin is missing: run ./run.sh once first (it prepares the main job's data)"
mkdir -p "$STATE"
cat >"$STATE/containers.conf" <<'EOF'
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
export CONTAINERS_CONF=$STATE/containers.conf
pod() { podman --root "$STATE/root" --runroot "$STATE/runroot" "$@"; }
t0=$(date +%s)

# 1. The base and the image.
if ! pod image exists loom-base:bookworm; then
  rm -rf "$STATE/base"
  debootstrap --variant=minbase bookworm "$STATE/base" >"$STATE/debootstrap.log" 2>&1 ||
    fail "debootstrap: $(tail -3 "$STATE/debootstrap.log")"
  tar -C "$STATE/base" -c . | pod import - loom-base:bookworm >/dev/null || fail "podman import"
  rm -rf "$STATE/base"
fi
t1=$(date +%s)
pod build --network host --build-arg BASE=localhost/loom-base:bookworm -f deploy/Containerfile -t loom:test . \
  >"$STATE/build.log" 2>&1 || fail "podman build: $(tail -20 "$STATE/build.log")"
t2=$(date +%s)
echo "1. base image $((t1 - t0)) s, loom image built in $((t2 - t1)) s ($(pod image inspect loom:test --format '{{.Size}}') bytes)"

work=$(mktemp -d /var/tmp/loom-container.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/runs"
run=(run --rm --network host -v "$PWD/data:/work/data:ro" -v "$PWD/configs:/work/configs:ro")

# 2. The main job's first steps, its run directory on the host.
pod "${run[@]}" -v "$work/runs:/work/runs" loom:test train configs/gpt-mini-bpe.toml --training.steps=3 \
  --training.eval_every=0 --checkpoint.every=3 --job.name=first --job.threads=2 >"$work/first.out" 2>&1 ||
  fail "the main job in a container: $(tail -5 "$work/first.out")"
[ "$(wc -l <"$work/runs/first/metrics.jsonl")" = 3 ] || fail "no 3 metrics lines on the host"
[ -f "$work/runs/first/checkpoints/step_3/index.json" ] || fail "no checkpoint on the host"
echo "2. the main job's first 3 steps in a container: metrics and checkpoint in the mounted run directory"

# 3. Two containers, one rank each, one job over TCP on the host network.
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/secret"
chmod 600 "$work/secret"
port=$((30000 + $$ % 20000))
for node in 0 1; do
  pod "${run[@]}" -v "$work/runs:/work/runs" -v "$work/secret:/run/loom-secret:ro" -e LOOM_SECRET_FILE=/run/loom-secret \
    -e LOOM_HOST_ID="container-$node" --entrypoint /usr/local/bin/loom loom:test \
    launch -n 1 --nnodes 2 --node-rank $node --master 127.0.0.1:$port -- \
    /usr/local/bin/loom train configs/gpt-mini-bpe.toml --training.steps=3 --training.eval_every=0 --checkpoint.every=0 \
    --job.name=two --job.threads=1 --training.global_batch=16 >"$work/node$node.out" 2>&1 &
  pids[$node]=$!
done
for node in 0 1; do wait "${pids[$node]}" || fail "container $node: $(tail -5 "$work/node$node.out")"; done
grep -q '"world": 2' "$work/runs/two/events.jsonl" || fail "not one job of 2 ranks: $(cat "$work/runs/two/events.jsonl")"
[ "$(wc -l <"$work/runs/two/metrics.jsonl")" = 3 ] || fail "the two-container job wrote no 3 steps"
echo "3. two containers on the host network: one job of 2 ranks over TCP, 3 steps"

# 4. No run directory mounted: refused, one line.
set +e
pod "${run[@]}" loom:test train configs/gpt-mini-bpe.toml --training.steps=1 >"$work/bare.out" 2>&1
code=$?
set -e
[ "$code" = 2 ] || fail "a container without its run directory mounted exited $code: $(cat "$work/bare.out")"
grep -q "^loom (container): /work/runs is not a mounted volume" "$work/bare.out" || fail "no reason given: $(cat "$work/bare.out")"
[ "$(wc -l <"$work/bare.out")" = 1 ] || fail "more than one line: $(cat "$work/bare.out")"
echo "4. no run directory mounted: exit 2, one line"
echo "PASSED in $(($(date +%s) - t0)) s"
