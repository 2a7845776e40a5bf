#!/usr/bin/env bash
# A real Slurm on this machine (munged, slurmctld, one slurmd, all private to a temporary folder) running
# the sbatch templates of scripts/slurm as users submit them (`sbatch --parsable`, a job array), then the
# HDF5 files the jobs wrote are checked: one file per job named after the job id, every run launched by
# srun with the job's id, node list, node and rank counts. Every daemon is stopped by its PID at the end,
# whatever happened. Exit status: 0 passed, 1 a check failed, 77 cannot run here (reason in the report).
#
#   tests/cluster/single-node.sh            (as root; STRATA_CLUSTER_REPORT=FILE also writes the report)
set -euo pipefail
TEST_NAME=single-node
source "$(dirname "$0")/lib.sh"

CHECKS=(single-node-slurm single-node-suite single-node-suite-array single-node-sweep single-node-sweep-array
        single-node-multi-gpu single-node-multi-gpu-launch single-node-installed)
reason=$(missing_prerequisites)
[ -z "$reason" ] || skip_all "$reason" "${CHECKS[@]}" single-node-cleanup
install_traps
make_workdir
cd "$WORK"
CHECK="python3 $REPO/tests/cluster/check_results.py"
cpus=$(nproc)
node=strata-n1
host=$(hostname)
built=()
for b in strata-gemm strata-collective strata-attention strata-elementwise strata-step strata-interference; do [ -x "$BUILD/$b" ] && built+=("$b"); done

# ---- the cluster ------------------------------------------------------------------------------------------
read -r ctld_port slurmd_port < <(free_ports 2)
write_slurm_conf localhost 127.0.0.1 "$ctld_port" "$slurmd_port" "$cpus" "$node 127.0.0.1 $host"
if start_munge && start_slurmctld && start_slurmd "$node" && wait_for 30 nodes_idle 1; then
  report PASS single-node-slurm "munged, slurmctld and slurmd up; $node idle with $cpus CPU(s)" \
    "(ports $ctld_port, $slurmd_port)"
else
  report FAIL single-node-slurm "the cluster did not come up within the time allowed (logs below)"
  for c in "${CHECKS[@]:1}"; do report SKIP "$c" "the cluster did not start"; done
  exit 1
fi

# Small cases: the point is the launch path and the files, not the numbers.
export STRATA_ROOT=$REPO STRATA_BUILD_DIR=$BUILD STRATA_RESULTS_DIR=$WORK/results STRATA_ITERS=3 STRATA_WARMUP=1 \
  STRATA_MAX_TIME=2
export STRATA_GEMM_ARGS="--backend cpu -d fp32 --square 32:64"
export STRATA_COLLECTIVE_ARGS="--collective allreduce,allgather -b 1K -e 64K -f 8"
export STRATA_ATTENTION_ARGS="-s 64,128 -H 2 -D 32 -p fwd"
export STRATA_STEP_ARGS="--model tiny --seq 32 --micro-batch 2 --zero 0,3 --group-size 1"
export STRATA_INTERFERENCE_ARGS="--kernel gemm --gemm 64x64x64 -b 64K -e 64K --calls 2"
export STRATA_ELEMENTWISE_ARGS="--preset tiny --tokens 16"

# expect_job ID WANT: every task of job ID ended in state WANT ("COMPLETED 0:0"); prints what it saw.
expect_job() {
  local states
  states=$(job_states "$1")
  echo "$states" | tr '\n' ';'
  [ -n "$states" ] && ! grep -qv "^$2\$" <<<"$states"
}

# ---- (a) the suite, one job --------------------------------------------------------------------------------
if id=$(submit --time=5 "$REPO/scripts/slurm/suite.sbatch"); then
  if ! wait_job "$id" "$JOB_LIMIT"; then
    report FAIL single-node-suite "job $id did not finish in the time allowed; cancelled"
  elif ! states=$(expect_job "$id" "COMPLETED 0:0"); then
    report FAIL single-node-suite "job $id ended as: $states (log: strata-suite-$id.out)"
  elif [ ! -f "strata-suite-$id.out" ]; then
    report FAIL single-node-suite "job $id left no strata-suite-$id.out"
  elif out=$($CHECK runs "results/suite-$id.h5" --runs "${#built[@]}" --benchmarks "$(IFS=,; echo "${built[*]}")" \
              --job-id "$id" --launcher srun --n-nodes 1 --n-ranks "$cpus" --nodelist "$node" --hosts "$host" 2>&1); then
    report PASS single-node-suite "job $id: $out"
  else
    report FAIL single-node-suite "job $id: $out"
  fi
else
  report FAIL single-node-suite "sbatch --parsable refused suite.sbatch"
fi

