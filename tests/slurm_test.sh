#!/usr/bin/env bash
# Loom under a real Slurm (docs/deploy.md, "Slurm"): munge, slurmctld and two slurmd ("n1"
# and "n2", both on 127.0.0.1) started here, jobs submitted with deploy/slurm/loom.sbatch:
#   1. sbatch -N2 --ntasks-per-node=2: 4 ranks, 2 on each node (the bootstrap reads
#      SLURM_STEP_TASKS_PER_NODE's "2(x2)": job.threads = 0 gives each its node's half of
#      the cores), whose losses equal, bit for bit, the same deterministic run under
#      `loom launch -n 4`;
#   2. `scancel --signal=TERM` mid-run: every rank saves and stops, the script requeues the
#      job, and its second start resumes (--resume) losing no step: 60 steps in all, the
#      losses of an uninterrupted run;
#   3. one task SIGKILLed: the job ends failed, the survivors name rank 2, srun names the
#      task, and no process of the job is left.
# Before the daemons, a node list Loom cannot read is checked to be one line and exit 2.
# Every daemon is stopped by its PID at the end. Exit 77 (ctest: skipped) with the reason
# when Slurm or munge is not installed or the daemons cannot start here.
# Usage: slurm_test.sh LOOM SOURCE_DIR
set -uo pipefail
LOOM=$1 SRC=$2

skip() { echo "SKIPPED: $*"; exit 77; }
fail() { echo "FAILED: $*"; exit 1; }

TMP=$(mktemp -d /tmp/loom-slurm.XXXXXX)
chmod 755 "$TMP"
PIDS=()
cleanup() {
  # A job a failed check left running is cancelled (its tasks end) before the daemons stop.
  # Only this test's cluster (OUR_CONF), never one the environment names.
  if [ -n "${OUR_CONF:-}" ] && [ -n "$(SLURM_CONF=$OUR_CONF squeue -h 2>/dev/null)" ]; then
    SLURM_CONF=$OUR_CONF scancel --quiet --full $(SLURM_CONF=$OUR_CONF squeue -h -o %i 2>/dev/null) 2>/dev/null
    for i in $(seq 1 40); do [ -z "$(SLURM_CONF=$OUR_CONF squeue -h 2>/dev/null)" ] && break; sleep 0.25; done
  fi
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$TMP"
}
trap cleanup EXIT

# A small corpus and config (one thread a rank: 4 ranks on 2 cores).
source "$SRC/tests/support/nano_job.sh"
nano_corpus "$TMP" "$LOOM" || fail "data prepare"
nano_config "$TMP/nano.toml" "$TMP" "run_dir = \"$TMP/runs\"" ""

# Before any daemon: a node list Loom cannot read is one line naming it, exit 2, nothing written.
out=$(env SLURM_PROCID=0 SLURM_NTASKS=2 SLURM_JOB_ID=7 SLURM_JOB_NODELIST='n[1-' "$LOOM" train "$TMP/nano.toml" --job.name=bad 2>&1)
code=$?
[ "$code" = 2 ] || fail "a malformed SLURM_JOB_NODELIST exited $code: $out"
[ "$out" = "loom: error: SLURM_JOB_NODELIST='n[1-': not a Slurm node list (a '[' without its ']'; expected names and ranges such as node[01-04,07],gpu5)" ] ||
  fail "not the one line expected: $out"
[ ! -e "$TMP/runs/bad" ] || fail "a run directory was written"
echo "0. SLURM_JOB_NODELIST='n[1-': one line, exit 2, nothing written"

[ "$(id -u)" = 0 ] || skip "slurmd runs jobs as their user only as root (running as uid $(id -u))"
for tool in munged mungekey slurmctld slurmd sbatch squeue scancel scontrol; do
  command -v $tool >/dev/null || skip "$tool is not installed (scripts/setup.sh installs slurm-wlm and munge)"
done

# Ports from this shell's pid, so two runs at once do not meet.
base=$((21000 + ($$ % 400) * 4))
host=$(hostname)
mungekey --create --keyfile="$TMP/munge.key" || skip "mungekey cannot make a key"
chmod 600 "$TMP/munge.key"
munged -F -f --key-file="$TMP/munge.key" --socket="$TMP/munge.sock" --pid-file="$TMP/munged.pid" \
  --log-file="$TMP/munged.log" --seed-file="$TMP/munged.seed" >"$TMP/munged.out" 2>&1 &
PIDS+=($!)
for i in $(seq 1 50); do [ -S "$TMP/munge.sock" ] && break; sleep 0.1; done
[ -S "$TMP/munge.sock" ] || skip "munged did not start: $(tail -3 "$TMP/munged.log" 2>/dev/null)"

