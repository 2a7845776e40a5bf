#!/usr/bin/env bash
# Installs what Strata needs to build and test, and only what is missing. Safe to run again and again.
# --pytorch also puts PyTorch (CPU and CUDA wheels, about 4 GB) into .venv-pytorch in the checkout, for make
# bench's comparison of the CPU step with PyTorch eager (scripts/bench/step_vs_pytorch.py).
# On Debian/Ubuntu as root (or with password-less sudo) it uses apt; elsewhere it prints exactly what is
# missing and how to get it (e.g. `module load` on a cluster), and exits 1.
#
# Never the single-threaded OpenBLAS (libopenblas0-serial): it has no locking and gives wrong results when
# two threads call it at once. Strata asks for the pthread build.
set -euo pipefail

with_pytorch=0
for arg in "$@"; do
  case "$arg" in
    --pytorch) with_pytorch=1 ;;
    *) printf 'install-deps.sh: unknown option %s (known: --pytorch)\n' "$arg" >&2; exit 2 ;;
  esac
done
# The PyTorch release make bench's CPU comparison was measured against.
pytorch_version=2.15.0

packages=(
  g++ make cmake pkg-config git
  openmpi-bin libopenmpi-dev
  libhdf5-dev hdf5-tools
  libopenblas-pthread-dev
  libbenchmark-dev libgtest-dev
  libdnnl-dev libhwloc-dev nlohmann-json3-dev libcli11-dev libglpk-dev libeigen3-dev
  python3
)
# Headers checked through the compiler after the packages, so a library installed by hand (a cluster's module,
# spack) counts and a package that did not install its header does not.
headers=(glpk.h eigen3/Eigen/Dense)
# pip, setuptools and wheel: `make test` installs the Python package (python/) into a fresh virtual environment.
python_modules=(h5py numpy pandas matplotlib scipy pytest pip setuptools wheel)
python_debs=(python3-h5py python3-numpy python3-pandas python3-matplotlib python3-scipy python3-pytest python3-pip
             python3-setuptools python3-wheel python3-venv)

say() { printf '[install-deps] %s\n' "$*"; }

missing_packages() {
  local p
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || printf '%s\n' "$p"
  done
}

missing_python_modules() {
  local m
  for m in "${python_modules[@]}"; do
    python3 -c "import $m" 2>/dev/null || printf '%s\n' "$m"
  done
}

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; elif sudo -n true 2>/dev/null; then sudo "$@"; else return 1; fi
}

can_apt() { command -v apt-get >/dev/null && command -v dpkg-query >/dev/null && { [ "$(id -u)" = 0 ] || sudo -n true 2>/dev/null; }; }

explain_manual_install() {
  say "cannot install automatically here (not root, or not Debian/Ubuntu). Missing:"
  [ -n "${1:-}" ] && say "  system packages: $1"
  [ -n "${2:-}" ] && say "  python modules:  $2"
  cat >&2 <<'TEXT'
How to get them:
  Debian/Ubuntu:  sudo apt-get install g++ make cmake pkg-config openmpi-bin libopenmpi-dev libhdf5-dev \
                  hdf5-tools libopenblas-pthread-dev libbenchmark-dev libgtest-dev libdnnl-dev \
                  libhwloc-dev nlohmann-json3-dev libcli11-dev libglpk-dev libeigen3-dev python3
  HPC cluster:    module load gcc cmake openmpi hdf5 openblas hwloc glpk eigen   (module names vary by site; use the
                  pthread or OpenMP OpenBLAS, never a serial one), then build GoogleTest, Google Benchmark,
                  nlohmann-json, CLI11 and (optional) oneDNN from your site's software stack or spack
                  (spack install googletest benchmark nlohmann-json cli11 onednn)
  Python:         python3 -m pip install --user h5py numpy pandas matplotlib scipy pytest setuptools
TEXT
  exit 1
}

