#!/usr/bin/env bash
# The GPU check: every GPU path of Strata built, tested and measured beside PyTorch in one call, each part
# under its own timeout so a hang costs that part only, ending with one summary table.
#
#   scripts/gpu/check.sh [--dry-run] [--bundle DIR | --build DIR] [--out DIR] [--budget SECONDS] [--only GLOBS]
#
# Where the programs come from: --bundle DIR (default .gpu-bundle/ when it holds strata-gpu.tar.xz: a machine
# without MPI or HDF5, see bundle.sh) or --build DIR (a build on a GPU node: `make gpu-check`). Writes into
# --out (default $OUT, else gpu-check-out/): check.log (every part's output), results.h5 (every Strata run;
# results.h5.xz when over 15 MiB), pytorch.jsonl (PyTorch's figures), summary.md and summary.json. --budget:
# seconds for the whole check (default 540); a part gets what is left, and parts that no longer fit are skipped
# and say so.
# --only: comma-separated shell patterns of part names to run (e.g. 'gpu-tests,step-*'; exit 2 before anything
# runs when none matches); the others are recorded as skipped. --dry-run: on a machine without a GPU, every part
# starts and reports "no device"; a CPU run of strata-gemm through the same launcher and libraries proves the
# bundle. Exit 0 when no part failed.
set -uo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
bundle=""
build=""
out=${OUT:-$root/gpu-check-out}
budget=540
dry_run=0
only=""
while [ $# -gt 0 ]; do
  case $1 in
    --dry-run) dry_run=1; shift ;;
    --bundle) bundle=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "check.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$budget" =~ ^[0-9]+$ ]] || { echo "check.sh: --budget '$budget' is not a number of seconds" >&2; exit 2; }
# Every part, in the order it runs; part() refuses a name that is not here.
part_names=(cpu-smoke cpu-bf16 cpu-bf16-step gpu-tests nccl-groups-tests trainer-tests gemm gemm-pytorch attention attention-pytorch
            step-gpt2-124m step-gpt2-124m-pytorch-eager step-gpt2-124m-pytorch-compile
            step-gpt2-350m step-gpt2-350m-pytorch-eager step-gpt2-350m-pytorch-compile collective-nccl memcheck)
only_patterns=()
[ -n "$only" ] && IFS=, read -ra only_patterns <<<"${only// /}"
# selected NAME: whether --only (or its absence) asks for the part.
selected() {
  [ -z "$only" ] && return 0
  local pattern
  for pattern in "${only_patterns[@]}"; do
    # shellcheck disable=SC2053 # the pattern is meant to match as a glob
    [[ $1 == $pattern ]] && return 0
  done
  return 1
}
if [ -n "$only" ]; then
  matched=0
  for name in "${part_names[@]}"; do selected "$name" && matched=1; done
  [ "$matched" = 1 ] || { echo "check.sh: --only '$only' names no part (parts: ${part_names[*]})" >&2; exit 2; }
fi
if [ -z "$bundle" ] && [ -z "$build" ]; then
  if [ -f "$root/.gpu-bundle/strata-gpu.tar.xz" ]; then bundle=$root/.gpu-bundle; else build=$root/build; fi
fi
started=$(date +%s)
deadline=$((started + budget))
mkdir -p "$out"
log=$out/check.log
parts=$out/parts.tsv
results=$out/results.h5
torch_json=$out/pytorch.jsonl
rm -f "$log" "$parts" "$results" "$results.xz" "$results.xz.part" "$torch_json" "$out/summary.md" "$out/summary.json"
say() { printf '[gpu-check] %s\n' "$*" | tee -a "$log"; }

