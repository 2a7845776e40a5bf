#!/usr/bin/env bash
# Two hosts without Slurm: mpirun on host a (network namespace, host name strata-a) starts one rank there and
# one on host b through a launch agent (tests/cluster/netns-agent.sh) instead of ssh, over a veth pair on
# 10.200.0.0/24 — the path of users who launch with mpirun and a host list. Checks: the results name both
# hosts, n_nodes = 2, launcher mpirun, and the veth counters grew by at least the bytes the allreduce cases
# must have moved. The namespaces and anything left in them are removed at the end. Exit status: 0 passed,
# 1 a check failed, 77 cannot run here (reason in the report).
#
#   tests/cluster/two-host-mpirun.sh      (as root; STRATA_CLUSTER_REPORT=FILE also writes the report)
set -euo pipefail
TEST_NAME=two-host-mpirun
source "$(dirname "$0")/lib.sh"

CHECKS=(two-host-mpirun two-host-mpirun-traffic)
reason=""
[ "$(id -u)" = 0 ] || reason="needs root (network namespaces)"
[ -n "$reason" ] || command -v mpirun >/dev/null 2>&1 || reason="mpirun is not installed"
[ -n "$reason" ] || [ -x "$BUILD/strata-gemm" ] || reason="$BUILD/strata-gemm is not built (run make build)"
[ -n "$reason" ] || reason=$(netns_prerequisites)
[ -z "$reason" ] || skip_all "$reason" "${CHECKS[@]}" two-host-mpirun-cleanup
install_traps
make_workdir
cd "$WORK"
CHECK="python3 $REPO/tests/cluster/check_results.py"
setup_netns_pair || { report FAIL two-host-mpirun "could not set up the namespaces and veth pair"; exit 1; }

export STRATA_AGENT_HOSTS="$ADDR_A=$NS_A:strata-a $ADDR_B=$NS_B:strata-b"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Both the ranks' messages (btl) and Open MPI's own control channel (oob) use the test subnet: interface
# names would not do, each namespace sees only its own.
mpirun_args=(--host "$ADDR_A,$ADDR_B" -np 2 --bind-to none
             --mca plm_rsh_agent "$REPO/tests/cluster/netns-agent.sh"
             --mca btl tcp,self --mca btl_tcp_if_include "$SUBNET" --mca oob_tcp_if_include "$SUBNET")
if [ -x "$BUILD/strata-collective" ]; then
  program=("$BUILD/strata-collective" --collective allreduce -b 256K -e 1M -f 4 -n 5 -w 1 --placement out)
else
  program=("$BUILD/strata-gemm" --shapes 64x64x64 -n 3 -w 1)
fi
output=$WORK/results/mpirun.h5

read -r tx0 rx0 < <(veth_bytes)
if timeout 120 nsenter --net="/run/netns/$NS_A" unshare --uts /bin/sh -c 'hostname strata-a && exec "$@"' mpirun \
     mpirun "${mpirun_args[@]}" "${program[@]}" -q -O "$output" >"$WORK/mpirun.out" 2>&1; then
  read -r tx1 rx1 < <(veth_bytes)
  if out=$($CHECK runs "$output" --runs 1 --launcher mpirun --n-nodes 2 --n-ranks 2 --hosts strata-a,strata-b 2>&1); then
    report PASS two-host-mpirun "$out"
  else
    report FAIL two-host-mpirun "$out"
  fi
  if [ ! -x "$BUILD/strata-collective" ]; then
    report SKIP two-host-mpirun-traffic "$BUILD/strata-collective is not built (ran strata-gemm for the launch check)"
  elif out=$($CHECK volume "$output" --tx $((tx1 - tx0)) --rx $((rx1 - rx0)) 2>&1); then
    report PASS two-host-mpirun-traffic "$out"
  else
    report FAIL two-host-mpirun-traffic "$out"
  fi
else
  rc=$?
  [ "$rc" != 124 ] || rc="124 (timed out after 120 s)"
  report FAIL two-host-mpirun "mpirun exited $rc: $(tail_of "$WORK/mpirun.out" 5)"
  report SKIP two-host-mpirun-traffic "mpirun failed"
fi
