#!/usr/bin/env bash
# Two "hosts" on one machine: two network namespaces joined by a veth pair, 2 ranks each,
# started by `loom launch --nnodes 2` in each namespace (node 0 serves the store).
#   1. the collective sweep with transport auto: shm inside a host, tcp across, and the
#      hierarchical algorithm chosen for all_reduce / reduce / broadcast;
#   2. the sweep with transport tcp and the hierarchical algorithm forced;
#   3. a blackholed link (host B's veth goes down mid-all_reduce): the ranks on host A
#      must raise TimeoutError naming a rank of host B within the timeout plus 1 s, and
#      both launchers must exit non-zero;
#   4. an elastic job across the hosts: the coordinator on host A runs 2 ranks of a small
#      training run; a launcher on host B joins with one rank and the job grows to 3 at its
#      next checkpoint (rank 2 on host B, over tcp); that rank is SIGKILLed and the job
#      restarts on host A's 2 ranks from the latest checkpoint and finishes.
# Exit 77 (ctest: skipped) with the reason when namespaces cannot be made here.
# Usage: netns_test.sh LOOM COMM_SWEEP COMM_WORKER
set -uo pipefail
LOOM=$1 SWEEP=$2 WORKER=$3

skip() { echo "SKIPPED: $*"; exit 77; }
fail() { echo "FAILED: $*"; exit 1; }
[ "$(id -u)" = 0 ] || skip "creating network namespaces needs root (running as uid $(id -u))"
command -v ip >/dev/null || skip "iproute2's ip is not installed (scripts/setup.sh installs it)"

A=loomA$$ B=loomB$$ VA=lva$$ VB=lvb$$
TMP=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
  ip netns del "$A" 2>/dev/null
  ip netns del "$B" 2>/dev/null
  rm -rf "$TMP"
}
trap cleanup EXIT
ip netns add "$A" 2>"$TMP/err" || skip "ip netns add failed: $(cat "$TMP/err")"
ip netns add "$B" || fail "ip netns add $B"
ip link add "$VA" type veth peer name "$VB" 2>"$TMP/err" || skip "cannot create a veth pair: $(cat "$TMP/err")"
ip link set "$VA" netns "$A" && ip link set "$VB" netns "$B" || fail "moving the veth ends"
ip -n "$A" addr add 10.213.0.1/24 dev "$VA" && ip -n "$B" addr add 10.213.0.2/24 dev "$VB" || fail "addresses"
for ns in "$A" "$B"; do ip -n "$ns" link set lo up || fail "lo up in $ns"; done
ip -n "$A" link set "$VA" up && ip -n "$B" link set "$VB" up || fail "veth up"

head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$TMP/secret"
chmod 600 "$TMP/secret"
MASTER=10.213.0.1:29500

# start_job NAME VAR=VALUE... -- CMD...: one launcher per namespace, in the background.
start_job() {
  local name=$1 vars=()
  shift
  while [ "$1" != "--" ]; do vars+=("$1"); shift; done
  shift
  PIDS=()
  for node in 0 1; do
    local ns=$A
    [ $node = 1 ] && ns=$B
    ip netns exec "$ns" env LOOM_SECRET_FILE="$TMP/secret" "${vars[@]}" \
      "$LOOM" launch -n 2 --nnodes 2 --node-rank $node --master $MASTER -- "$@" \
      >"$TMP/$name.$node" 2>&1 &
    PIDS+=($!)
  done
}

# wait_job NAME LIMIT_S: waits for both launchers; sets RC0 and RC1.
wait_job() {
  local name=$1 limit=$2 end=$((SECONDS + $2))
  while kill -0 "${PIDS[0]}" 2>/dev/null || kill -0 "${PIDS[1]}" 2>/dev/null; do
    if [ $SECONDS -ge $end ]; then
      cat "$TMP/$name.0" "$TMP/$name.1"
      fail "$name: launchers still running after ${limit} s"
    fi
    sleep 0.1
  done
  wait "${PIDS[0]}"; RC0=$?
  wait "${PIDS[1]}"; RC1=$?
}

sweep() {
  local name=$1
  shift
  start_job "$name" "$@" -- "$SWEEP"
  wait_job "$name" 240
  if [ $RC0 != 0 ] || [ $RC1 != 0 ]; then
    cat "$TMP/$name.0" "$TMP/$name.1"
    fail "$name: launchers exited $RC0 and $RC1"
  fi
  grep -h "links" "$TMP/$name.0" "$TMP/$name.1"
  echo "ok: $name"
}

# 1 and 2: the sweep across hosts.
sweep sweep_auto LOOM_TEST_TRANSPORT=auto
grep -q "\[rank 0\] rank 0 of 4: links self shm tcp tcp" "$TMP/sweep_auto.0" ||
  fail "sweep_auto: rank 0 should reach rank 1 over shm and ranks 2, 3 over tcp"
