"""Strata installed like any other tool: `cmake --install` into a prefix that is then moved (the programs find the
shipped descriptions and the commands their package from wherever the prefix lands), the Python package installed
from python/ into a fresh virtual environment with its entry points, and the Spack recipe's class body run against
a stand-in of Spack's API: every library CMakeLists.txt looks for is a dependency, and the variants reach CMake."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import types

import pytest

import strata_results as sr
from conftest import BUILD, ROOT, mpi_env

PROGRAMS = [line.split("|")[0].strip() for line in open(os.path.join(ROOT, "bench", "programs.txt"))
            if line.strip() and not line.startswith("#")]
COMMANDS = ["strata-report", "strata-compare", "strata-merge", "strata-trace"]


def run(args, cwd, env=None, timeout=300):
    return subprocess.run([str(a) for a in args], cwd=str(cwd), env=env or mpi_env(), capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def prefix(tmp_path_factory):
    """An install, moved away from where it was installed to, with the checkout out of reach by name."""
    work = tmp_path_factory.mktemp("install")
    result = run(["cmake", "--install", BUILD, "--prefix", work / "staged"], cwd=work)
    assert result.returncode == 0, result.stderr
    moved = work / "moved" / "strata"
    moved.parent.mkdir()
    shutil.move(str(work / "staged"), str(moved))
    return moved


def test_the_install_holds_the_programs_commands_and_shipped_files(prefix):
    for name in PROGRAMS + COMMANDS:
        assert os.access(prefix / "bin" / name, os.X_OK), name
    share = prefix / "share" / "strata"
    systems = sorted(os.listdir(os.path.join(ROOT, "project", "systems")))
    assert sorted(os.listdir(share / "project" / "systems")) == systems
    assert (share / "project" / "published" / "steps.json").is_file()
    assert (share / "bench" / "programs.txt").is_file() and (share / "scripts" / "programs.sh").is_file()
    for template in ["suite", "step", "collective-sweep", "multi-gpu"]:
        assert (share / "scripts" / "slurm" / f"{template}.sbatch").is_file(), template
    assert (share / "python" / "strata_analysis" / "results.py").is_file()
    doc = prefix / "share" / "doc" / "strata"
    assert (doc / "README.md").is_file() and (doc / "docs" / "design").is_dir()
    assert (doc / "results" / "SCHEMA.md").is_file() and (doc / "project" / "SYSTEM.md").is_file()
    # Nothing of the build folder or the checkout is named in what was installed as text.
    for folder, _, files in os.walk(share):
        for name in files:
            if name.endswith((".sh", ".sbatch", ".py", ".txt")):
                text = open(os.path.join(folder, name), encoding="utf-8").read()
                assert ROOT not in text and BUILD not in text, os.path.join(folder, name)


def test_installed_programs_find_shipped_files_by_name_from_a_moved_prefix(prefix, tmp_path):
    project = prefix / "bin" / "strata-project"
    out = tmp_path / "predicted.h5"
    result = run([project, "predict", "--system", "h100-sxm-ndr400", "--model", "tiny", "--seq", "32",
                  "--micro-batch", "1", "--accumulation", "2", "-q", "-O", out], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    runs = sr.read_runs(str(out))
    assert list(runs["status"]) == ["ok"]
    assert runs["system_file"].iloc[0] == str(prefix / "share" / "strata" / "project" / "systems" / "h100-sxm-ndr400.json")
    # The published set by name, and its systems beside it.
    result = run([project, "validate", "--published", "steps", "--only", "megatron-2021-t1-1.7b", "-q",
                  "-O", tmp_path / "published.h5"], cwd=tmp_path)
    assert result.returncode in (0, 3), result.stderr  # 3: a held-out error above its target, still a prediction
    assert "megatron-2021-t1-1.7b" in result.stdout
    # A name that is neither a file nor shipped: the message lists what is shipped, exit 2, nothing written.
    result = run([project, "predict", "--system", "b200-nvl72", "--model", "tiny", "-O", tmp_path / "none.h5"],
                 cwd=tmp_path)
    assert result.returncode == 2
    assert "system description b200-nvl72: no such file, nor a shipped description of that name" in result.stderr
    assert "h100-sxm-ndr400" in result.stderr
    assert not (tmp_path / "none.h5").exists()


def test_installed_commands_read_what_installed_programs_wrote(prefix, tmp_path):
    out = tmp_path / "gemm.h5"
    result = run([prefix / "bin" / "strata-gemm", "--backend", "cpu", "-d", "fp32", "--square", "32:64", "-n", "2",
                  "-w", "1", "-O", out], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    # A PATH without the checkout's scripts: the commands are the install's own.
    env = dict(mpi_env(), PATH=f"{prefix / 'bin'}:/usr/bin:/bin", PYTHONPATH="")
    report = run([sys.executable, prefix / "bin" / "strata-report", out, "--out", tmp_path / "report", "--quiet"],
                 cwd=tmp_path, env=env)
    assert report.returncode == 0, report.stderr
    assert (tmp_path / "report" / "report.md").is_file()
    trace = run([sys.executable, prefix / "bin" / "strata-trace", "--help"], cwd=tmp_path, env=env)
    assert trace.returncode == 0 and "strata-trace" in trace.stdout


def test_the_python_package_installs_into_a_fresh_environment(tmp_path):
    """pip install ./python into a new virtual environment (the system's site packages give h5py, numpy, pandas and
    matplotlib, so nothing is downloaded); its entry points and its reader then work from anywhere."""
    venv = tmp_path / "venv"
    result = run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    python = venv / "bin" / "python"
    source = tmp_path / "python"  # a copy: building writes build/ and *.egg-info beside the sources
    shutil.copytree(os.path.join(ROOT, "python"), source, ignore=shutil.ignore_patterns("build", "*.egg-info",
                                                                                        "__pycache__"))
    result = run([python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
                  source], cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    for command in COMMANDS:
        assert os.access(venv / "bin" / command, os.X_OK), command
    out = tmp_path / "gemm.h5"
    result = run([os.path.join(BUILD, "strata-gemm"), "--backend", "cpu", "-d", "fp32", "--square", "32", "-n", "2",
                  "-w", "1", "-O", out], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    env = dict(mpi_env(), PATH=f"{venv / 'bin'}:/usr/bin:/bin", PYTHONPATH="")
    report = run([venv / "bin" / "strata-report", out, "--out", tmp_path / "report", "--quiet"], cwd=tmp_path, env=env)
    assert report.returncode == 0, report.stderr
    assert (tmp_path / "report" / "report.md").is_file()
    # The package is the installed one, not the checkout's, and reads the file.
    code = ("import strata_analysis, strata_analysis.results as sr, sys; "
            "print(strata_analysis.__file__); print(len(sr.read_runs(sys.argv[1])))")
    read = run([python, "-c", code, out], cwd=tmp_path, env=env)
    assert read.returncode == 0, read.stderr
    location, runs = read.stdout.split()
    assert location.startswith(str(venv)) and runs == "1"
    # One version: the package's and the CMake project's.
    cmake_version = re.search(r"project\(strata VERSION ([0-9.]+)", open(os.path.join(ROOT, "CMakeLists.txt")).read())
    show = run([python, "-m", "pip", "show", "strata-analysis"], cwd=tmp_path, env=env)
    assert f"Version: {cmake_version.group(1)}" in show.stdout, show.stdout


class _Recorder:
    """A stand-in of Spack's package API: records the directives the recipe's class body calls."""

    def __init__(self):
        self.calls = []

    def directive(self, kind):
        def record(*args, **kwargs):
            self.calls.append((kind, args, kwargs))
        return record


def load_spack_recipe():
    recorder = _Recorder()
    api = types.ModuleType("spack.package")

    class CMakePackage:
        def define(self, name, value):
            return f"-D{name}={'ON' if value is True else 'OFF' if value is False else value}"

        def define_from_variant(self, name, variant):
            return self.define(name, self.spec.variants[variant].value)

    class CudaPackage:
        pass

    api.CMakePackage, api.CudaPackage = CMakePackage, CudaPackage
    for kind in ["version", "variant", "depends_on", "conflicts"]:
        setattr(api, kind, recorder.directive(kind))
    spack = types.ModuleType("spack")
    spack.package = api
    saved = {name: sys.modules.get(name) for name in ("spack", "spack.package")}
    sys.modules.update({"spack": spack, "spack.package": api})
    try:
        namespace: dict = {}
        path = os.path.join(ROOT, "packaging", "spack", "package.py")
        exec(compile(open(path).read(), path, "exec"), namespace)
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    return namespace["Strata"], recorder.calls, CMakePackage, CudaPackage


def test_the_spack_recipe_depends_on_what_cmake_finds_and_passes_its_variants():
    recipe, calls, cmake_package, cuda_package = load_spack_recipe()
    assert issubclass(recipe, cmake_package) and issubclass(recipe, cuda_package)  # CudaPackage: +cuda, cuda_arch
    dependencies = {args[0].split("@")[0].split()[0].split("~")[0].split("+")[0]: kwargs
                    for kind, args, kwargs in calls if kind == "depends_on"}
    variants = {args[0]: kwargs for kind, args, kwargs in calls if kind == "variant"}
    assert variants["nccl"].get("when") == "+cuda"
    assert dependencies["nccl"].get("when") == "+nccl"
    # Every library CMakeLists.txt looks for, under Spack's name for it.
    spack_name = {"MPI": "mpi", "HDF5": "hdf5", "openblas": "openblas", "GTest": "googletest", "benchmark": "benchmark",
                  "hwloc": "hwloc", "nlohmann_json": "nlohmann-json", "CLI11": "cli11", "Eigen3": "eigen",
                  "glpk": "glpk", "dnnl": "onednn", "nccl": "nccl", "PkgConfig": "pkgconfig"}
    cmake = open(os.path.join(ROOT, "CMakeLists.txt")).read()
    found = set(re.findall(r"find_package\((\w+)", cmake)) | set(re.findall(r"pkg_check_modules\(\w+ REQUIRED IMPORTED_TARGET (\w+)", cmake))
    found |= set(re.findall(r"find_library\(\w+ (\w+)", cmake))
    found -= {"Threads", "OpenMP", "CUDAToolkit"}  # the compiler's, and CudaPackage's
    missing = sorted(name for name in found if spack_name.get(name) not in dependencies)
    assert not missing, f"CMakeLists.txt finds {missing}, which the Spack recipe does not depend on"

    class Variant:
        def __init__(self, value):
            self.value = value

    class Spec:
        def __init__(self, cuda, archs=("none",)):
            self.cuda = cuda
            self.variants = {"native": Variant(False), "cuda_arch": Variant(archs)}

        def satisfies(self, constraint):
            return {"+cuda": self.cuda}[constraint]

    package = recipe.__new__(recipe)
    package.spec = Spec(cuda=False)
    assert "-DSTRATA_CUDA=OFF" in package.cmake_args() and "-DSTRATA_NATIVE=OFF" in package.cmake_args()
    package.spec = Spec(cuda=True, archs=("80", "90"))
    args = package.cmake_args()
    assert "-DSTRATA_CUDA=ON" in args and "-DSTRATA_CUDA_ARCHITECTURES=80;90" in args
    assert re.search(r"STRATA_CUDA_ARCHITECTURES", cmake)  # the cache variable the recipe sets exists