mkdir -p "$TMP/state" "$TMP/spool-n1" "$TMP/spool-n2"
cat >"$TMP/slurm.conf" <<EOF
ClusterName=loomtest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$base
AuthType=auth/munge
AuthInfo=socket=$TMP/munge.sock
CryptoType=crypto/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$TMP/state
SlurmdSpoolDir=$TMP/spool-%n
SlurmctldPidFile=$TMP/slurmctld.pid
SlurmdPidFile=$TMP/slurmd-%n.pid
SlurmctldLogFile=$TMP/slurmctld.log
SlurmdLogFile=$TMP/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
CommunicationParameters=NoInAddrAny,NoCtldInAddrAny
JobRequeue=1
NodeName=n1 NodeHostname=$host NodeAddr=127.0.0.1 Port=$((base + 1)) CPUs=2 State=UNKNOWN
NodeName=n2 NodeHostname=$host NodeAddr=127.0.0.1 Port=$((base + 2)) CPUs=2 State=UNKNOWN
PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
export SLURM_CONF=$TMP/slurm.conf
OUR_CONF=$SLURM_CONF
slurmctld -D -c >"$TMP/slurmctld.out" 2>&1 &
PIDS+=($!)
slurmd -D -N n1 >"$TMP/slurmd-n1.out" 2>&1 &
PIDS+=($!)
slurmd -D -N n2 >"$TMP/slurmd-n2.out" 2>&1 &
PIDS+=($!)
for i in $(seq 1 100); do
  [ "$(sinfo -h -o %t 2>/dev/null | sort -u)" = idle ] && break
  sleep 0.1
done
[ "$(sinfo -h -o %t 2>/dev/null | sort -u)" = idle ] ||
  skip "the Slurm daemons did not come up: $(tail -3 "$TMP/slurmctld.log" "$TMP/slurmd-n1.log" 2>/dev/null | tr '\n' ' ')"
echo "slurm: slurmctld and slurmd n1, n2 on 127.0.0.1:$base-$((base + 2))"

losses() { cut -d, -f1-2 "$1"; }  # {"step": N, "loss": X, one line per step
# The job's state as slurmctld has it (PENDING, RUNNING, COMPLETED, FAILED, ...); "" when
# it cannot say (a busy controller: the caller asks again).
state() { scontrol show job "$1" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2; }
wait_done() {  # wait_done JOB HALF_SECONDS: until the job has ended
  for i in $(seq 1 "$2"); do
    case "$(state "$1")" in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY) return 0 ;; esac
    sleep 0.5
  done
  fail "job $1 not done after $(($2 / 2)) s: $(state "$1"); $(cat "$TMP/job-$1.out"); $(tail -5 "$TMP/slurmctld.log")"
}
submit() {  # submit NAME STEPS [sbatch options...]: the job id
  local name=$1 steps=$2
  shift 2
  sbatch --parsable -N 2 ${tasks:---ntasks-per-node=2} -o "$TMP/job-%j.out" "$@" \
    --export=ALL,LOOM="$LOOM",MASTER_ADDR=127.0.0.1 "$SRC/deploy/slurm/loom.sbatch" "$TMP/nano.toml" \
    --quiet --job.name="$name" --training.steps="$steps" --debug.delay_ms=0:100 ${extra:-}
}

# 1. The same losses as loom launch -n 4.
"$LOOM" launch -n 4 -- "$LOOM" train "$TMP/nano.toml" --quiet --job.name=ref --training.steps=60 >"$TMP/ref.out" 2>&1 ||
  fail "loom launch: $(cat "$TMP/ref.out")"
# job.threads = 0 takes this node's share of the cores: 2 ranks a node, whatever sbatch's flags.
job=$(extra=--job.threads=0 submit one 6 --wait) || fail "sbatch --wait: $(cat "$TMP"/job-*.out)"
[ -f "$TMP/runs/one/metrics.jsonl" ] || fail "job $job wrote no metrics: $(cat "$TMP/job-$job.out")"
grep -q "4 tasks on n\[1-2\]" "$TMP/job-$job.out" || fail "job $job: not 4 tasks on n1 and n2: $(cat "$TMP/job-$job.out")"
[ "$(losses "$TMP/runs/one/metrics.jsonl")" = "$(losses "$TMP/runs/ref/metrics.jsonl" | head -6)" ] ||
  fail "the Slurm job's losses differ from loom launch's: $(losses "$TMP/runs/one/metrics.jsonl") vs $(losses "$TMP/runs/ref/metrics.jsonl" | head -6)"
threads=$(($(nproc) / 2))
[ "$threads" -ge 1 ] || threads=1
grep -q "\"threads\": $threads," "$TMP/runs/one/events.jsonl" ||
  fail "job $job: not $threads compute thread(s) a rank (2 local ranks on $(nproc) cores): $(cat "$TMP/runs/one/events.jsonl")"
