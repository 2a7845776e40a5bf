"""The measured machine description as a run records it: measured once and then read from the job's cache,
printed first, written into the `env` group, used by every %peak; the OpenBLAS core corrected by
re-execution when the library falls back to a generic core; bad --library input refused with exit 2."""
from __future__ import annotations

import json
import os

import h5py
import pytest

from conftest import mpirun, program, run_single


def cpu_flags() -> set[str]:
    with open("/proc/cpuinfo") as info:
        for line in info:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def env_of(path) -> dict:
    with h5py.File(path, "r") as f:
        (run,) = f["runs"].values()
        return {k: (v.decode() if isinstance(v, bytes) else str(v)) for k, v in run["env"].attrs.items()}


def gemm(tmp_path, name, extra_env=None, args=(), np=1):
    """strata-gemm with `extra_env` over this environment; a user's own OPENBLAS_CORETYPE (a shell or CI may set one)
    is left out unless `extra_env` names it, since the tests below are about Strata's choice of core."""
    out = tmp_path / f"{name}.h5"
    command = [program("strata-gemm"), "--shapes", "64x64x64", "-d", "fp32,fp64", "-n", "2", "-w", "1",
               "--output", str(out), *args]
    env = {"STRATA_CACHE_DIR": str(tmp_path / "cache"), "OPENBLAS_CORETYPE": None, **(extra_env or {})}
    old = {k: os.environ.get(k) for k in env}
    for k, v in env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:
        result = mpirun(np, command, cwd=str(tmp_path))
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return out, result


def test_measured_once_then_read_from_the_cache(tmp_path):
    first, r1 = gemm(tmp_path, "first", np=2)
    assert r1.returncode == 0, r1.stderr
    second, r2 = gemm(tmp_path, "second", np=2)
    assert r2.returncode == 0, r2.stderr
    e1, e2 = env_of(first), env_of(second)
    assert e1["machine_source"].startswith("measured now, cached in ")
    assert e2["machine_source"].startswith("cache ")
    assert e1["machine_measured_utc"] == e2["machine_measured_utc"]
    assert len(os.listdir(tmp_path / "cache")) == 1
    # The first lines of stdout name the machine, the measured peak and the BLAS with its kernel.
    head = r1.stdout.splitlines()[:5]
    assert head[0].startswith("# machine: ") and "cores" in head[0]
    assert head[1].startswith("# peak (measured")
    assert head[3].startswith("# BLAS: OpenBLAS ") and "core " in head[3]
    assert head[4].startswith("# CPU GEMM, FP32")


def test_every_figure_is_written_and_used_by_the_peak(tmp_path):
    out, result = gemm(tmp_path, "figures")
    assert result.returncode == 0, result.stderr
    env = env_of(out)
    for key in ("peak_fp32_one_core", "peak_fp32_all_cores", "peak_fp64_one_core", "clock_imul_chain_hz",
                "memory_copy_one_core", "memory_triad_all_cores", "cache_l2_bytes", "cores_per_node",
                "blas_library", "blas_corename", "blas_core_at_load", "blas_core_choice", "gemm_default_backend",
                "gemm_openblas_fp32_rate", "cpu_flags"):
        assert env.get(key), key
    assert env["clock_agrees_with_fp32_peak"] in ("yes", "no")
    nodes = json.loads(env["machine_json"])
    assert len(nodes) == 1
    machine = nodes[0]
    assert machine["peak"]["fp32"]["one_core"] > 0
    assert machine["memory"]["copy"]["one_core"] > 0
    with h5py.File(out, "r") as f:
        (run,) = f["runs"].values()
        dtype = [x.decode() for x in run["cases"]["dtype"][:]]
        library = [x.decode() for x in run["cases"]["library"][:]]
        peak = run["summary"]["peak_per_rank"][:]
        source = [x.decode() for x in run["summary"]["peak_source"][:]]
    for d, lib, p, s in zip(dtype, library, peak, source):
        assert p == machine["peak"][d]["one_core"], (d, p)
        assert s.startswith("measured: ")
        # auto: the machine's fastest FP32 library; fp64 only exists on OpenBLAS.
        assert lib == (machine["gemm"]["default"] if d == "fp32" else "openblas")


AVX512 = {"avx512f", "avx512dq", "avx512bw", "avx512vl"}


def test_a_generic_openblas_core_is_replaced_by_re_execution(tmp_path):
    flags = cpu_flags()
    if AVX512 <= flags:
        expected = "SkylakeX"
    elif {"avx2", "fma"} <= flags:
        expected = "Zen" if "AuthenticAMD" in open("/proc/cpuinfo").read() else "Haswell"
    else:
        pytest.skip("this CPU has no vector unit wider than OpenBLAS's generic kernels")
    # The hook names the core OpenBLAS "chose", as it does by itself on a CPU model newer than the library.
    out, result = gemm(tmp_path, "reexec", {"STRATA_TEST_OPENBLAS_CORE_AT_LOAD": "Prescott"}, np=2)
    assert result.returncode == 0, result.stderr
    env = env_of(out)
    assert env["blas_core_at_load"] == "Prescott"
    assert env["blas_corename"] == expected
    assert "set by Strata" in env["blas_core_choice"] and "Prescott" in env["blas_core_choice"]
    assert f"core {expected} (OPENBLAS_CORETYPE=" in result.stdout


def test_keep_and_a_users_coretype_are_respected(tmp_path):
    out, result = gemm(tmp_path, "keep", {"STRATA_TEST_OPENBLAS_CORE_AT_LOAD": "Prescott", "STRATA_OPENBLAS_CORE": "keep"})
    assert result.returncode == 0, result.stderr
    env = env_of(out)
    assert env["blas_core_choice"] == "OpenBLAS's own detection"
    assert env["blas_core_at_load"] == env["blas_corename"]
    out, result = gemm(tmp_path, "user", {"OPENBLAS_CORETYPE": "PRESCOTT"})
    assert result.returncode == 0, result.stderr
    env = env_of(out)
    assert env["blas_corename"] == "Prescott"
    assert env["blas_core_choice"] == "OPENBLAS_CORETYPE=PRESCOTT set by the user"


def test_library_axis_and_bad_library_input(tmp_path):
    out, result = gemm(tmp_path, "all", args=("--library", "all"))
    assert result.returncode == 0, result.stderr
    with h5py.File(out, "r") as f:
        (run,) = f["runs"].values()
        pairs = sorted(zip((x.decode() for x in run["cases"]["library"][:]), (x.decode() for x in run["cases"]["dtype"][:])))
    libraries = {lib for lib, _ in pairs}
    assert "openblas" in libraries
    assert ("openblas", "fp64") in pairs and ("onednn", "fp64") not in pairs
    assert all(run_dtype in ("fp32", "fp64") for _, run_dtype in pairs)
    for args, message in ((["--library", "mkl"], "unknown --library 'mkl'"),
                          (["--library", "onednn", "-d", "fp64"], "no fp64 GEMM"),
                          (["--backend", "cuda", "--library", "onednn"], "--library applies to the cpu backend")):
        r = run_single([program("strata-gemm"), "--shapes", "8x8x8", *args, "--output", str(tmp_path / "bad.h5")],
                       cwd=str(tmp_path))
        if "cuda" in args and "built without CUDA" in r.stderr:
            continue
        assert r.returncode == 2, (args, r.stderr)
        assert message in r.stderr, (args, r.stderr)
        assert not (tmp_path / "bad.h5").exists()