# ---- the programs, their libraries and the launcher ---------------------------------------------------
if [ -n "$bundle" ]; then
  [ -f "$bundle/strata-gpu.tar.xz" ] || { echo "check.sh: $bundle/strata-gpu.tar.xz not found (run scripts/gpu/bundle.sh)" >&2; exit 2; }
  home=${TMPDIR:-/tmp}/strata-gpu-bundle
  rm -rf "$home" && mkdir -p "$home"
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$bundle/strata-gpu.tar.xz" "$home" ||
    { echo "check.sh: could not unpack $bundle/strata-gpu.tar.xz" >&2; exit 2; }
  bin=$home/bin
  export LD_LIBRARY_PATH=$home/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export OPAL_PREFIX=$home/openmpi PATH=$home/openmpi/bin:$PATH
  export PMIX_INSTALL_PREFIX=$home/pmix PMIX_MCA_mca_base_component_path=$home/pmix/lib/pmix
  say "programs: bundle $bundle ($(head -1 "$bundle/MANIFEST.txt" 2>/dev/null | sed 's/^# //')), unpacked in $home"
else
  bin=$build
  [ -x "$bin/strata-gemm" ] || { echo "check.sh: $bin/strata-gemm is not built (make build, or --bundle)" >&2; exit 2; }
  say "programs: build $build"
fi

# cuBLAS, cuBLASLt, the CUDA runtime and NCCL: the machine's own. Python's nvidia-* wheels first (what its
# PyTorch uses), then the CUDA toolkit, then the loader's cache.
cuda_dirs=()
if command -v python3 >/dev/null; then
  while read -r dir; do cuda_dirs+=("$dir"); done < <(python3 - <<'PY' 2>/dev/null
import glob, os, site
roots = site.getsitepackages() + [site.getusersitepackages()]
for root in roots:
    for pattern in ("nvidia/*/lib", "nvidia/cu13/lib", "nvidia/*/lib64"):
        for d in sorted(glob.glob(os.path.join(root, pattern))):
            print(d)
PY
)
fi
cuda_dirs+=(/usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib)
for soname in libcublasLt.so.13 libcublas.so.13 libcudart.so.13 libnccl.so.2; do
  found=""
  for dir in "${cuda_dirs[@]}"; do [ -e "$dir/$soname" ] && { found=$dir; break; }; done
  if [ -z "$found" ]; then
    found=$(ldconfig -p 2>/dev/null | awk -v s="$soname" '$1 == s {print $NF; exit}')
    [ -n "$found" ] && found=$(dirname "$found")
  fi
  if [ -n "$found" ]; then
    case ":${LD_LIBRARY_PATH:-}:" in *":$found:"*) ;; *) export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$found ;; esac
    say "$soname: $found/$soname"
  else
    say "$soname: not found on this machine"
  fi
done

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export STRATA_CACHE_DIR=${TMPDIR:-/tmp}/strata-gpu-check-cache
# The bundle's PMIx finds the image's own PMIx plugins too (a zlib compressor built for another version), which
# it cannot load: it says so and goes on without compression, which a one-node run does not need.
export PMIX_MCA_pcompress_base_silence_warning=1
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
say "GPUs: ${gpus:-0}$( [ "${gpus:-0}" -gt 0 ] && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1 | sed 's/^/ (/; s/$/)/')"
if [ "${gpus:-0}" = 0 ] && [ "$dry_run" = 0 ]; then
  say "no GPU on this machine: every GPU part will report 'no device' (--dry-run says this is expected)"
fi
launch=(mpirun --bind-to none -np 1)

