#!/usr/bin/env bash
# The workstation path: runs Strata's default suite under mpirun on this machine, one rank per core
# (or per GPU when the build has CUDA and GPUs are visible), into one results file, then renders the
# report. Environment (defaults in brackets):
#   STRATA_BUILD_DIR  build folder with the programs [build]
#   STRATA_NP         ranks [cores, or GPUs]
#   STRATA_OUTPUT     results file [results/runs/suite-<UTC time>.h5]
#   STRATA_ITERS      timed iterations per case [10]
#   STRATA_PASSES     passes over the runs bench/programs.txt marks "repeat:" (the steps, and the kernels and
#                     collectives at their shapes and sizes), after the other runs; the first prints its tables,
#                     the others write what they print to <results file>-passes.log [3]
#   STRATA_MPIRUN     mpirun command [mpirun]
#   STRATA_SYSTEM     this machine's system description, fitted from the suite [results/runs/system-<UTC time>.json]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${STRATA_BUILD_DIR:-build}
[ -x "$build/strata-gemm" ] || { echo "run-local: $build/strata-gemm not built (run make build)" >&2; exit 2; }

cores=$(nproc)
gpus=0
if command -v nvidia-smi >/dev/null 2>&1; then gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true); fi
np=${STRATA_NP:-$([ "$gpus" -gt 0 ] && echo "$gpus" || echo "$cores")}
iters=${STRATA_ITERS:-10}
passes=${STRATA_PASSES:-3}
[[ $passes =~ ^[1-9][0-9]*$ ]] || { echo "run-local: STRATA_PASSES must be a whole number >= 1, not '$passes'" >&2; exit 2; }
mkdir -p results/runs
stamp=$(date -u +%Y%m%dT%H%M%SZ)
output=${STRATA_OUTPUT:-results/runs/suite-$stamp.h5}
system=${STRATA_SYSTEM:-results/runs/system-$stamp.json}
latest=${STRATA_SYSTEM_LATEST:-results/runs/system-latest.json}
validation=$(dirname "$output")/validation-$(basename "$output")  # a program never writes into a file it reads

# Root-safe mpirun: Open MPI refuses root unless told; oversubscribe so np may exceed the slot count.
mpirun_args=(--oversubscribe --bind-to none)
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
mpirun=(${STRATA_MPIRUN:-mpirun} "${mpirun_args[@]}" -np "$np")
common=(--output "$output" --iters "$iters" --max-time 5)

echo "[run-local] $np rank(s) on $(hostname) ($cores cores, $gpus GPUs) -> $output" >&2
# The suite runs of bench/programs.txt; GPU runs only where there are GPUs (exit code 2 means this build has no
# CUDA: say so and go on with what ran). The runs marked "repeat:" come last, in passes: the steps and the kernels
# they are predicted from, each measured by several processes over the same minutes (calibrate takes the median of a
# kernel's runs, validate of a step's).
. scripts/programs.sh
# run_program QUIET NAME ARGS...: QUIET=1 drops the run's progress lines and writes what it prints (its tables, each
# case's check) to $quiet_log instead of the terminal; its tables are in the results file, and its warnings and errors
# still show. So the passes after the first do not print the first one's tables again.
quiet_log="${output%.h5}-passes.log"
run_program() {
  local quiet=$1 name=$2
  shift 2
  if [ "$quiet" = 1 ]; then
    "${mpirun[@]}" "$build/$name" "$@" "${common[@]}" --quiet >>"$quiet_log"
  else
    "${mpirun[@]}" "$build/$name" "$@" "${common[@]}"
  fi
}
run_suite() {  # run_suite QUIET RUN...
  local quiet=$1 run name args argv
  shift
  for run in "$@"; do
    IFS=$'\t' read -r name args <<<"$run"
    read -r -a argv <<<"$args"
    run_program "$quiet" "$name" "${argv[@]}"
  done
}
mapfile -t once_runs < <(strata_suite_runs . cpu "$np" once)
mapfile -t repeated_runs < <(strata_suite_runs . cpu "$np" repeated)
run_suite 0 "${once_runs[@]}"
# The contention of concurrent groups (strata-project calibrate) needs TP and DP groups of two or more ranks each.
if [ "$gpus" -eq 0 ] && [ "$np" -ge 4 ] && [ $((np % 2)) -eq 0 ]; then
  "${mpirun[@]}" "$build/strata-collective" --grid "tp=2,dp=$((np / 2))" --mixed -a ring -b 64K -e 4M -f 4 "${common[@]}"
fi
for ((pass = 1; pass <= passes; pass++)); do
  quiet=$((pass > 1))
  if [ "$quiet" = 1 ]; then
    echo "[run-local] pass $pass of $passes: the same runs again (their tables: the results file and $quiet_log)" >&2
  else
    echo "[run-local] pass 1 of $passes: the steps, and the kernels and collectives at their shapes" >&2
  fi
  run_suite "$quiet" "${repeated_runs[@]}"
  # A description's measured sizes serve calls of their group size only: with more than two ranks the steps'
  # tensor-parallel groups (two ranks) are timed too, in every tp group at once as the steps run them.
  if [ "$gpus" -eq 0 ] && [ "$np" -gt 2 ] && [ $((np % 2)) -eq 0 ]; then
    for run in "${repeated_runs[@]}"; do
      IFS=$'\t' read -r name args <<<"$run"
      [ "$name" = strata-collective ] || continue
      read -r -a argv <<<"$args"
      run_program "$quiet" "$name" "${argv[@]}" --grid "tp=2,dp=$((np / 2))" --grid-dim tp
    done
  fi
done
if [ "$gpus" -gt 0 ]; then
  mapfile -t gpu_runs < <(strata_suite_runs . gpu "$np")
  for run in "${gpu_runs[@]}"; do
    IFS=$'\t' read -r name args <<<"$run"
    read -r -a argv <<<"$args"
    "${mpirun[@]}" "$build/$name" "${argv[@]}" "${common[@]}" || echo "[run-local] $name $args did not run (see above)" >&2
  done
fi

# This machine's system description, fitted from the benchmark runs above (calibrate reads no step run); the latest
# one also under a stable name. Then every strata-step case of the suite predicted on it (a strata-project run in
# validation-<suite file> beside it), and the report of both.
echo "[run-local] calibrating this machine's system description from $output" >&2
if "$build/strata-project" calibrate "$output" -o "$system"; then
  cp "$system" "$latest"
  echo "[run-local] system description: $system (also $latest)" >&2
  echo "[run-local] validating: the suite's strata-step cases predicted on $system" >&2
  "$build/strata-project" validate "$output" --system "$system" -O "$validation" ||
    echo "[run-local] no validation (see above)" >&2
else
  echo "[run-local] no system description written (see above)" >&2
fi

report_dir="${output%.h5}-report"
reported=("$output")
[ -f "$validation" ] && reported+=("$validation")
# The report goes to its folder only: the programs' tables and the validation above are its figures.
scripts/strata-report "${reported[@]}" --out "$report_dir" --quiet
echo "[run-local] results: ${reported[*]}; report and plots: $report_dir/" >&2
