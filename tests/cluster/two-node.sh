#!/usr/bin/env bash
# A two-node Slurm on one machine: two network namespaces joined by a veth pair on 10.200.0.0/24 stand in
# for two hosts (strata-a, strata-b), one slurmd in each with its own host name and private TmpFS, the
# controller on host a. An srun across both nodes and the collective sweep template (sbatch --nodes=2) run
# through it; the checks: the results name both hosts, n_nodes = 2 where the sweep asked for 2 nodes, and the
# veth counters grew by at least the bytes the two-node allreduce cases must have moved. HO-Ring runs across
# the two nodes (strata-bench-horing, 2 ranks per node): the veth counters against the bytes its formula sends
# across nodes, and its time against the sum of its phases run alone on a link shaped slower than shared
# memory, as between real nodes (both tiers busy at once). Every daemon is
# stopped by its PID and both namespaces are removed, whatever happened. Exit status: 0 passed, 1 a check
# failed, 77 cannot run here (reason in the report).
#
#   tests/cluster/two-node.sh            (as root; STRATA_CLUSTER_REPORT=FILE also writes the report)
set -euo pipefail
TEST_NAME=two-node
source "$(dirname "$0")/lib.sh"

CHECKS=(two-node-slurm two-node-srun two-node-sweep two-node-sweep-traffic two-node-step two-node-step-traffic
        two-node-horing-traffic two-node-horing-overlap)
reason=$(missing_prerequisites)
[ -n "$reason" ] || reason=$(netns_prerequisites)
[ -z "$reason" ] || skip_all "$reason" "${CHECKS[@]}" two-node-cleanup
install_traps
make_workdir
cd "$WORK"
CHECK="python3 $REPO/tests/cluster/check_results.py"
cpus=$(nproc)

# ---- two hosts and the cluster ----------------------------------------------------------------------------
started=no
if setup_netns_pair; then
  CTL=(nsenter --net="/run/netns/$NS_A")   # client commands talk to the controller from host a
  # slurmctld insists that its host name is SlurmctldHost: it keeps the machine's name, with host a's address.
  write_slurm_conf "$(hostname)" "$ADDR_A" 6817 6818 "$cpus" "strata-a $ADDR_A strata-a" "strata-b $ADDR_B strata-b"
  if start_munge && start_slurmctld "${CTL[@]}" && start_slurmd strata-a in_host strata-a "$NS_A" &&
     start_slurmd strata-b in_host strata-b "$NS_B" && wait_for 45 nodes_idle 2; then
    started=yes
  fi
fi
if [ "$started" = yes ]; then
  report PASS two-node-slurm "namespaces $NS_A/$NS_B joined by veth on $SUBNET; slurmd strata-a and strata-b idle"
else
  report FAIL two-node-slurm "the two-node cluster did not come up within the time allowed (logs below)"
  for c in "${CHECKS[@]:1}"; do report SKIP "$c" "the cluster did not start"; done
  exit 1
fi

# The ranks' MPI traffic between nodes goes over the test subnet (each namespace sees only its own veth).
export OMPI_MCA_btl=tcp,self,vader OMPI_MCA_btl_tcp_if_include=$SUBNET
export STRATA_ROOT=$REPO STRATA_BUILD_DIR=$BUILD STRATA_RESULTS_DIR=$WORK/results

expect_job() {
  local states
  states=$(job_states "$1")
  echo "$states" | tr '\n' ';'
  [ -n "$states" ] && ! grep -qv "^$2\$" <<<"$states"
}

# ---- an srun across both nodes ----------------------------------------------------------------------------
# The job's own shell expands \$SLURM_JOB_ID: one file per job, as the templates do.
gemm="$BUILD/strata-gemm --shapes 64x64x64 -n 3 -w 1 -q -O $WORK/results/srun-\$SLURM_JOB_ID.h5"
if id=$(submit --time=5 --nodes=2 --ntasks-per-node=1 --output=srun-%j.out --wrap "srun --mpi=pmix $gemm"); then
  if ! wait_job "$id" "$JOB_LIMIT"; then
    report FAIL two-node-srun "job $id did not finish in the time allowed; cancelled"
  elif ! states=$(expect_job "$id" "COMPLETED 0:0"); then
    report FAIL two-node-srun "job $id ended as: $states; $(tail_of "srun-$id.out")"
  elif out=$($CHECK runs "results/srun-$id.h5" --runs 1 --job-id "$id" --launcher srun --n-nodes 2 --n-ranks 2 \
               --hosts strata-a,strata-b 2>&1); then
    report PASS two-node-srun "job $id: $out"
  else
    report FAIL two-node-srun "job $id: $out"
  fi
