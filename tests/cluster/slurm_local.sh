#!/usr/bin/env bash
# A real one-node SLURM cluster on this machine for the cluster tests: munged, slurmctld and slurmd with a
# generated config (the node's CPUs, a few GiB), everything (config, sockets, state, logs) under STATE_DIR.
#
#   tests/cluster/slurm_local.sh start STATE_DIR   # prints `export SLURM_CONF=...`; waits until the node is idle
#   tests/cluster/slurm_local.sh stop STATE_DIR    # stops the three daemons it started (by their pid files)
#
# Needs root (slurmd runs jobs as their submitting user) and Debian's packages:
#   apt-get update && apt-get install -y slurm-wlm munge
# Environment: SLURM_TEST_CPUS (default 2), SLURM_TEST_MEMORY_MB (default 4096), SLURM_TEST_PORT (default 16817,
# slurmd uses the next port), SLURM_TEST_KILL_WAIT (seconds between SIGTERM and SIGKILL, default 30 as SLURM's),
# SLURM_TEST_NODES (default 1): with 2 or more, that many nodes n1..nN on this host, one slurmd each (`slurmd -N`,
# on the ports after slurmctld's), all at 127.0.0.1: jobs that span "nodes" (their names do not resolve: such a job
# sets MASTER_ADDR=127.0.0.1).
set -euo pipefail

action=${1:?usage: slurm_local.sh start|stop STATE_DIR}
state=$(realpath -m "${2:?usage: slurm_local.sh start|stop STATE_DIR}")
host=$(hostname -s)

stop_pidfile() {
    local file=$1
    [[ -s $file ]] || return 0
    local pid
    pid=$(cat "$file")
    if kill -0 "$pid" 2>/dev/null; then
        kill "$pid"
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    fi
    rm -f "$file"
}

if [[ $action == stop ]]; then
    if [[ -f $state/slurm.conf ]]; then
        SLURM_CONF=$state/slurm.conf scancel --full --quiet --user="$(id -un)" 2>/dev/null || true
    fi
    stop_pidfile "$state/slurmd.pid"
    for file in "$state"/slurmd-n*.pid; do [[ -e $file ]] && stop_pidfile "$file"; done
    stop_pidfile "$state/slurmctld.pid"
    stop_pidfile "$state/munged.pid"
    exit 0
fi
[[ $action == start ]] || { echo "slurm_local.sh: unknown action $action" >&2; exit 2; }

for tool in munged slurmctld slurmd sinfo; do
    command -v "$tool" >/dev/null || { echo "slurm_local.sh: $tool not found (apt-get install -y slurm-wlm munge)" >&2; exit 2; }
done
[[ $(id -u) == 0 ]] || { echo "slurm_local.sh: needs root (slurmd)" >&2; exit 2; }

cpus=${SLURM_TEST_CPUS:-2}
memory=${SLURM_TEST_MEMORY_MB:-4096}
port=${SLURM_TEST_PORT:-16817}
kill_wait=${SLURM_TEST_KILL_WAIT:-30}
nodes=${SLURM_TEST_NODES:-1}
mkdir -p "$state"/{munge,ctld,spool}
chmod 700 "$state/munge"

# munge: our own key and socket, so nothing of the system's munge is touched
[[ -s $state/munge/munge.key ]] || { dd if=/dev/urandom of="$state/munge/munge.key" bs=1024 count=1 status=none; chmod 400 "$state/munge/munge.key"; }
munged --force --key-file="$state/munge/munge.key" --socket="$state/munge/munge.socket" \
    --pid-file="$state/munged.pid" --log-file="$state/munged.log" --seed-file="$state/munge/munge.seed"

: > "$state/plugstack.conf"
if (( nodes > 1 )); then  # several slurmd on this host: one name, port, spool, pid and log each (%n: the node)
    node_names="n[1-$nodes]"
    node_lines="NodeName=$node_names NodeHostname=$host NodeAddr=127.0.0.1 Port=$((port + 1))-$((port + nodes))"
    node_lines+=" CPUs=$cpus RealMemory=$memory State=UNKNOWN"
    node_suffix="-%n"
    spool_suffix="/%n"
    for n in $(seq "$nodes"); do mkdir -p "$state/spool/n$n"; done
else
    node_names=$host
    node_lines="NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$memory State=UNKNOWN"
    node_suffix=""
    spool_suffix=""
fi
cat > "$state/slurm.conf" <<CONF
ClusterName=autotune-test
SlurmctldHost=$host
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/munge
AuthInfo=socket=$state/munge/munge.socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/spool$spool_suffix
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd$node_suffix.pid
SlurmctldLogFile=$state/slurmctld.log
SlurmdLogFile=$state/slurmd$node_suffix.log
PlugStackConfig=$state/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
KillWait=$kill_wait
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmctldTimeout=30
SlurmdTimeout=60
InactiveLimit=0
MinJobAge=30
$node_lines
PartitionName=debug Nodes=$node_names Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF

export SLURM_CONF=$state/slurm.conf
slurmctld -f "$SLURM_CONF" -c    # -c: a clean state (no jobs from an earlier run)
if (( nodes > 1 )); then
    for n in $(seq "$nodes"); do slurmd -f "$SLURM_CONF" -N "n$n"; done
else
    slurmd -f "$SLURM_CONF"
fi
for _ in $(seq 100); do
    if (( $(sinfo -h -N -o '%T' 2>/dev/null | grep -cE '^(idle|mixed)$') >= nodes )); then
        echo "export SLURM_CONF=$SLURM_CONF"
        exit 0
    fi
    sleep 0.2
done
echo "slurm_local.sh: the node did not become idle; see $state/slurmctld.log and $state/slurmd.log" >&2
sinfo -N >&2 || true
exit 1