# ---- parts ----------------------------------------------------------------------------------------------
failures=0
# part NAME LIMIT COMMAND...: runs COMMAND under min(LIMIT, what the budget leaves) seconds; records its status
# (ok, no device, timed out, skipped, FAILED) with a note from its output.
part() {
  local name=$1 limit=$2; shift 2
  local now left status note code
  [[ " ${part_names[*]} " == *" $name "* ]] || { echo "check.sh: part '$name' is not in part_names" >&2; exit 1; }
  if ! selected "$name"; then
    printf '%s\tskipped\t0\tnot asked for (--only)\n' "$name" >>"$parts"
    return
  fi
  now=$(date +%s)
  left=$((deadline - now - 15))  # the summary's seconds stay
  if [ "$left" -lt 10 ]; then
    printf '%s\tskipped\t0\tno time left in the %s s budget\n' "$name" "$budget" >>"$parts"
    say "part $name: skipped (no time left)"
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  say "part $name: starting (limit $limit s): $*"
  local part_log=$out/.part.log
  local t0=$(date +%s)
  timeout -k 10 "$limit" "$@" >"$part_log" 2>&1
  code=$?
  local seconds=$(($(date +%s) - t0))
  cat "$part_log" >>"$log"
  # GoogleTest's counts, and the first failed tests by name.
  note=$( { grep -E '^\[  (PASSED|SKIPPED|FAILED) +\] [0-9]+ tests?' "$part_log" | sed -E 's/^\[  ([A-Z]+) +\] ([0-9]+) .*/\2 \1/'
            grep -E '^\[  FAILED  \] [A-Za-z0-9_/]+\.[A-Za-z0-9_/]+' "$part_log" | grep -v ' ms)' | head -3 | sed 's/^\[  FAILED  \] /failed: /'
          } | tr '\n' ';' | sed 's/;$//; s/;/; /g' | cut -c1-200)
  if [ "$code" = 124 ] || [ "$code" = 137 ]; then
    status="timed out"
  elif grep -qE 'no CUDA device|0 GPU\(s\)|no device:' "$part_log" && ! grep -qE '^\[  PASSED  \] [1-9]' "$part_log"; then
    status="no device"
    [ -n "$note" ] || note=$(grep -m1 -E 'no CUDA device|0 GPU\(s\)|no device:' "$part_log" | cut -c1-160)
  elif [ "$code" = 0 ]; then
    status=ok
  else
    status="FAILED (exit $code)"
    # The program's own words first (a failed check, its error), then any line that says error, but not the
    # image's PMIx plugins that the bundle's PMIx cannot load (harmless, and printed by every launch).
    [ -n "$note" ] || note=$(grep -m1 -E 'check failed|^strata-[a-z-]+: (error|rank)' "$part_log" | cut -c1-200)
    [ -n "$note" ] || note=$(grep -iE 'error|fail' "$part_log" | grep -vE 'pmix|dlopen' | head -1 | cut -c1-160)
  fi
  case $status in "timed out"|FAILED*) failures=$((failures + 1)) ;; esac
  printf '%s\t%s\t%s\t%s\n' "$name" "$status" "$seconds" "${note//$'\t'/ }" >>"$parts"
  say "part $name: $status after $seconds s${note:+ ($note)}"
  rm -f "$part_log"
}

common=(--output "$results" -q)
# The bundle itself, on the CPU: launcher, MPI, HDF5 and BLAS as the GPU parts use them.
part cpu-smoke 90 "${launch[@]}" "$bin/strata-gemm" --shapes 256x256x256 -d fp32 -w 1 -n 3 "${common[@]}"
# The CPU step's bf16 GEMMs, on this host's CPU: checked where it has AVX-512 BF16 or AMX (the tests skip and say
# why elsewhere), and its one-core step beside PyTorch's CPU autocast (strata-step's reason where it refuses).
part cpu-bf16 60 "$bin/strata-unit-tests" --gtest_filter='CpuGemmBf16.*:GptCpu.Bf16*:Linear.*'
part cpu-bf16-step 120 python3 "$root/scripts/bench/step_vs_pytorch.py" --build "$bin" --pairs bf16 --rounds 1 --steps 3 \
  --report-only
part gpu-tests 240 "$bin/strata-gpu-tests"
part nccl-groups-tests 90 "${launch[@]}" "$bin/strata-nccl-groups-gpu-tests"
part trainer-tests 120 "${launch[@]}" "$bin/strata-trainer-gpu-tests"
part gemm 150 "${launch[@]}" "$bin/strata-gemm" --backend cuda -d fp32,tf32,fp16,bf16,fp8 --shapes 8192x8192x8192 \
  --preset gpt3-175b --tokens 2048 -w 3 -n 10 "${common[@]}"