else
  report FAIL two-node-srun "sbatch --parsable refused the srun job"
fi

# ---- (b) the collective sweep over 1 and 2 nodes, 1 and 2 ranks per node, world and inter groups ---------------
if [ ! -x "$BUILD/strata-collective" ]; then
  report SKIP two-node-sweep "$BUILD/strata-collective is not built"
  report SKIP two-node-sweep-traffic "$BUILD/strata-collective is not built"
else
  read -r tx0 rx0 < <(veth_bytes)
  if id=$(STRATA_NODE_COUNTS="1 2" STRATA_RANKS_PER_NODE="1 2" STRATA_GROUPS="world inter" STRATA_COLLECTIVES=allreduce \
          STRATA_MINBYTES=256K STRATA_MAXBYTES=1M STRATA_STEPFACTOR=4 STRATA_ITERS=5 STRATA_WARMUP=1 STRATA_MAX_TIME=5 \
          STRATA_COLLECTIVE_ARGS="--placement out" \
          submit --time=5 --nodes=2 "$REPO/scripts/slurm/collective-sweep.sbatch"); then
    file=results/collective-sweep-$id.h5
    if ! wait_job "$id" "$JOB_LIMIT"; then
      report FAIL two-node-sweep "job $id did not finish in the time allowed; cancelled"
      report SKIP two-node-sweep-traffic "the sweep did not finish"
    elif ! states=$(expect_job "$id" "COMPLETED 0:0"); then
      report FAIL two-node-sweep "job $id ended as: $states; $(tail_of "strata-collective-sweep-$id.out")"
      report SKIP two-node-sweep-traffic "the sweep failed"
    else
      read -r tx1 rx1 < <(veth_bytes)
      # Points: 1x1, 1x2 (world); 2x1, 2x2 (world and inter).
      if out=$($CHECK runs "$file" --runs 6 --benchmarks strata-collective --job-id "$id" --launcher srun \
                 --layouts 1x1,1x2,2x1,2x1,2x2,2x2 --multi-node-hosts strata-a,strata-b 2>&1); then
        report PASS two-node-sweep "job $id: $out"
      else
        report FAIL two-node-sweep "job $id: $out"
      fi
      if out=$($CHECK volume "$file" --tx $((tx1 - tx0)) --rx $((rx1 - rx0)) 2>&1); then
        report PASS two-node-sweep-traffic "$out"
      else
        report FAIL two-node-sweep-traffic "$out"
      fi
    fi
  else
    report FAIL two-node-sweep "sbatch --parsable refused collective-sweep.sbatch"
    report SKIP two-node-sweep-traffic "the sweep was not submitted"
  fi
fi

# ---- (c) the training-step sweep: strategies across the two nodes, bytes on the link against the formula ----
if [ ! -x "$BUILD/strata-step" ]; then
  report SKIP two-node-step "$BUILD/strata-step is not built"
  report SKIP two-node-step-traffic "$BUILD/strata-step is not built"
else
  read -r tx0 rx0 < <(veth_bytes)
  if id=$(STRATA_RANKS_PER_NODE=2 STRATA_STRATEGIES=NNN,NIG,ING,GGG STRATA_ITERS=3 STRATA_WARMUP=1 \
          STRATA_STEP_ARGS="--model tiny --seq 32 --micro-batch 2 --accumulation 2 --comm-algo ring -q" \
          submit --time=5 --nodes=2 "$REPO/scripts/slurm/step.sbatch"); then
    file=results/step-$id.h5
    if ! wait_job "$id" "$JOB_LIMIT"; then
      report FAIL two-node-step "job $id did not finish in the time allowed; cancelled"
      report SKIP two-node-step-traffic "the step sweep did not finish"
    elif ! states=$(expect_job "$id" "COMPLETED 0:0"); then
      report FAIL two-node-step "job $id ended as: $states; $(tail_of "strata-step-$id.out")"
      report SKIP two-node-step-traffic "the step sweep failed"
    else
      read -r tx1 rx1 < <(veth_bytes)
      if out=$($CHECK runs "$file" --runs 1 --benchmarks strata-step --job-id "$id" --launcher srun --n-nodes 2 \
                 --n-ranks 4 --hosts strata-a,strata-b 2>&1); then
        report PASS two-node-step "job $id: $out"
      else
        report FAIL two-node-step "job $id: $out"
      fi
      if out=$($CHECK step-volume "$file" --tx $((tx1 - tx0)) --rx $((rx1 - rx0)) 2>&1); then
        report PASS two-node-step-traffic "$out"
      else
        report FAIL two-node-step-traffic "$out"
      fi
    fi
  else
    report FAIL two-node-step "sbatch --parsable refused step.sbatch"
    report SKIP two-node-step-traffic "the step sweep was not submitted"
  fi
