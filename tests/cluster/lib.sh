# Shared by the cluster tests (sourced, not run): a throw-away Slurm — munged, slurmctld and slurmd with a
# minimal configuration in a temporary folder — that is started, waited for with a bound, and stopped by
# the PIDs it started, plus the report lines the pytest wrapper reads ("PASS|FAIL|SKIP <tab> check <tab>
# detail"). Nothing here touches the machine's own Slurm or munge configuration.
#
# Environment: STRATA_BUILD_DIR (programs) [build]; STRATA_CLUSTER_REPORT (file the report lines are appended
# to; they always go to stderr too); STRATA_CLUSTER_JOB_LIMIT (seconds one job may take before it counts as
# hung and is cancelled) [150]; STRATA_CLUSTER_TIME_LIMIT (seconds all jobs of a script may take) [300];
# STRATA_CLUSTER_KEEP=1 keeps the temporary folder for a post-mortem.

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=${STRATA_BUILD_DIR:-$REPO/build}
REPORT=${STRATA_CLUSTER_REPORT:-/dev/null}
JOB_LIMIT=${STRATA_CLUSTER_JOB_LIMIT:-150}
DEADLINE=$((SECONDS + ${STRATA_CLUSTER_TIME_LIMIT:-300}))  # so that a hung cluster cannot stack up job limits
SKIPPED=77   # the automake convention for "could not run here"
FAILURES=0
STARTED_PIDS=()   # every daemon this script started, in start order
NETNS=()          # every network namespace this script created
WORK=""
CTL=()            # prefix that runs a command where the controller is reachable (e.g. in a namespace)

log() { printf '[%s] %s\n' "${TEST_NAME:-cluster}" "$*" >&2; }

# report STATUS CHECK DETAIL...
report() {
  local status=$1 check=$2
  shift 2
  printf '%s\t%s\t%s\n' "$status" "$check" "$*" >>"$REPORT"
  printf '%-4s %s: %s\n' "$status" "$check" "$*" >&2
  [ "$status" != FAIL ] || FAILURES=$((FAILURES + 1))
}

# skip_all REASON: report every named check as skipped and leave with the "skipped" status.
skip_all() {
  local reason=$1 check
  shift
  for check in "$@"; do report SKIP "$check" "$reason"; done
  exit "$SKIPPED"
}

# missing_prerequisites: prints why the cluster tests cannot run here (nothing when they can).
missing_prerequisites() {
  [ "$(id -u)" = 0 ] || { echo "needs root (slurmd, munged and network namespaces run as root)"; return; }
  local tool
  for tool in munged munge slurmctld slurmd sbatch squeue scontrol srun runuser timeout python3 mpirun; do
    command -v "$tool" >/dev/null 2>&1 || {
      echo "$tool is not installed (scripts/install-deps.sh installs slurm-wlm and munge when run as root on Debian)"
      return
    }
  done
  id munge >/dev/null 2>&1 || { echo "no munge user (install the munge package)"; return; }
  [ -x "$BUILD/strata-gemm" ] || { echo "$BUILD/strata-gemm is not built (run make build)"; return; }
}

make_workdir() {
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/strata-cluster.XXXXXX")
  chmod 755 "$WORK"  # munged runs as the munge user and must reach its socket folder
  mkdir -p "$WORK/state" "$WORK/spool" "$WORK/results" "$WORK/logs"
  # Marks every process of this test (daemons, jobs, steps) so a last sweep can find stragglers by PID.
  export STRATA_CLUSTER_WORK=$WORK
  export SLURM_CONF=$WORK/slurm.conf
}

free_ports() {  # free_ports N: N TCP ports nobody listens on now
  python3 - "$1" <<'EOF'
import socket, sys
sockets = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in sockets:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in sockets))
EOF
}

