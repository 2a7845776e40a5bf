#!/usr/bin/env bash
# Packs what a GPU machine without MPI, HDF5 or a package registry needs to run Strata's GPU check
# (scripts/gpu/check.sh): the programs and GPU test binaries of a portable Release build (no -march=native:
# the GPU machine's CPU is not this one) with CUDA for sm_80 and sm_90, every shared library they load that the machine's image lacks (scripts/gpu/device-libraries.txt
# lists what it has), and Open MPI's launcher with its plugins, laid out so OPAL_PREFIX relocates it.
#
#   scripts/gpu/bundle.sh [--build DIR] [--out DIR] [--no-build]
#
# --build: the build folder (default build-gpu/, configured here); --no-build: take DIR as it is.
# Writes OUT (default .gpu-bundle/, git-ignored): strata-gpu.tar.xz and MANIFEST.txt. Fails (exit 1) when the
# bundle is over 60 MiB or a program would not find a library there. cuBLAS, cuBLASLt, the CUDA runtime and
# NCCL do not travel: check.sh finds the machine's own.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
build=$root/build-gpu
out=$root/.gpu-bundle
do_build=1
limit_mib=60
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --no-build) do_build=0; shift ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bundle.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$build" = /* ]] || build=$root/$build
[[ "$out" = /* ]] || out=$root/$out

say() { printf '[gpu-bundle] %s\n' "$*"; }
die() { printf '[gpu-bundle] error: %s\n' "$*" >&2; exit 1; }

programs=(strata-gemm strata-attention strata-collective strata-step strata-elementwise strata-project)
gpu_tests=(strata-gpu-tests strata-nccl-groups-gpu-tests strata-trainer-gpu-tests)
# The CPU's bf16 GEMMs need AVX-512 BF16 or AMX, which the GPU machine's host CPU may have and CI's does not.
gpu_tests+=(strata-unit-tests)

# ---- the build ------------------------------------------------------------------------------------------
if [ "$do_build" = 1 ]; then
  cached() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt" 2>/dev/null; }
  if [ "$(cached CMAKE_BUILD_TYPE)" != Release ] || [ "$(cached STRATA_CUDA_ARCHITECTURES)" != "80;90" ] ||
     [ "$(cached STRATA_NATIVE)" != OFF ]; then
    say "configuring $build (Release, portable: STRATA_NATIVE=OFF, CUDA sm_80 and sm_90)"
    cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA_ARCHITECTURES="80;90" -DSTRATA_NATIVE=OFF \
      -DCMAKE_RULE_MESSAGES=OFF -DCMAKE_TARGET_MESSAGES=OFF >/dev/null
  fi
  say "building ${programs[*]} ${gpu_tests[*]} in $build"
  cmake --build "$build" -j "$(nproc)" --target "${programs[@]}" "${gpu_tests[@]}" -- --no-print-directory
fi
for p in "${programs[@]}" "${gpu_tests[@]}"; do
  [ -x "$build/$p" ] || die "$build/$p is not built (a build with CUDA is needed: nvcc, cuBLASLt and NCCL in /usr/local/cuda)"
done

# ---- the sonames the machine has ------------------------------------------------------------------------
mapfile -t device_libs < <(grep -v '^#' "$root/scripts/gpu/device-libraries.txt" | grep .)
on_device() { local l; for l in "${device_libs[@]}"; do [ "$l" = "$1" ] && return 0; done; return 1; }

stage=$build/gpu-bundle-stage
rm -rf "$stage"
mkdir -p "$stage/bin" "$stage/lib"

# Open MPI, laid out as Debian's build expects under OPAL_PREFIX (libdir <prefix>/lib/<triplet>/openmpi/lib,
# plugins in its openmpi3/, help texts in <prefix>/share/openmpi); PMIx's plugins under PMIX_INSTALL_PREFIX.
ompi_libdir=$(ompi_info --path libdir --parsable 2>/dev/null | sed -n 's/^path:libdir://p')
ompi_pkglibdir=$(ompi_info --path pkglibdir --parsable 2>/dev/null | sed -n 's/^path:pkglibdir://p')
ompi_pkgdatadir=$(ompi_info --path pkgdatadir --parsable 2>/dev/null | sed -n 's/^path:pkgdatadir://p')
ompi_prefix=$(ompi_info --path prefix --parsable 2>/dev/null | sed -n 's/^path:prefix://p')
[ -n "$ompi_pkglibdir" ] && [ -d "$ompi_pkglibdir" ] || die "Open MPI's plugin folder not found (ompi_info --path pkglibdir)"
relative() { echo "${1#"$ompi_prefix"/}"; }
mkdir -p "$stage/openmpi/bin" "$stage/openmpi/$(relative "$ompi_pkglibdir")" "$stage/openmpi/$(relative "$ompi_pkgdatadir")"
for tool in orterun orted; do cp -L "$(command -v $tool)" "$stage/openmpi/bin/"; done
ln -s orterun "$stage/openmpi/bin/mpirun"
cp -L "$ompi_pkgdatadir"/help-*.txt "$stage/openmpi/$(relative "$ompi_pkgdatadir")/"
pmix_prefix=""
for dir in "$(dirname "$ompi_libdir")/../pmix2" /usr/lib/x86_64-linux-gnu/pmix2 /usr/lib/x86_64-linux-gnu/pmix; do
  [ -d "$dir/lib/pmix" ] && { pmix_prefix=$(cd "$dir" && pwd); break; }
done

# Every ELF file that travels, and the libraries each needs as ldd resolves them here.
elf_files=()
for p in "${programs[@]}" "${gpu_tests[@]}"; do cp "$build/$p" "$stage/bin/"; elf_files+=("$stage/bin/$p"); done
for tool in orterun orted; do elf_files+=("$stage/openmpi/bin/$tool"); done
plugins=("$ompi_pkglibdir"/*.so)
[ -n "$pmix_prefix" ] && plugins+=("$pmix_prefix"/lib/pmix/*.so)

# A plugin travels when every library it needs is on the device or here (the InfiniBand, OFI, UCX and PSM
# transports are left out: a one-node check does not use them, and their libraries are not on the device).
missing_of() { ldd "$1" 2>/dev/null | awk '/=> not found/ {print $1}'; }
needed_paths() { ldd "$1" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'; }
declare -A carried=()  # soname -> path here
left_out=()
collect() {  # collect FILE: adds the libraries FILE needs that the device lacks; fails for a missing one
  local file=$1 soname path
  while read -r soname path; do
    on_device "$soname" && continue
    [ -n "${carried[$soname]:-}" ] && continue
    carried[$soname]=$path
    collect "$path"
  done < <(needed_paths "$file")
}
for f in "${elf_files[@]}"; do
  [ -z "$(missing_of "$f")" ] || die "$f needs libraries not found here: $(missing_of "$f" | tr '\n' ' ')"
  collect "$f"
done
for plugin in "${plugins[@]}"; do
  deps_ok=1
  while read -r soname path; do
    on_device "$soname" && continue
    case $soname in libibverbs*|libfabric*|libucp*|libucs*|libuct*|libucm*|libpsm*|librdmacm*|libpsm2*) deps_ok=0 ;; esac
  done < <(needed_paths "$plugin")
  [ -n "$(missing_of "$plugin")" ] && deps_ok=0
  if [ "$deps_ok" = 0 ]; then left_out+=("$(basename "$plugin")"); continue; fi
  case $plugin in
    "$ompi_pkglibdir"/*) target="$stage/openmpi/$(relative "$ompi_pkglibdir")/" ;;
    *) target="$stage/pmix/lib/pmix/"; mkdir -p "$target" ;;
  esac
  cp -L "$plugin" "$target"
  elf_files+=("$target$(basename "$plugin")")
  collect "$plugin"
done
for soname in "${!carried[@]}"; do cp -L "${carried[$soname]}" "$stage/lib/$soname"; done

# ---- the manifest, the archive, the limits --------------------------------------------------------------
glibc_needed=$(for f in "${elf_files[@]}" "$stage"/lib/*; do objdump -T "$f" 2>/dev/null; done |
               grep -o 'GLIBC_[0-9.]*' | sort -u -V | tail -1)
glibcxx_needed=$(for f in "${elf_files[@]}" "$stage"/lib/*; do objdump -T "$f" 2>/dev/null; done |
                 grep -o 'GLIBCXX_[0-9.]*' | sort -u -V | tail -1)
mkdir -p "$out"
rm -f "$out/strata-gpu.tar.xz" "$out/MANIFEST.txt"
{
  echo "# Strata GPU bundle: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$root" diff --quiet 2>/dev/null || echo ' (with uncommitted changes)'), built $(date -u +%FT%TZ) on $(hostname)"
  native=$(sed -n 's/^STRATA_NATIVE:[A-Z]*=//p' "$build/CMakeCache.txt")
  echo "# build: $build ($(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$build/CMakeCache.txt"), CUDA architectures $(sed -n 's/^STRATA_CUDA_ARCHITECTURES:[A-Z]*=//p' "$build/CMakeCache.txt"), $( [ "$native" = OFF ] && echo portable || echo "-march=native for $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'): may not run on another CPU"))"
  echo "# needs on the machine: ${glibc_needed:-GLIBC ?} or newer, ${glibcxx_needed:-GLIBCXX ?} or newer, and: ${device_libs[*]}"
  echo "# Open MPI: OPAL_PREFIX=<bundle>/openmpi; PMIx plugins: PMIX_INSTALL_PREFIX=<bundle>/pmix"
  [ "${#left_out[@]}" -eq 0 ] || echo "# plugins left out (transports a one-node check does not use): ${left_out[*]}"
  echo "# bytes path (origin)"
  (cd "$stage" && find . -type f -printf '%s %P\n' | sort -k2)
} >"$out/MANIFEST.txt"
# Multi-threaded xz: the archive is what travels (about a fifth of the files' size); Python's tarfile, which
# every GPU image has, unpacks it.
tar -C "$stage" -cf - . | xz -6 -T0 >"$out/strata-gpu.tar.xz"
bytes=$(stat -c %s "$out/strata-gpu.tar.xz")
unpacked=$(du -sb "$stage" | cut -f1)
echo "# archive: $bytes bytes (unpacked $unpacked)" >>"$out/MANIFEST.txt"
say "$out/strata-gpu.tar.xz: $((bytes / 1048576)) MiB ($((unpacked / 1048576)) MiB unpacked; limit $limit_mib MiB)," \
    "${#carried[@]} libraries, ${#left_out[@]} transport plugins left out"
[ "$bytes" -le $((limit_mib * 1048576)) ] || die "the bundle is $((bytes / 1048576)) MiB, over the $limit_mib MiB limit"
