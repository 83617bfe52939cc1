#!/usr/bin/env bash
# The Kubernetes manifests (deploy/k8s, docs/deploy.md "Kubernetes") without a cluster: they
# are rendered for 2 ranks, tests/k8s_pods.py checks every field Loom reads (rank from the
# completion index, world size, rank 0's address through the headless Service, the secret
# file and its mode, the preemption exit code the failure policy ignores, --resume-if-saved)
# and gives each pod's environment and command, and the pods run here as processes with
# exactly that environment (their volumes under a temporary directory):
#   1. they train together: losses equal to `loom launch -n 2`'s, bit for bit;
#   2. SIGTERM to one pod (preemption): both save and exit 143; started again as the Job
#      would, they resume and end as an uninterrupted run does;
#   3. manifests with a wrong field are refused by the checker, naming it.
# Exit 77 (skipped) without python3's yaml module.
# Usage: k8s_test.sh LOOM SOURCE_DIR
set -uo pipefail
LOOM=$1 SRC=$2
skip() { echo "SKIPPED: $*"; exit 77; }
fail() { echo "FAILED: $*"; exit 1; }
python3 -c "import yaml" 2>/dev/null || skip "python3's yaml module is not installed (scripts/setup.sh installs python3-yaml)"

TMP=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
  rm -rf "$TMP"
}
trap cleanup EXIT
ROOT=$TMP/pods
mkdir -p "$ROOT/config" "$ROOT/secret" "$ROOT/runs"
"$SRC/deploy/k8s/render.sh" --ranks 2 --image loom:test >"$TMP/manifests.yaml" || fail "render.sh"
python3 "$SRC/tests/k8s_pods.py" "$ROOT" <"$TMP/manifests.yaml" >"$TMP/pods.jsonl" || fail "the manifests: $(cat "$TMP/pods.jsonl")"
[ "$(wc -l <"$TMP/pods.jsonl")" = 2 ] || fail "expected 2 pods: $(cat "$TMP/pods.jsonl")"

# The Secret's file (0400, as defaultMode gives it) and the ConfigMap's train.toml.
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$ROOT/secret/secret"
chmod 400 "$ROOT/secret/secret"
source "$SRC/tests/support/nano_job.sh"
nano_corpus "$TMP" "$LOOM" || fail "data prepare"
config() {  # config NAME STEPS: the ConfigMap's train.toml
  nano_config "$ROOT/config/train.toml" "$TMP" "name = \"$1\"" "steps = $2" $'[debug]\ndelay_ms = "0:100"'
}
# Every pod at once, each with its environment and nothing else (PATH aside).
start_pods() {
  PIDS=()
  while IFS= read -r pod; do
    python3 -c 'import json, os, sys
p = json.loads(sys.argv[1])
os.execve(sys.argv[2], [sys.argv[2]] + p["argv"][1:], dict(p["env"], PATH=os.environ["PATH"]))' "$pod" "$LOOM" \
      >"$TMP/pod-$((${#PIDS[@]})).out" 2>&1 &
    PIDS+=($!)
  done <"$TMP/pods.jsonl"
}
wait_pods() {  # sets codes: the exit statuses, space-separated
  local all=()
  for p in "${PIDS[@]}"; do
    wait "$p"
    all+=($?)
  done
  PIDS=()
  codes="${all[*]}"
}
losses() { cut -d, -f1-2 "$1"; }

# 1. Two pods train together as loom launch -n 2 does.
config one 6
start_pods
wait_pods
[ "$codes" = "0 0" ] || fail "pods exited $codes: $(cat "$TMP"/pod-*.out)"
"$LOOM" launch -n 2 -- "$LOOM" train "$ROOT/config/train.toml" --quiet --job.run_dir="$TMP/ref" --training.steps=40 \
  --debug.delay_ms= >"$TMP/ref.out" 2>&1 || fail "loom launch: $(cat "$TMP/ref.out")"
[ "$(losses "$ROOT/runs/one/metrics.jsonl")" = "$(losses "$TMP/ref/one/metrics.jsonl" | head -6)" ] ||
  fail "the pods' losses differ from loom launch's"
grep -q '"world": 2' "$ROOT/runs/one/events.jsonl" || fail "not a world of 2: $(cat "$ROOT/runs/one/events.jsonl")"
echo "1. 2 pods (rank from the completion index, rank 0 through the Service, the Secret's file): losses equal to loom launch -n 2"

# 2. Preemption: SIGTERM to pod 1; both save and exit 143; the pods come back and resume.
config pre 40
start_pods
for i in $(seq 1 200); do
  [ "$({ wc -l <"$ROOT/runs/pre/metrics.jsonl"; } 2>/dev/null || echo 0)" -ge 5 ] && break
  sleep 0.1
done
kill -TERM "${PIDS[1]}"
wait_pods
[ "$codes" = "143 143" ] || fail "preempted pods exited $codes, not 143 143: $(cat "$TMP"/pod-*.out)"
grep -q "stopped on SIGTERM after step" "$TMP/pod-0.out" || fail "pod 0 did not report its save: $(cat "$TMP/pod-0.out")"
start_pods
wait_pods
[ "$codes" = "0 0" ] || fail "the pods that came back exited $codes: $(cat "$TMP"/pod-*.out)"
grep -q '"how": "resumed", "steps_lost": 0' "$ROOT/runs/pre/events.jsonl" || fail "no resume: $(cat "$ROOT/runs/pre/events.jsonl")"
[ "$(losses "$ROOT/runs/pre/metrics.jsonl")" = "$(losses "$TMP/ref/one/metrics.jsonl" )" ] ||
  fail "the preempted run's 40 losses differ from an uninterrupted run's"
echo "2. SIGTERM to a pod: both saved and exited 143 (ignored by the failure policy); back again, they resumed: 40 steps as uninterrupted"

# 3. The checker refuses what would break Loom.
refused() {  # refused SED-EXPRESSION WHAT
  sed "$1" "$TMP/manifests.yaml" | python3 "$SRC/tests/k8s_pods.py" "$ROOT" >/dev/null 2>"$TMP/err" &&
    fail "k8s_pods.py took manifests with $2"
  grep -q "k8s_pods.py: " "$TMP/err" || fail "no reason given for $2: $(cat "$TMP/err")"
}
refused 's/defaultMode: 0400/defaultMode: 0644/' "a world-readable secret"
refused 's/value: loom-train-0.loom-train/value: loom-train-1.loom-train/' "MASTER_ADDR on rank 1's pod"
refused 's/ "--resume-if-saved",//' "no --resume-if-saved"
refused 's/values: \[143\]/values: [1]/' "a failure policy that counts preemptions"
refused '/completionMode: Indexed/d' "a Job that is not Indexed"
echo "3. manifests with a readable secret, a wrong rank 0 address, no resume, a counting failure policy or no index are refused"
echo "PASSED"
