#!/usr/bin/env bash
# slurm_e2e.sh - the sbatch script of hpdlrun --sbatch run by a real SLURM:
# munged, slurmctld and slurmd started on this machine as one node (a
# minimal slurm.conf in a temporary folder), gpt2-tiny compiled for 2 CPU
# ranks, its script submitted with sbatch, waited for (bounded), and its
# output read: the losses of both ranks' steps, and hpdlrun's end line. The
# daemons are stopped on every way out (trap), by the pids this script
# started. Skips (77) saying why where the daemons cannot start: not root,
# no SLURM or munge installed (scripts/setup.sh), or a daemon that does not
# come up.
#
#   slurm_e2e.sh BUILD/bin WORK
set -u
BIN=$(cd "$1" && pwd)
WORK=$2
SRC=$(cd "$(dirname "$0")/../.." && pwd)
DEADLINE=${HPDL_SLURM_TIMEOUT:-90} # seconds for the whole job once submitted

skip() { echo "skipped: $*"; exit 77; }
fail() {
  echo "FAIL: $*"
  for f in "$T"/*.log "$T"/job/*.out; do [ -f "$f" ] && { echo "--- $f"; tail -n 30 "$f"; }; done
  exit 1
}

[ "$(id -u)" = 0 ] || skip "slurmd runs jobs as their users only when root; run as root"
for p in munged slurmctld slurmd sbatch squeue scontrol; do
  command -v "$p" >/dev/null 2>&1 || skip "no $p (scripts/setup.sh installs slurm-wlm and munge)"
done
pmix=0
for f in /usr/lib/*/slurm-wlm/mpi_pmix.so /usr/lib/slurm-wlm/mpi_pmix.so /usr/lib/slurm/mpi_pmix.so; do [ -f "$f" ] && pmix=1; done
[ "$pmix" = 1 ] || skip "SLURM has no PMIx plugin (mpi_pmix.so): srun cannot start Open MPI ranks"

rm -rf "$WORK"
mkdir -p "$WORK"
T=$(cd "$WORK" && pwd)
mkdir -p "$T/state" "$T/spool" "$T/job" "$T/munge"
chmod 700 "$T/munge"
pids=()
# Processes of this test's SLURM: working in or holding a file of $T (a job
# step's slurmstepd outlives slurmd by design; its socket is in the spool).
# A slurmstepd that has ended may stay a zombie until PID 1 reaps it: dead,
# holding nothing, and not listed here.
ours() {
  local d
  for d in /proc/[0-9]*; do
    [ "${d#/proc/}" = $$ ] && continue
    ls -l "$d/cwd" "$d/fd" 2>/dev/null | grep -qF -- "$T/" && echo "${d#/proc/}"
  done
}
cleanup() {
  cd / || true
  # the jobs first, and their steps given a few seconds to end
  for j in ${JOBS:-}; do SLURM_CONF=$T/slurm.conf timeout 5 scancel "$j" >/dev/null 2>&1; done
  for _ in $(seq 50); do ls "$T"/spool/hpdlnode_* >/dev/null 2>&1 || break; sleep 0.1; done
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
  for pid in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null
  done
  local left
  for _ in $(seq 30); do
    left=$(ours)
    [ -z "$left" ] && break
    sleep 0.2
  done
  if [ -n "$left" ]; then
    echo "slurm: stopping what is left of this test's SLURM: $(echo $left)"
    kill -9 $left 2>/dev/null
  fi
}
trap cleanup EXIT
trap 'exit 1' INT TERM

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# munge: a key of our own and a socket in the folder
dd if=/dev/urandom of="$T/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$T/munge/munge.key"
munged --foreground --force --key-file="$T/munge/munge.key" --socket="$T/munge/munge.sock" \
  --pid-file="$T/munge/munged.pid" --log-file="$T/munged.log" --seed-file="$T/munge/seed" >"$T/munged.out" 2>&1 &
pids+=($!)
for _ in $(seq 50); do [ -S "$T/munge/munge.sock" ] && break; sleep 0.1; done
[ -S "$T/munge/munge.sock" ] || { cat "$T/munged.out" "$T/munged.log" 2>/dev/null; skip "munged did not start"; }

CPUS=$(nproc)
MEM=$(awk '/MemTotal/ { print int($2 / 1024 / 2) }' /proc/meminfo)
CTLD_PORT=$(free_port)
SLURMD_PORT=$(free_port)
cat >"$T/slurm.conf" <<EOF
ClusterName=hpdltest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$T/munge/munge.sock
CredType=cred/munge
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd.pid
SlurmctldLogFile=$T/slurmctld.log
SlurmdLogFile=$T/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SlurmctldTimeout=30
SlurmdTimeout=30
KillWait=5
NodeName=hpdlnode NodeHostname=$(hostname) NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM State=UNKNOWN
PartitionName=debug Nodes=hpdlnode Default=YES MaxTime=10 State=UP OverSubscribe=NO
EOF
export SLURM_CONF=$T/slurm.conf

slurmctld -D -i -f "$T/slurm.conf" >"$T/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D -N hpdlnode -f "$T/slurm.conf" >"$T/slurmd.out" 2>&1 &
pids+=($!)
up=0
for _ in $(seq 100); do
  state=$(timeout 5 sinfo -h -n hpdlnode -o %t 2>/dev/null)
  case $state in idle*|mix*|alloc*) up=1; break ;; esac
  sleep 0.2