# The same with -n 4 alone: Slurm sets no SLURM_NTASKS_PER_NODE, and the ranks still know
# they are 2 a node.
job=$(tasks="-n 4" extra=--job.threads=0 submit spread 2 --wait) || fail "sbatch -n 4 --wait: $(cat "$TMP/job-$job.out")"
grep -q "\"threads\": $threads," "$TMP/runs/spread/events.jsonl" ||
  fail "job $job (-N2 -n4): not $threads compute thread(s) a rank: $(cat "$TMP/runs/spread/events.jsonl")"
echo "1. sbatch -N2 --ntasks-per-node=2 (and -N2 -n4): 2 local ranks a node ($threads thread(s) each), losses equal to loom launch -n 4"

# 2. scancel --signal=TERM: a checkpoint, a requeue, a resume that loses no step.
job=$(submit pre 60) || fail "sbatch"
for i in $(seq 1 200); do
  [ "$({ wc -l <"$TMP/runs/pre/metrics.jsonl"; } 2>/dev/null || echo 0)" -ge 5 ] && break
  sleep 0.1
done
scancel --signal=TERM "$job" || fail "scancel --signal=TERM $job"
for i in $(seq 1 120); do
  scontrol show job "$job" 2>/dev/null | grep -q "Restarts=1" && [ "$(state "$job")" = PENDING ] && break
  sleep 0.25
done
grep -q "requeueing job $job to resume" "$TMP/job-$job.out" || fail "job $job was not requeued: $(cat "$TMP/job-$job.out")"
# Slurm holds a requeued job 2 minutes; a start within the same second as the requeue is
# refused ("Job credential revoked"), so 3 s from now.
scontrol update JobId="$job" StartTime=now+3 || fail "scontrol update StartTime"
wait_done "$job" 120
grep -q "start 2: .*--resume" "$TMP/job-$job.out" ||
  fail "job $job's second start did not resume: $(cat "$TMP/job-$job.out"); $(scontrol show job "$job"); $(tail -20 "$TMP/slurmctld.log")"
grep -q '"how": "resumed", "steps_lost": 0' "$TMP/runs/pre/events.jsonl" || fail "no resume without loss: $(cat "$TMP/runs/pre/events.jsonl")"
[ "$(losses "$TMP/runs/pre/metrics.jsonl")" = "$(losses "$TMP/runs/ref/metrics.jsonl")" ] ||
  fail "the preempted job's 60 losses differ from an uninterrupted run's"
echo "2. scancel --signal=TERM: job $job saved at step $(grep -o 'stopped on SIGTERM after step [0-9]*' "$TMP/job-$job.out" | grep -o '[0-9]*$'), requeued, resumed, 60 steps equal to an uninterrupted run"

# 3. A task killed: the job fails naming the rank; nothing of it is left.
# 600 steps (a minute at least: rank 0 waits 100 ms a step), so the kill lands mid-run even
# when a loaded machine starts the job late: with 60, one run under the full suite finished
# before the kill, and the test failed.
job=$(submit killed 600) || fail "sbatch"
for i in $(seq 1 600); do
  [ "$({ wc -l <"$TMP/runs/killed/metrics.jsonl"; } 2>/dev/null || echo 0)" -ge 3 ] && break
  sleep 0.1
done
[ "$({ wc -l <"$TMP/runs/killed/metrics.jsonl"; } 2>/dev/null || echo 0)" -ge 3 ] ||
  fail "job $job wrote no 3 steps in 60 s: $(cat "$TMP/job-$job.out")"
job_pids() {  # the processes whose environment says SLURM_JOB_ID=$1 (and, given, SLURM_PROCID=$2)
  for p in /proc/[0-9]*; do
    { env=$(tr '\0' '\n' <"$p/environ"); } 2>/dev/null || continue
    grep -qx "SLURM_JOB_ID=$1" <<<"$env" || continue
    [ -n "${2:-}" ] && { grep -qx "SLURM_PROCID=$2" <<<"$env" || continue; }
    [ "$(readlink "$p/exe" 2>/dev/null)" = "$(readlink -f "$LOOM")" ] || continue
    echo "${p#/proc/}"
  done
}
victim=$(job_pids "$job" 2)
[ -n "$victim" ] || fail "no loom process with SLURM_PROCID=2 in job $job"
kill -KILL $victim
wait_done "$job" 60
grep -q "rank 2 died" "$TMP/job-$job.out" || fail "the survivors did not name rank 2: $(cat "$TMP/job-$job.out")"
grep -q "task 2: Killed" "$TMP/job-$job.out" || fail "srun did not name task 2: $(cat "$TMP/job-$job.out")"
scontrol show job "$job" | grep -q "JobState=FAILED" || fail "job $job is not FAILED: $(scontrol show job "$job" | grep JobState)"
left=$(job_pids "$job")
[ -z "$left" ] || fail "processes of job $job left: $left"
echo "3. task 2 SIGKILLed: job $job FAILED, rank 2 named, no process left"
echo "PASSED"
