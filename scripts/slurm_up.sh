#!/usr/bin/env bash
# A one-node Slurm cluster on this machine for the Slurm runner's tests (CPU-only trials).
#
#   scripts/slurm_up.sh          install (apt-get, only if missing) and start munge, slurmctld, slurmd
#   scripts/slurm_up.sh stop     stop the daemons this script started (by their pid files)
#   scripts/slurm_up.sh env      print the `export SLURM_CONF=...` line for a shell
#
# Idempotent: a second call finds the daemons answering and does nothing. The configuration is
# private (DSE_SLURM_DIR, default /tmp/dse-slurm): the system's /etc/slurm is left alone; clients
# find it through SLURM_CONF. Needs root (munged runs as the munge user, slurm as root).
set -euo pipefail
DIR=${DSE_SLURM_DIR:-/tmp/dse-slurm}
CONF=$DIR/slurm.conf
export SLURM_CONF=$CONF

stop() {
  # wait for each daemon to exit: a dying daemon removes its pid file, which must not be the
  # file of the next one
  for f in "$DIR/slurmd.pid" "$DIR/slurmctld.pid"; do
    if [ -s "$f" ]; then
      pid=$(cat "$f")
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 100); do
        kill -0 "$pid" 2>/dev/null || break
        [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" = Z ] && break
        sleep 0.1
      done
      kill -9 "$pid" 2>/dev/null || true
      rm -f "$f"
    fi
  done
}

case "${1:-up}" in
  stop) stop; exit 0 ;;
  env) echo "export SLURM_CONF=$CONF"; exit 0 ;;
  up) ;;
  *) echo "usage: $0 [up|stop|env]" >&2; exit 2 ;;
esac

if [ "$(id -u)" != 0 ]; then
  echo "slurm_up.sh: needs root to start munged/slurmd" >&2
  exit 1
fi

if [ -f "$CONF" ] && timeout 10 scontrol ping 2>/dev/null | grep -q "is UP" \
   && timeout 10 sinfo -h -o %T 2>/dev/null | grep -Eq "^(idle|mixed|allocated)$"; then
  exit 0  # already running
fi

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null \
   || ! command -v sbatch >/dev/null || ! command -v munged >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurmctld slurmd slurm-client munge >/dev/null
fi

# --- MUNGE ---------------------------------------------------------------------------------
mkdir -p /etc/munge /run/munge /var/lib/munge /var/log/munge
if [ ! -s /etc/munge/munge.key ]; then
  dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
fi
chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge
chmod 700 /etc/munge
chmod 400 /etc/munge/munge.key
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  su -s /bin/sh munge -c /usr/sbin/munged
  for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.2; done
fi

# --- Slurm ---------------------------------------------------------------------------------
HOST=$(hostname -s)
CPUS=$(nproc)
# declare at least 8 CPUs so that several 1-CPU trials fit at once (config_overrides lets
# slurmd accept a configuration larger than the hardware)
SLOTS=$(( CPUS > 8 ? CPUS : 8 ))
MEM=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / 2 ))
mkdir -p "$DIR/spool/d" "$DIR/spool/ctld" "$DIR/log"
cat > "$CONF" <<EOF
ClusterName=dse-test
SlurmctldHost=$HOST
AuthType=auth/munge
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
SlurmctldPort=${DSE_SLURMCTLD_PORT:-6917}
SlurmdPort=${DSE_SLURMD_PORT:-6918}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmdSpoolDir=$DIR/spool/d
StateSaveLocation=$DIR/spool/ctld
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
MinJobAge=600
KillWait=5
OverTimeLimit=0
InactiveLimit=0
MessageTimeout=20
NodeName=$HOST CPUs=$SLOTS RealMemory=$MEM State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF
stop
slurmctld -c 2>/dev/null || slurmctld
slurmd
for _ in $(seq 100); do
  if sinfo -h -o %T 2>/dev/null | grep -Eq "^(idle|mixed|allocated)"; then
    echo "slurm up: $(sinfo -h -o '%N %T %c CPUs') (SLURM_CONF=$CONF)"
    exit 0
  fi
  # a node left drained/down by an earlier run: bring it back
  scontrol update nodename="$HOST" state=resume >/dev/null 2>&1 || true
  sleep 0.3
done
echo "slurm_up.sh: the node did not come up; see $DIR/log" >&2
exit 1