# ---- (a) the suite as a job array: one file per task, then merged --------------------------------------------
if id=$(STRATA_BENCHMARKS=strata-gemm submit --time=5 --array=0-1 "$REPO/scripts/slurm/suite.sbatch"); then
  files=("results/suite-${id}_0.h5" "results/suite-${id}_1.h5")
  if ! wait_job "$id" "$JOB_LIMIT"; then
    report FAIL single-node-suite-array "array job $id did not finish in the time allowed; cancelled"
  elif ! states=$(expect_job "$id" "COMPLETED 0:0"); then
    report FAIL single-node-suite-array "array job $id ended as: $states"
  elif tasks=(results/suite-"${id}"_*.h5) && [ "${#tasks[@]}" != 2 ] || [ ! -f "${files[0]}" ] || [ ! -f "${files[1]}" ]; then
    report FAIL single-node-suite-array "expected ${files[*]}, found: ${tasks[*]}"
  else
    problems=() found=""
    for task in 0 1; do
      # Each task is a job of its own: its run must carry that job's id, not the array's.
      task_job=$("${CTL[@]}" scontrol -o show job "${id}_$task" | sed -n 's/^JobId=\([0-9]*\) .*/\1/p')
      if out=$($CHECK runs "${files[$task]}" --runs 1 --benchmarks strata-gemm --job-id "$task_job" --launcher srun \
                 --n-ranks "$cpus" --n-nodes 1 2>&1); then found+="$out; "; else problems+=("$out"); fi
    done
    if [ "${#problems[@]}" -eq 0 ] && out=$("$REPO/scripts/strata-merge" results/merged.h5 "${files[@]}" 2>&1) &&
       out=$($CHECK merged results/merged.h5 "${files[@]}" 2>&1); then
      report PASS single-node-suite-array "array $id: $found merged: $out"
    else
      report FAIL single-node-suite-array "array $id: ${problems[*]} $out"
    fi
  fi
else
  report FAIL single-node-suite-array "sbatch --parsable --array=0-1 refused suite.sbatch"
fi

# ---- (b) the collective sweep on one node: layouts 1 and all ranks per node, world and intra groups ------------
if [ ! -x "$BUILD/strata-collective" ]; then
  report SKIP single-node-sweep "$BUILD/strata-collective is not built"
elif id=$(STRATA_NODE_COUNTS=1 STRATA_RANKS_PER_NODE="1 all" STRATA_GROUPS="world intra" STRATA_COLLECTIVES=allreduce \
            STRATA_MINBYTES=1K STRATA_MAXBYTES=16K STRATA_STEPFACTOR=4 STRATA_COLLECTIVE_ARGS="" \
            submit --time=5 --nodes=1 "$REPO/scripts/slurm/collective-sweep.sbatch"); then
  expected_runs=2
  [ "$cpus" -gt 1 ] && expected_runs=3   # 1x1 world, 1xN world, 1xN intra
  if ! wait_job "$id" "$JOB_LIMIT"; then
    report FAIL single-node-sweep "job $id did not finish in the time allowed; cancelled"
  elif ! states=$(expect_job "$id" "COMPLETED 0:0"); then
    report FAIL single-node-sweep "job $id ended as: $states (log: strata-collective-sweep-$id.out)"
  elif out=$($CHECK runs "results/collective-sweep-$id.h5" --runs "$expected_runs" --benchmarks strata-collective \
               --job-id "$id" --launcher srun --n-nodes 1 2>&1); then
    report PASS single-node-sweep "job $id: $out"
  else
    report FAIL single-node-sweep "job $id: $out"
  fi
else
  report FAIL single-node-sweep "sbatch --parsable refused collective-sweep.sbatch"
fi

# The same sweep as a job array of 2: the points are dealt out, 1x1 world and 1xN intra to task 0, 1xN
# world to task 1, each task writing its own file.
if [ ! -x "$BUILD/strata-collective" ]; then
  report SKIP single-node-sweep-array "$BUILD/strata-collective is not built"
elif [ "$cpus" -lt 2 ]; then
  report SKIP single-node-sweep-array "needs 2 CPUs for a second layout (this machine has $cpus)"
elif id=$(STRATA_NODE_COUNTS=1 STRATA_RANKS_PER_NODE="1 all" STRATA_GROUPS="world intra" STRATA_COLLECTIVES=allreduce \
            STRATA_MINBYTES=1K STRATA_MAXBYTES=4K STRATA_STEPFACTOR=4 STRATA_COLLECTIVE_ARGS="" \
            submit --time=5 --nodes=1 --array=0-1 "$REPO/scripts/slurm/collective-sweep.sbatch"); then
  if ! wait_job "$id" "$JOB_LIMIT"; then
    report FAIL single-node-sweep-array "array job $id did not finish in the time allowed; cancelled"
  elif ! states=$(expect_job "$id" "COMPLETED 0:0"); then
    report FAIL single-node-sweep-array "array job $id ended as: $states"
  elif out0=$($CHECK runs "results/collective-sweep-${id}_0.h5" --runs 2 --layouts "1x1,1x$cpus" 2>&1) &&
       out1=$($CHECK runs "results/collective-sweep-${id}_1.h5" --runs 1 --layouts "1x$cpus" 2>&1); then
    report PASS single-node-sweep-array "array $id: $out0; $out1"
  else
    report FAIL single-node-sweep-array "array $id: ${out0:-} ${out1:-}"
  fi