done
if [ "$up" != 1 ]; then
  for f in "$T"/slurmctld.out "$T"/slurmd.out "$T"/slurmctld.log "$T"/slurmd.log; do
    [ -f "$f" ] && { echo "--- $f"; tail -n 15 "$f"; }
  done
  skip "slurmctld and slurmd did not bring the node up (state '${state:-none}')"
fi
echo "slurm: node hpdlnode up with $CPUS CPUs"

# gpt2-tiny on 2 CPU ranks, a few steps of synthetic bytes
cd "$T/job" || exit 1
"$BIN/hpdl-data" --synthetic 60000 --seed 5 -o data/tiny >/dev/null || fail "hpdl-data"
"$BIN/hpdlc" compile "$SRC/samples/gpt2-tiny.hpd" -q --dp 2 -D T=32 --micro-batch 4 --global-batch 16 -o art ||
  fail "hpdlc compile"
"$BIN/hpdlrun" --sbatch art -o job.sbatch --job-name hpdl-e2e --time 5:00 --cpus-per-task 1 --mpi pmix \
  --steps 6 --log-every 1 --data 'data/tiny_train_*.bin' --checkpoint-dir ck --progress plain || fail "hpdlrun --sbatch"
job_state() { timeout 5 scontrol show job "$1" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p'; }
# wait_job JOB: until it has ended (bounded); its state in $state
wait_job() {
  local end=$((SECONDS + DEADLINE))
  while [ $SECONDS -lt $end ]; do
    state=$(job_state "$1")
    case $state in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|PREEMPTED|BOOT_FAIL|DEADLINE) return ;; esac
    sleep 0.5
  done
}

# 1. A whole run: 6 steps on 2 ranks.
JOB=$(sbatch --parsable job.sbatch) || fail "sbatch job.sbatch"
JOB=${JOB%%;*}
JOBS="$JOB"
echo "slurm: submitted job $JOB"
state=""
wait_job "$JOB"
out="$T/job/hpdl-e2e-$JOB.out"
echo "slurm: job $JOB: ${state:-unknown}"
[ -f "$out" ] && cat "$out"
[ "$state" = COMPLETED ] || fail "job $JOB ended ${state:-not within $DEADLINE s}"
grep -q "2 ranks (dp=2" "$out" || fail "the job did not run 2 ranks"
grep -Eq "step +6/6 \| loss [0-9.]+" "$out" || fail "no loss of step 6 in the job's output"
grep -q "hpdlrun: done: steps 1..6" "$out" || fail "no end line in the job's output"
[ -f ck/step-00000006.json ] || fail "no checkpoint of step 6"
echo "ok: the sbatch script trained gpt2-tiny on 2 ranks under SLURM"

# 2. The time limit's warning (the SIGUSR1 of --signal=B:USR1@120, sent here
# at once with scancel): the ranks checkpoint and stop, the script requeues
# the job, and its second run resumes from the checkpoint to the end.
"$BIN/hpdlrun" --sbatch art -o slow.sbatch --job-name hpdl-requeue --time 5:00 --cpus-per-task 1 --mpi pmix \
  --steps 40 --log-every 1 --data 'data/tiny_train_*.bin' --checkpoint-dir ck2 --progress plain 2>/dev/null ||
  fail "hpdlrun --sbatch"
JOB=$(HPDL_FAULT=step-sleep-ms=150 sbatch --parsable slow.sbatch) || fail "sbatch slow.sbatch"
JOB=${JOB%%;*}
JOBS="$JOBS $JOB"
out="$T/job/hpdl-requeue-$JOB.out"
echo "slurm: submitted job $JOB (40 steps of 150 ms or more)"
end=$((SECONDS + DEADLINE))
until grep -q "^step  *3/40" "$out" 2>/dev/null; do
  [ $SECONDS -lt $end ] || fail "job $JOB did not reach step 3"
  sleep 0.2
done
scancel --batch --signal=USR1 "$JOB" || fail "scancel --signal=USR1"
echo "slurm: sent the time limit's SIGUSR1 to job $JOB"
# requeued: the first run ends and the job waits. SLURM holds a requeued job
# back (its BeginTime some 2 minutes on); here it is made eligible at once.
end=$((SECONDS + DEADLINE))
until grep -q "requeueing job $JOB" "$out" 2>/dev/null && [ "$(job_state "$JOB")" = PENDING ]; do
  [ $SECONDS -lt $end ] || { cat "$out"; fail "job $JOB was not requeued"; }
  sleep 0.2
done
timeout 5 scontrol show job "$JOB" | grep -Eo "(Restarts|BeginTime|Reason)=[^ ]*" | tr '\n' ' '
echo
scontrol update JobId="$JOB" StartTime=now || fail "scontrol update StartTime=now"
wait_job "$JOB"
cat "$out"
echo "slurm: job $JOB: ${state:-unknown}, $(timeout 5 scontrol show job "$JOB" | grep -o 'Restarts=[0-9]*')"
[ "$state" = COMPLETED ] || fail "job $JOB ended ${state:-not within $DEADLINE s}"
grep -q "the ranks stopped (status 143); requeueing job $JOB" "$out" || fail "the script did not requeue the job"
stopped=$(sed -n 's/.*SIGTERM: stopped after step \([0-9]*\) of 40.*/\1/p' "$out" | head -n 1)
[ -n "$stopped" ] || fail "the ranks did not say where they stopped"
grep -q "hpdlrun: done: steps $((stopped + 1))..40" "$out" || fail "the second run did not go on from step $stopped"
echo "ok: stopped at step $stopped by the time limit's signal, requeued, resumed and finished"