alive() { [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null; }

# wait_for SECONDS COMMAND...: polls COMMAND every 0.2 s until it succeeds; fails after SECONDS.
wait_for() {
  local limit=$1 start=$SECONDS
  shift
  until "$@" >/dev/null 2>&1; do
    [ $((SECONDS - start)) -lt "$limit" ] || return 1
    sleep 0.2
  done
}

pid_from() {  # pid_from FILE SECONDS: the PID a daemon wrote, waiting for the file
  wait_for "$2" test -s "$1" || return 1
  cat "$1"
}

# A private munged: its own key, socket and PID file in the work folder, so it cannot disturb (or be
# disturbed by) a munged the machine already runs.
start_munge() {
  mkdir -p "$WORK/munge"
  dd if=/dev/urandom of="$WORK/munge/key" bs=1024 count=1 status=none
  chown -R munge:munge "$WORK/munge"
  chmod 755 "$WORK/munge"
  chmod 400 "$WORK/munge/key"
  runuser -u munge -- /usr/sbin/munged --socket="$WORK/munge/socket" --key-file="$WORK/munge/key" \
    --pid-file="$WORK/munge/munged.pid" --log-file="$WORK/munge/munged.log" --seed-file="$WORK/munge/seed" ||
    return 1
  local pid
  pid=$(pid_from "$WORK/munge/munged.pid" 10) || return 1
  STARTED_PIDS+=("$pid")
  wait_for 10 sh -c "munge -S '$WORK/munge/socket' -n | unmunge -S '$WORK/munge/socket'"
}

# write_slurm_conf CONTROLLER_HOST CONTROLLER_ADDR CTLD_PORT SLURMD_PORT CPUS "NAME ADDR HOST"...
write_slurm_conf() {
  local host=$1 addr=$2 ctld_port=$3 slurmd_port=$4 cpus=$5 node names=()
  shift 5
  cat >"$SLURM_CONF" <<EOF
# Throw-away test cluster (tests/cluster); every path is under $WORK.
ClusterName=strata-test
SlurmctldHost=$host($addr)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$WORK/munge/socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$WORK/state
SlurmdSpoolDir=$WORK/spool/%n
SlurmctldPidFile=$WORK/slurmctld.pid
SlurmdPidFile=$WORK/slurmd-%n.pid
SlurmctldLogFile=$WORK/logs/slurmctld.log
SlurmdLogFile=$WORK/logs/slurmd-%n.log
TmpFS=$WORK/nodetmp
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmix
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
SlurmdTimeout=30
MessageTimeout=10
EOF
  for node in "$@"; do
    read -r name naddr nhost <<<"$node"
    echo "NodeName=$name NodeAddr=$naddr NodeHostname=$nhost CPUs=$cpus RealMemory=1000 State=UNKNOWN" >>"$SLURM_CONF"
    names+=("$name")
  done
  local IFS=,
  echo "PartitionName=debug Nodes=${names[*]} Default=YES MaxTime=INFINITE State=UP" >>"$SLURM_CONF"
  mkdir -p "$WORK/nodetmp"
}

start_slurmctld() {  # start_slurmctld [PREFIX...]: PREFIX runs it elsewhere (e.g. nsenter --net=...)
  "$@" slurmctld -f "$SLURM_CONF" -i || return 1
  local pid
  pid=$(pid_from "$WORK/slurmctld.pid" 15) || return 1
  STARTED_PIDS+=("$pid")
}

start_slurmd() {  # start_slurmd NAME [PREFIX...]
  local name=$1
  shift
  mkdir -p "$WORK/spool/$name"
  "$@" slurmd -f "$SLURM_CONF" -N "$name" || return 1
  local pid
  pid=$(pid_from "$WORK/slurmd-$name.pid" 15) || return 1
  STARTED_PIDS+=("$pid")
}

nodes_idle() {  # nodes_idle N: N nodes report idle
  [ "$("${CTL[@]}" timeout 20 sinfo -h -N -t idle -o '%N' 2>/dev/null | sort -u | grep -c .)" -ge "$1" ]
}

# submit ARGS...: sbatch --parsable from the work folder; prints the job id.
submit() {
  local out
  out=$(cd "$WORK" && "${CTL[@]}" timeout 30 sbatch --parsable "$@") || return 1
  echo "${out%%;*}"
}

# wait_job ID SECONDS: waits until no task of job ID is pending or running; fails after SECONDS, or at the
# script's deadline if that comes first, and cancels the job.
wait_job() {
  local id=$1 limit=$2 start=$SECONDS
  [ $((DEADLINE - SECONDS)) -ge "$limit" ] || limit=$((DEADLINE - SECONDS > 1 ? DEADLINE - SECONDS : 1))
  while [ -n "$("${CTL[@]}" timeout 20 squeue -h -j "$id" -o %i 2>/dev/null)" ]; do
    if [ $((SECONDS - start)) -ge "$limit" ]; then
      log "job $id still queued or running after ${limit}s; cancelling it"
      "${CTL[@]}" timeout 20 scancel "$id" 2>/dev/null || true
      return 1
    fi
    sleep 0.5
  done
}

# job_states ID: "STATE EXITCODE" per task of job ID (one line for a plain job, one per array task).
job_states() {
  "${CTL[@]}" timeout 20 scontrol -o show job "$1" 2>/dev/null |
    sed -n 's/.*JobState=\([A-Z_]*\) .*ExitCode=\([0-9:]*\).*/\1 \2/p'
}

# Stops everything this script started, by PID: jobs first, then slurmd(s), slurmctld and munged, then any
# process still carrying this test's marker (job steps orphaned by a crash), then the namespaces.
cleanup() {
  local rc=$? pid i ns left=()
  trap - EXIT INT TERM
  if [ -n "$WORK" ] && [ "${#STARTED_PIDS[@]}" -gt 1 ]; then
    "${CTL[@]}" timeout 10 scancel --full --user=root 2>/dev/null || true
    wait_for 15 queue_empty || true
  fi
  for ((i = ${#STARTED_PIDS[@]} - 1; i >= 0; i--)); do
    pid=${STARTED_PIDS[$i]}
    alive "$pid" && kill -TERM "$pid" 2>/dev/null
    wait_for 15 gone "$pid" || { log "PID $pid ignored SIGTERM for 15 s: SIGKILL"; kill -KILL "$pid" 2>/dev/null; }
  done
  if [ -n "$WORK" ]; then
    for pid in $(marked_pids); do kill -KILL "$pid" 2>/dev/null && log "killed straggler PID $pid"; done
  fi
  for ns in "${NETNS[@]}"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null && log "killed PID $pid in $ns"; done
  done
  sleep 0.3
  for pid in "${STARTED_PIDS[@]}"; do alive "$pid" && left+=("$pid"); done
  if [ -n "$WORK" ]; then for pid in $(marked_pids); do left+=("$pid"); done; fi
  for ns in "${NETNS[@]}"; do ip netns del "$ns" 2>/dev/null || left+=("netns:$ns"); done
  if [ "${#STARTED_PIDS[@]}" -gt 0 ] || [ "${#NETNS[@]}" -gt 0 ]; then
    if [ "${#left[@]}" -eq 0 ]; then
      report PASS "${TEST_NAME:-cluster}-cleanup" "stopped ${#STARTED_PIDS[@]} daemon(s) by PID, removed" \
        "${#NETNS[@]} network namespace(s)"
    else
      report FAIL "${TEST_NAME:-cluster}-cleanup" "still alive or present: ${left[*]}"
    fi
  fi
  if [ -n "$WORK" ] && [ -d "$WORK" ]; then
    if [ "$FAILURES" -gt 0 ] || { [ "$rc" -ne 0 ] && [ "$rc" -ne "$SKIPPED" ]; }; then dump_logs; fi
    if [ "${STRATA_CLUSTER_KEEP:-0}" = 1 ]; then log "kept $WORK"; else rm -rf "$WORK"; fi
  fi
  if [ "$rc" = "$SKIPPED" ] && [ "$FAILURES" -eq 0 ]; then exit "$SKIPPED"; fi
  [ "$FAILURES" -eq 0 ] && [ "$rc" -eq 0 ] && exit 0
  exit 1
}

tail_of() { tail -n "${2:-3}" "$1" 2>&1 | tr '\n' ' '; }  # tail_of FILE [LINES]: the end of a log, on one line

queue_empty() { [ -z "$("${CTL[@]}" timeout 10 squeue -h -o %i 2>/dev/null)" ]; }
gone() { ! kill -0 "$1" 2>/dev/null; }

# The last lines of every daemon log and job output, for a failure seen only in CI.
dump_logs() {
  local f
  for f in "$WORK"/logs/* "$WORK"/*.out "$WORK"/munge/munged.log; do
    [ -f "$f" ] || continue
    echo "----- ${f#"$WORK"/} (last 25 lines) -----" >&2
    tail -n 25 "$f" >&2
  done
}

# PIDs whose environment carries this test's marker, leaving out this shell, its parents and its own
# children (the helpers it is waiting for): what remains was started by Slurm for a job of this test.
marked_pids() {
  local dir pid
  for dir in /proc/[0-9]*; do
    pid=${dir#/proc/}
    if { tr '\0' '\n' <"$dir/environ"; } 2>/dev/null | grep -qxF "STRATA_CLUSTER_WORK=$WORK"; then
      related "$pid" || echo "$pid"
    fi
  done
}

related() {  # related PID: PID is this shell, one of its parents, or one of its descendants
  local p=$$
  while [ -n "$p" ] && [ "$p" -gt 1 ]; do
    [ "$p" = "$1" ] && return 0
    p=$(parent_of "$p")
  done
  p=$1
  while [ -n "$p" ] && [ "$p" -gt 1 ]; do
    [ "$p" = $$ ] && return 0
    p=$(parent_of "$p")
  done
  return 1
}

parent_of() {  # the 4th field of /proc/PID/stat, counted after the command name (which may hold spaces)
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  stat=${stat##*) }
  set -- $stat
  echo "${2:-}"
}

install_traps() {
  trap cleanup EXIT
  trap 'log "interrupted"; exit 130' INT TERM
}

# ---- two hosts on one machine -----------------------------------------------------------------------------
# Two network namespaces joined by a veth pair on the test subnet, 10.200.0.1 (host a) and 10.200.0.2
# (host b). Both ends live inside the namespaces, so nothing is added to the machine's own network and two
# copies of the test can run at once. Sets NS_A, NS_B; the veth ends are named veth-a and veth-b.
SUBNET=10.200.0.0/24
ADDR_A=10.200.0.1
ADDR_B=10.200.0.2

netns_prerequisites() {  # prints why namespaces cannot be used here (nothing when they can)
  command -v ip >/dev/null 2>&1 || { echo "ip (iproute2) is not installed"; return; }
  if ! command -v nsenter >/dev/null 2>&1 || ! command -v unshare >/dev/null 2>&1; then
    echo "nsenter/unshare (util-linux) missing"; return
  fi
  local probe=strata-probe-$$
  if ! ip netns add "$probe" 2>/dev/null; then echo "cannot create network namespaces here (no CAP_SYS_ADMIN?)"; return; fi
  if ! ip -n "$probe" link add veth-p type veth peer name veth-q 2>/dev/null; then
    ip netns del "$probe"; echo "cannot create veth pairs here (no veth support)"; return
  fi
  ip netns del "$probe"
}

setup_netns_pair() {
  NS_A=strata-$$-a
  NS_B=strata-$$-b
  ip netns add "$NS_A" && NETNS+=("$NS_A") || return 1
  ip netns add "$NS_B" && NETNS+=("$NS_B") || return 1
  ip -n "$NS_A" link add veth-a type veth peer name veth-b netns "$NS_B" || return 1
  ip -n "$NS_A" addr add "$ADDR_A/24" dev veth-a && ip -n "$NS_B" addr add "$ADDR_B/24" dev veth-b || return 1
  local ns
  for ns in "$NS_A" "$NS_B"; do ip -n "$ns" link set lo up || return 1; done
  ip -n "$NS_A" link set veth-a up && ip -n "$NS_B" link set veth-b up
}

# veth_bytes: "TX RX" of veth-a (host a's end; what a sent and received over the link).
veth_bytes() {
  ip -n "$NS_A" -s -j link show dev veth-a |
    python3 -c 'import json, sys; s = json.load(sys.stdin)[0]["stats64"]; print(s["tx"]["bytes"], s["rx"]["bytes"])'
}

# in_host NAME NS COMMAND...: runs COMMAND as host NAME would: in namespace NS, with its own host name
# (MPI and Strata tell nodes apart by it) and its own mount namespace for a private TmpFS.
in_host() {
  local name=$1 ns=$2
  shift 2
  nsenter --net="/run/netns/$ns" unshare --uts --mount --propagation private \
    sh -c 'hostname "$0" && mount -t tmpfs -o size=256m,mode=1777 strata-tmp "$1" && shift && exec "$@"' \
    "$name" "$WORK/nodetmp" "$@"
}