else
  report FAIL single-node-sweep-array "sbatch --parsable --array=0-1 refused collective-sweep.sbatch"
fi

# ---- (c) the multi-GPU template: runs where GPUs are, and stops with its message where none are ---------------
gpus=0
command -v nvidia-smi >/dev/null 2>&1 && gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ "$gpus" -gt 0 ]; then
  id="" states="" out=""
  if id=$(STRATA_BENCHMARKS=strata-gemm STRATA_GEMM_ARGS="--backend cuda -d fp32 --square 256:512" \
            submit --time=5 "$REPO/scripts/slurm/multi-gpu.sbatch") && wait_job "$id" "$JOB_LIMIT" &&
     states=$(expect_job "$id" "COMPLETED 0:0") &&
     out=$($CHECK runs "results/gpu-$id.h5" --runs 1 --job-id "$id" --launcher srun --n-ranks "$gpus" 2>&1); then
    report PASS single-node-multi-gpu "job $id on $gpus GPU(s): $out"
  else
    report FAIL single-node-multi-gpu "job ${id:-?}: ${states:-} ${out:-}"
  fi
elif id=$(submit --time=5 "$REPO/scripts/slurm/multi-gpu.sbatch"); then
  if wait_job "$id" "$JOB_LIMIT" && states=$(expect_job "$id" "FAILED 2:0") &&
     grep -q "no GPU is visible in this job" "strata-gpu-$id.out" && [ ! -e "results/gpu-$id.h5" ]; then
    report PASS single-node-multi-gpu "no GPU here: job $id stopped at once with exit 2 and its message, no file written"
  else
    report FAIL single-node-multi-gpu "job $id without GPUs: ${states:-?}; log: $(tail_of "strata-gpu-$id.out")"
  fi
else
  report FAIL single-node-multi-gpu "sbatch --parsable refused multi-gpu.sbatch"
fi
# Its launch path on any machine: STRATA_GPUS stands in for the GPUs and the GEMMs run on the CPU, so the
# ranks per node, the steps and the file naming are checked even where no GPU is.
if id=$(STRATA_GPUS="$cpus" STRATA_BENCHMARKS=strata-gemm STRATA_GEMM_ARGS="--backend cpu -d fp32 --square 32:64" \
          submit --time=5 "$REPO/scripts/slurm/multi-gpu.sbatch"); then
  if ! wait_job "$id" "$JOB_LIMIT"; then
    report FAIL single-node-multi-gpu-launch "job $id did not finish in the time allowed; cancelled"
  elif ! states=$(expect_job "$id" "COMPLETED 0:0"); then
    report FAIL single-node-multi-gpu-launch "job $id ended as: $states; $(tail_of "strata-gpu-$id.out")"
  elif out=$($CHECK runs "results/gpu-$id.h5" --runs 1 --benchmarks strata-gemm --job-id "$id" --launcher srun \
               --n-nodes 1 --n-ranks "$cpus" --nodelist "$node" 2>&1); then
    report PASS single-node-multi-gpu-launch "job $id with STRATA_GPUS=$cpus: $out"
  else
    report FAIL single-node-multi-gpu-launch "job $id: $out"
  fi
else
  report FAIL single-node-multi-gpu-launch "sbatch --parsable refused multi-gpu.sbatch"
fi

# ---- (e) an installed Strata: cmake --install into a prefix, then moved, and the template it installed submitted
#      with STRATA_PREFIX alone (no checkout, no build folder); results beside the submission.
prefix=$WORK/moved-prefix
if ! out=$(cmake --install "$BUILD" --prefix "$WORK/prefix" 2>&1 >/dev/null) || ! mv "$WORK/prefix" "$prefix"; then
  report FAIL single-node-installed "cmake --install $BUILD failed: $out"
elif id=$(unset STRATA_ROOT STRATA_BUILD_DIR; STRATA_PREFIX="$prefix" STRATA_RESULTS_DIR=installed \
            STRATA_BENCHMARKS=strata-gemm submit --time=5 "$prefix/share/strata/scripts/slurm/suite.sbatch"); then
  if ! wait_job "$id" "$JOB_LIMIT"; then
    report FAIL single-node-installed "job $id did not finish in the time allowed; cancelled"
  elif ! states=$(expect_job "$id" "COMPLETED 0:0"); then
    report FAIL single-node-installed "job $id ended as: $states (log: strata-suite-$id.out)"
  elif out=$($CHECK runs "installed/suite-$id.h5" --runs 1 --benchmarks strata-gemm --job-id "$id" --launcher srun \
              --n-nodes 1 --n-ranks "$cpus" --nodelist "$node" --hosts "$host" 2>&1); then
    report PASS single-node-installed "job $id from $prefix: $out"
  else
    report FAIL single-node-installed "job $id: $out"
  fi
else
  report FAIL single-node-installed "sbatch --parsable refused the installed suite.sbatch"
fi