# PyTorch on the same shapes: the ones strata-gemm ran, read back from its run (8192^3 when it ran none).
gemm_shapes=$(python3 "$root/scripts/gpu/summary.py" --shapes-of "$results" 2>/dev/null || true)
part gemm-pytorch 120 python3 "$root/scripts/gpu/pytorch_reference.py" gemm --dtypes fp32,tf32,fp16,bf16,fp8 \
  --shapes "${gemm_shapes:-8192x8192x8192}" --json "$torch_json"
part attention 150 "${launch[@]}" "$bin/strata-attention" --backend cuda --impl flash -d bf16 -B 4 -H 32 -s 4096 \
  -D 128 --causal both -p fwd,bwd -w 3 -n 10 "${common[@]}"
part attention-pytorch 90 python3 "$root/scripts/gpu/pytorch_reference.py" attention --batch 4 --heads 32 --seq 4096 \
  --dim 128 --dtype bf16 --json "$torch_json"
for model in gpt2-124m gpt2-350m; do
  part "step-$model" 120 "${launch[@]}" "$bin/strata-step" --backend cuda -m "$model" -s 1024 -b 8 -w 2 -n 8 "${common[@]}"
  part "step-$model-pytorch-eager" 90 python3 "$root/scripts/gpu/pytorch_reference.py" step --model "$model" --seq 1024 \
    --micro-batch 8 --warmup 2 --iters 8 --json "$torch_json"
  part "step-$model-pytorch-compile" 150 python3 "$root/scripts/gpu/pytorch_reference.py" step --model "$model" \
    --seq 1024 --micro-batch 8 --warmup 2 --iters 8 --compile --json "$torch_json"
done
part collective-nccl 90 "${launch[@]}" "$bin/strata-collective" --backend nccl --collective all -d float,bfloat16 \
  -b 8 -e 256M -f 8 -w 2 -n 10 "${common[@]}"
# compute-sanitizer where the runtime lets it run (not under gVisor); last, with what the budget leaves. API
# errors are not reported: NCCL's initialisation asks for the attributes of its kernels for other architectures
# and gets cudaErrorNoKernelImageForDevice (24 such reports on an H200), and Strata checks every CUDA call
# itself, so an error of ours still fails the tests.
if command -v compute-sanitizer >/dev/null 2>&1 || ! selected memcheck; then
  part memcheck 200 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 99 "$bin/strata-gpu-tests"
else
  printf 'memcheck\tskipped\t0\tcompute-sanitizer is not on this machine\n' >>"$parts"
  say "part memcheck: skipped (compute-sanitizer is not on this machine)"
fi

# ---- summary --------------------------------------------------------------------------------------------
python3 "$root/scripts/gpu/summary.py" --results "$results" --pytorch "$torch_json" --parts "$parts" \
  --markdown "$out/summary.md" --json "$out/summary.json" $([ "$dry_run" = 1 ] && echo --dry-run) | tee -a "$log"
summary_code=${PIPESTATUS[0]}
rm -f "$parts"
# Results over 15 MiB are replaced by results.h5.xz (fast compression, within what the budget leaves, at least
# 30 s); the file is replaced only by a whole .xz.
if [ -f "$results" ] && [ "$(stat -c %s "$results")" -gt $((15 * 1048576)) ]; then
  compress_limit=$((deadline - $(date +%s)))
  [ "$compress_limit" -lt 30 ] && compress_limit=30
  if timeout "$compress_limit" python3 -c 'import lzma, shutil, sys
with open(sys.argv[1], "rb") as src, lzma.open(sys.argv[2], "wb", preset=1) as dst: shutil.copyfileobj(src, dst)' \
       "$results" "$results.xz.part" && mv "$results.xz.part" "$results.xz"; then
    say "results.h5: $(( $(stat -c %s "$results") / 1048576 )) MiB, written compressed as results.h5.xz ($(( $(stat -c %s "$results.xz") / 1048576 )) MiB)"
    rm -f "$results"
  else
    rm -f "$results.xz.part"
    say "results.h5: could not be compressed in $compress_limit s; left as it is"
  fi
fi
say "done in $(($(date +%s) - started)) s; files in $out: $(cd "$out" && ls | tr '\n' ' ')"
[ "$failures" = 0 ] && [ "$summary_code" = 0 ]