sweep sweep_hier_tcp LOOM_TEST_TRANSPORT=tcp LOOM_TEST_ALGORITHM=hierarchical

# 3: blackhole host B's link while every rank loops on all_reduce.
TIMEOUT_MS=3000
start_job blackhole -- "$WORKER" --timeout-ms "$TIMEOUT_MS" loop 65536
for _ in $(seq 300); do
  [ "$(cat "$TMP/blackhole.0" "$TMP/blackhole.1" | grep -c READY)" = 4 ] && break
  sleep 0.1
done
[ "$(cat "$TMP/blackhole.0" "$TMP/blackhole.1" | grep -c READY)" = 4 ] || {
  cat "$TMP/blackhole.0" "$TMP/blackhole.1"
  fail "blackhole: ranks did not start"
}
sleep 0.5
T0=$(date +%s%3N)
ip -n "$B" link set "$VB" down || fail "link down"
wait_job blackhole 30
cat "$TMP/blackhole.0" "$TMP/blackhole.1"
[ $RC0 != 0 ] && [ $RC1 != 0 ] || fail "blackhole: launchers exited $RC0 and $RC1; both should fail"
# "[rank R] ERROR TimeoutError <unix_ms> <message naming rank 2 or 3>" from a rank on host A.
line=$(grep -E "^\[rank [01]\] ERROR TimeoutError [0-9]+ .*rank [23]" "$TMP/blackhole.0" | head -1)
[ -n "$line" ] || fail "blackhole: no rank on host A raised a TimeoutError naming rank 2 or 3"
t=$(echo "$line" | awk '{print $5}')
late=$((t - T0))
echo "first error on host A: ${late} ms after the link went down (timeout ${TIMEOUT_MS} ms)"
[ $late -le $((TIMEOUT_MS + 1000)) ] || fail "blackhole: error after ${late} ms, over timeout + 1 s"
echo "ok: blackhole"

# 4: an elastic job across the hosts (docs/launch.md, "Elastic jobs"), host B's link up again.
ip -n "$B" link set "$VB" up || fail "veth up again"
for _ in $(seq 400); do echo "the quick brown fox jumps over the lazy dog $RANDOM"; done >"$TMP/corpus.txt"
"$LOOM" data prepare "text:$TMP/corpus.txt" --out "$TMP/tok.bin" >/dev/null || fail "elastic: data prepare"
printf '[job]\nname = "el"\nrun_dir = "%s"\nthreads = 1\n[model]\npreset = "gpt-nano"\n[data]\ntrain = "%s"\n[training]\nsteps = 400\nglobal_batch = 6\nmicro_batch = 1\neval_every = 0\n[checkpoint]\nevery = 3\n' \
  "$TMP/runs" "$TMP/tok.bin" >"$TMP/el.toml"
TRAIN=("$LOOM" train "$TMP/el.toml" --quiet)
ip netns exec "$A" env LOOM_SECRET_FILE="$TMP/secret" "$LOOM" launch -n 2:3 --max-restarts 1 \
  --local 2 --master 10.213.0.1:29501 -- "${TRAIN[@]}" --debug.delay_ms=0:20 >"$TMP/el.0" 2>&1 &
PIDS=($!)
for _ in $(seq 300); do [ -s "$TMP/runs/el/metrics.jsonl" ] && break; sleep 0.1; done
ip netns exec "$B" env LOOM_SECRET_FILE="$TMP/secret" "$LOOM" launch --join --local 1 --master 10.213.0.1:29501 \
  -- "${TRAIN[@]}" >"$TMP/el.1" 2>&1 &
PIDS+=($!)
victim=
for _ in $(seq 600); do
  for p in $(pgrep -P "${PIDS[1]}"); do tr '\0' '\n' </proc/$p/environ 2>/dev/null | grep -qx RANK=2 && victim=$p; done
  [ -n "$victim" ] && break
  sleep 0.05
done
[ -n "$victim" ] || { cat "$TMP/el.0" "$TMP/el.1"; fail "elastic: the job never ran a rank on host B"; }
sleep 1
kill -KILL "$victim"
wait_job el 120
cat "$TMP/el.0" "$TMP/el.1"
[ $RC0 = 0 ] && [ $RC1 = 0 ] || fail "elastic: launchers exited $RC0 and $RC1"
grep -q "generation 1: 3 rank(s) (resize" "$TMP/el.0" || fail "elastic: the job did not grow to 3 across the hosts"
grep -q "restart 1 of 1: rank 2 (pid $victim) failed with signal 9; its slot is retired" "$TMP/el.0" ||
  fail "elastic: the kill on host B did not restart the job"
grep -q "generation 2: 2 rank(s)" "$TMP/el.0" || fail "elastic: the job did not go on with host A's 2 ranks"
[ "$(wc -l <"$TMP/runs/el/metrics.jsonl")" = 400 ] || fail "elastic: the run did not finish its 400 steps"
echo "ok: elastic"
