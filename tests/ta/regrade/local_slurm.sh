#!/bin/sh
# A working single-node Slurm cluster on this machine, for `make slurm-tests`: Debian's
# slurm-wlm and munge, accounting off (Slurm's default, and the case submitit handles
# worst), the node's real CPUs, one partition "debug". Needs root and apt. Idempotent:
# a cluster already answering `sinfo` is left as it is. Its state lives in folders of its
# own, so an earlier cluster's state on this machine cannot stop it.
set -eu
if sinfo -h -o %a 2>/dev/null | grep -q up; then
    echo "slurm: already up"; exit 0
fi
if ! command -v slurmctld >/dev/null; then
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge
fi
node=$(hostname -s)
mkdir -p /etc/slurm /var/spool/kvgrader-slurmd /var/spool/kvgrader-slurmctld /var/log/slurm /run/munge
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=kvgrader-test
SlurmctldHost=$node
ProctrackType=proctrack/linuxproc
ReturnToService=2
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmdSpoolDir=/var/spool/kvgrader-slurmd
StateSaveLocation=/var/spool/kvgrader-slurmctld
SlurmUser=root
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
NodeName=$node CPUs=$(nproc) RealMemory=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1100 )) State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP
CONF
if [ ! -s /etc/munge/munge.key ]; then
    dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null
fi
chown -R munge:munge /etc/munge /run/munge
chmod 400 /etc/munge/munge.key
pgrep -x munged >/dev/null || su -s /bin/sh munge -c /usr/sbin/munged
pgrep -x slurmctld >/dev/null || slurmctld
pgrep -x slurmd >/dev/null || slurmd
for _ in $(seq 30); do
    if sinfo -h -o %a 2>/dev/null | grep -q up; then sinfo; exit 0; fi
    sleep 1
done
echo "slurm did not come up: see /var/log/slurm/" >&2
exit 1
