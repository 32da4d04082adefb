#!/bin/sh
# cluster.sh — a one-node Slurm cluster of our own for the slurm tests:
#   cluster.sh start DIR   munged, slurmctld and slurmd with every file under DIR
#   cluster.sh stop DIR    stops them (and anything a test left in the queue)
#
# Nothing outside DIR is touched: the munge key, socket and seed, the
# Slurm config, state and spool directories, logs and pid files all live
# there; the ports are chosen free at start. The node is this machine
# (NodeName must equal `hostname -s`: slurmd finds itself by it). Test
# code reaches the cluster through DIR/env (SLURM_CONF). Works as root on a
# fresh CI machine: the daemons run as the invoking user (SlurmUser is the
# current user), so no slurm account or system service is needed.
set -eu
cmd=${1:?usage: cluster.sh start|stop DIR}
dir=${2:?usage: cluster.sh start|stop DIR}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)

pid_of() { [ -s "$1" ] && cat "$1" 2>/dev/null || true; }

stop() {
    if [ -f "$dir/slurm.conf" ]; then
        SLURM_CONF="$dir/slurm.conf" scancel --quiet --user="$(id -un)" 2>/dev/null || true
    fi
    # slurmd first (it ends its job steps), then slurmctld, then munged.
    for p in slurmd slurmctld munged; do
        pid=$(pid_of "$dir/$p.pid")
        [ -n "$pid" ] || continue
        kill "$pid" 2>/dev/null || true
        i=0
        while kill -0 "$pid" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
        kill -9 "$pid" 2>/dev/null || true
        rm -f "$dir/$p.pid"
    done
    # Job steps slurmstepd left (it outlives slurmd by design): ours carry
    # the config path in their environment.
    for p in $(pgrep -x slurmstepd || true); do
        if tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "SLURM_CONF=$dir/slurm.conf"; then
            kill -9 "$p" 2>/dev/null || true
        fi
    done
}

# A free TCP port (the kernel picks one; a race with another process
# taking it before the daemon binds is possible but not likely).
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

wait_for() { # seconds, command...
    t=$(($1 * 10)); shift
    i=0
    while ! "$@" >/dev/null 2>&1; do
        i=$((i + 1))
        if [ $i -ge $t ]; then return 1; fi
        sleep 0.1
    done
}

start() {
    stop
    user=$(id -un)
    host=$(hostname -s)
    rm -rf "$dir/ctld" "$dir/spool" "$dir/munge"
    mkdir -p "$dir/ctld" "$dir/spool" "$dir/munge" "$dir/log"
    chmod 0700 "$dir/munge"
    dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 2>/dev/null
    chmod 0400 "$dir/munge/munge.key"
    munged --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
        --pid-file="$dir/munged.pid" --seed-file="$dir/munge/munged.seed" \
        --log-file="$dir/log/munged.log"
    wait_for 10 test -S "$dir/munge/munge.socket" || { echo "munged did not start" >&2; cat "$dir/log/munged.log" >&2; exit 1; }
    cpus=$(slurmd -C | sed -n 's/.*CPUs=\([0-9]*\).*/\1/p' | head -1)
    # At least 4 CPUs whatever the machine has (config_overrides lets slurmd
    # accept the difference): a 2-rank job and a 1-rank one fit at once.
    [ "$cpus" -ge 4 ] || cpus=4
    mem=$(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' | head -1)
    cat > "$dir/slurm.conf" <<CONF
ClusterName=trainyard-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=$user
SlurmdUser=$user
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
StateSaveLocation=$dir/ctld
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
PlugStackConfig=$dir/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=1
EnforcePartLimits=ALL
MinJobAge=600
KillWait=5
SlurmdTimeout=300
SlurmdParameters=config_overrides
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=ty Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
    : > "$dir/plugstack.conf"
    echo "SLURM_CONF=$dir/slurm.conf" > "$dir/env"
    export SLURM_CONF="$dir/slurm.conf"
    slurmctld -i -f "$dir/slurm.conf"
    wait_for 20 scontrol ping || { echo "slurmctld did not answer" >&2; tail -20 "$dir/log/slurmctld.log" >&2; stop; exit 1; }
    slurmd -f "$dir/slurm.conf"
    if ! wait_for 30 sh -c "sinfo -h -N -o '%T' | grep -qx idle"; then
        echo "the node did not become idle:" >&2
        sinfo -N >&2 || true
        tail -20 "$dir/log/slurmd.log" >&2
        stop
        exit 1
    fi
}

case "$cmd" in
start) start ;;
stop) stop ;;
*) echo "usage: cluster.sh start|stop DIR" >&2; exit 2 ;;
esac