# ---- system packages ----------------------------------------------------------------------------------
if command -v dpkg-query >/dev/null; then
  mapfile -t need < <(missing_packages)
  if [ "${#need[@]}" -gt 0 ]; then
    can_apt || explain_manual_install "${need[*]}" ""
    say "installing: ${need[*]}"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
  if dpkg-query -W -f='${Status}' libopenblas0-serial 2>/dev/null | grep -q "install ok installed"; then
    say "warning: libopenblas0-serial is installed; Strata links the pthread build (pkg-config openblas) and"
    say "         refuses --blas-threads > 1 if the serial one is picked up at run time"
  fi
else
  for tool in g++ cmake mpicxx mpirun h5dump pkg-config python3; do
    command -v "$tool" >/dev/null || explain_manual_install "$tool (and its development files)" ""
  done
fi

# ---- headers ------------------------------------------------------------------------------------------
missing_headers() {
  local h
  for h in "${headers[@]}"; do
    printf '#include <%s>\n' "$h" | "${CXX:-g++}" -E -x c++ - >/dev/null 2>&1 || printf '%s\n' "$h"
  done
}
mapfile -t need_headers < <(missing_headers)
[ "${#need_headers[@]}" -eq 0 ] || explain_manual_install "headers ${need_headers[*]} (glpk.h: libglpk-dev; eigen3/Eigen/Dense: libeigen3-dev)" ""

# ---- Python modules -----------------------------------------------------------------------------------
mapfile -t need_py < <(missing_python_modules)
if [ "${#need_py[@]}" -gt 0 ]; then
  python=$(readlink -f "$(command -v python3)")
  if [[ "$python" == /usr/bin/python3* ]] && can_apt; then
    # The distribution's Python is externally managed: use its packages.
    say "installing: ${python_debs[*]}"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${python_debs[@]}" >/dev/null
  elif python3 -m pip --version >/dev/null 2>&1; then
    say "installing with pip into $(command -v python3): ${need_py[*]}"
    python3 -m pip install --quiet --disable-pip-version-check "${need_py[@]}" ||
      explain_manual_install "" "${need_py[*]}"
  else
    explain_manual_install "" "${need_py[*]}"
  fi
  mapfile -t still < <(missing_python_modules)
  [ "${#still[@]}" -eq 0 ] || explain_manual_install "" "${still[*]}"
fi

# ---- optional: what the cluster tests need (tests/cluster) --------------------------------------------
# A throw-away Slurm (slurmctld, slurmd, munged) and network namespaces. Installed only when running as root
# on Debian/Ubuntu (CI containers): on a workstation these packages would enable system services, so there
# the tests report themselves skipped and this only says what they would need. STRATA_CLUSTER_DEPS=0 skips
# the group.
cluster_packages=(slurm-wlm munge iproute2 util-linux)
if [ "${STRATA_CLUSTER_DEPS:-1}" != 0 ] && command -v dpkg-query >/dev/null; then
  need_cluster=()
  for p in "${cluster_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need_cluster+=("$p")
  done
  if [ "${#need_cluster[@]}" -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && [ -f /etc/debian_version ] && command -v apt-get >/dev/null; then
      say "installing (cluster tests): ${need_cluster[*]}"
      env DEBIAN_FRONTEND=noninteractive apt-get update -qq
      env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_cluster[@]}" >/dev/null ||
        say "warning: could not install ${need_cluster[*]}; the cluster tests will report themselves skipped"
    else
      say "optional, for the cluster tests (skipped without them; installed automatically only as root):" \
          "${need_cluster[*]}"
    fi
  fi
fi

# ---- optional: PyTorch for make bench (--pytorch) ------------------------------------------------------
if [ "$with_pytorch" = 1 ]; then
  venv="$(cd "$(dirname "$0")/.." && pwd)/.venv-pytorch"
  if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$pytorch_version')" 2>/dev/null; then
    :
  else
    say "installing PyTorch $pytorch_version into $venv (about 4 GB with its CUDA wheels)"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "torch==$pytorch_version" numpy ||
      { say "could not install PyTorch; make bench reports the comparison as not measured"; exit 0; }
  fi
fi

say "all dependencies present"
