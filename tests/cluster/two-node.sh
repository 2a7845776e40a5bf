#!/usr/bin/env bash
# A two-node Slurm on one machine: two network namespaces joined by a veth pair on 10.200.0.0/24 stand in
# for two hosts (strata-a, strata-b), one slurmd in each with its own host name and private TmpFS, the
# controller on host a. An srun across both nodes and the collective sweep template (sbatch --nodes=2) run
# through it; the checks: the results name both hosts, n_nodes = 2 where the sweep asked for 2 nodes, and the
# veth counters grew by at least the bytes the two-node allreduce cases must have moved. Every daemon is
# stopped by its PID and both namespaces are removed, whatever happened. Exit status: 0 passed, 1 a check
# failed, 77 cannot run here (reason in the report).
#
#   tests/cluster/two-node.sh            (as root; STRATA_CLUSTER_REPORT=FILE also writes the report)
set -euo pipefail
TEST_NAME=two-node
source "$(dirname "$0")/lib.sh"

CHECKS=(two-node-slurm two-node-srun two-node-sweep two-node-sweep-traffic two-node-step two-node-step-traffic)
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