fi

# ---- (d) HO-Ring across the two nodes: the bytes on the link, and the two tiers overlapping ------------------
# Two ranks per node, so both tiers of the two-level algorithm carry data; 4 ranks on this machine's cores, so
# Open MPI yields the core while it waits (it does so by itself only when it knows the node is oversubscribed).
horing_job() {  # horing_job NAME ARGS...: strata-bench-horing on 2 nodes x 2 ranks, --json into results/; the job id
  local name=$1
  shift
  submit --time=5 --nodes=2 --ntasks-per-node=2 --output="horing-$name-%j.out" \
    --export=ALL,OMPI_MCA_mpi_yield_when_idle=1 \
    --wrap "srun --mpi=pmix $BUILD/strata-bench-horing $* --json $WORK/results/horing-$name-\$SLURM_JOB_ID.json"
}
# shape_link RATE|none: the rate each end of the veth pair sends at (tc tbf), or no limit.
shape_link() {
  local ns dev ns_dev
  for ns_dev in "$NS_A veth-a" "$NS_B veth-b"; do
    read -r ns dev <<<"$ns_dev"
    ip netns exec "$ns" tc qdisc del dev "$dev" root 2>/dev/null || true
    [ "$1" = none ] || ip netns exec "$ns" tc qdisc add dev "$dev" root tbf rate "$1" burst 512kb latency 50ms || return 1
  done
}
# horing_run CHECK NAME ARGS...: runs the job; on success sets HORING_FILE (and the veth deltas TX, RX), otherwise
# reports CHECK failed.
horing_run() {
  local check=$1 name=$2 id states tx0 rx0 tx1 rx1
  shift 2
  HORING_FILE=""
  read -r tx0 rx0 < <(veth_bytes)
  if ! id=$(horing_job "$name" "$@"); then
    report FAIL "$check" "sbatch --parsable refused the strata-bench-horing job"
  elif ! wait_job "$id" "$JOB_LIMIT"; then
    report FAIL "$check" "job $id did not finish in the time allowed; cancelled"
  elif ! states=$(expect_job "$id" "COMPLETED 0:0"); then
    report FAIL "$check" "job $id ended as: $states; $(tail_of "horing-$name-$id.out")"
  else
    read -r tx1 rx1 < <(veth_bytes)
    TX=$((tx1 - tx0)) RX=$((rx1 - rx0)) HORING_FILE=results/horing-$name-$id.json
  fi
}
if [ ! -x "$BUILD/strata-bench-horing" ]; then
  report SKIP two-node-horing-traffic "$BUILD/strata-bench-horing is not built"
  report SKIP two-node-horing-overlap "$BUILD/strata-bench-horing is not built"
else
  # Bytes: only HO-Ring in this job, so what crossed the link is its bytes and MPI's own little traffic.
  horing_run two-node-horing-traffic traffic --contenders horing --ops allreduce,reduce_scatter,allgather \
    -b 16M -e 16M --rounds 1 -n 2
  if [ -n "$HORING_FILE" ]; then
    if out=$($CHECK horing-volume "$HORING_FILE" --tx "$TX" --rx "$RX" --hosts strata-a,strata-b 2>&1); then
      report PASS two-node-horing-traffic "$out"
    else
      report FAIL two-node-horing-traffic "$out"
    fi
  fi
  # Overlap: unshaped, a veth pair moves bytes with the same cores and memory as the intra tier, so neither tier waits
  # on the other and there is nothing to overlap; at 2 Gbit/s the link is the inter tier's bound, as on a cluster,
  # and HO-Ring must beat its phases run one at a time. Judged on allreduce (16 chunks of 1 MiB at 16 MiB);
  # reduce-scatter and allgather (4 chunks) are reported.
  if ! shape_link 2gbit; then
    shape_link none || true
    report SKIP two-node-horing-overlap "cannot limit the veth pair's rate with tc tbf here"
  else
    horing_run two-node-horing-overlap overlap --contenders horing,hierarchical,phases \
      --ops allreduce,reduce_scatter,allgather -b 16M -e 16M --rounds 3 -n 3
    shape_link none || true
    if [ -n "$HORING_FILE" ]; then
      if out=$($CHECK horing-overlap "$HORING_FILE" --judge allreduce --hosts strata-a,strata-b 2>&1); then
        report PASS two-node-horing-overlap "veth at 2 Gbit/s each way: $out"
      else
        report FAIL two-node-horing-overlap "veth at 2 Gbit/s each way: $out"
      fi
    fi
  fi
fi
