"""The measured machine description as a run records it: measured once and then read from the job's cache,
printed first, written into the `env` group, used by every %peak; the OpenBLAS core corrected by
re-execution when the library falls back to a generic core; bad --library input refused with exit 2."""
from __future__ import annotations

import contextlib
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
    with environment(tmp_path, extra_env):
        result = mpirun(np, command, cwd=str(tmp_path))
    return out, result


@contextlib.contextmanager
def environment(tmp_path, extra_env=None):
    """The tests' cache folder, no OPENBLAS_CORETYPE unless `extra_env` names it, and `extra_env`."""
    env = {"STRATA_CACHE_DIR": str(tmp_path / "cache"), "OPENBLAS_CORETYPE": None, **(extra_env or {})}
    old = {k: os.environ.get(k) for k in env}
    for k, v in env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


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
    head = r1.stdout.splitlines()[:6]
    assert head[0].startswith("# machine: ") and "cores" in head[0]
    assert head[1].startswith("# peak (measured")
    assert head[2].startswith("# peak check: FP32 agrees: ") and "FLOP/cycle" in head[2], head[2]
    assert head[4].startswith("# BLAS: OpenBLAS ") and "core " in head[4]
    assert head[5].startswith("# CPU GEMM, FP32")


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


def edit_cached_machine(cache: str, edit) -> None:
    """Applies `edit` to the machine description in the job's cache file (the one file a first run wrote)."""
    (name,) = os.listdir(cache)
    path = os.path.join(cache, name)
    with open(path) as handle:
        entry = json.load(handle)
    edit(entry["machine"])
    with open(path, "w") as handle:
        json.dump(entry, handle)


def scale_peaks(machine: dict, factor: float, clock_factor: float) -> None:
    for precision in ("fp32", "fp64", "bf16"):
        machine["peak"][precision]["one_core"] *= factor
        machine["peak"][precision]["all_cores"] *= factor
    machine["clock"]["imul_chain_hz"] *= clock_factor


def test_a_fraction_above_the_peak_is_marked_not_printed_as_true(tmp_path):
    out, result = gemm(tmp_path, "first")
    assert result.returncode == 0, result.stderr
    # The peaks and the clock a hundredth of what they are: the peaks still agree with the clock and the FMA
    # units, so they are used, and every case lands near 100 x its fraction of peak.
    edit_cached_machine(str(tmp_path / "cache"), lambda m: scale_peaks(m, 0.01, 0.01))
    out, result = gemm(tmp_path, "above")
    assert result.returncode == 0, result.stderr
    assert "# peak check: FP32 agrees" in result.stdout
    assert "is above 100 % and cannot be true" in result.stderr and "marked above_peak" in result.stderr
    rows = [line.split() for line in result.stdout.splitlines() if line.lstrip().startswith("cpu ")]
    assert rows and all(row[-2].endswith("!") for row in rows), rows
    with h5py.File(out, "r") as f:
        (run,) = f["runs"].values()
        assert list(run["summary"]["above_peak"][:]) == [1, 1]
        assert all(run["summary"]["peak_fraction"][:] > 1)
    # A figure is marked exactly when it is above 100 % (at the true peaks, 0.6-0.9 of it on a quiet machine; on a
    # loaded one the peak may be measured under load and a case run after it, which the mark then reports).
    first = tmp_path / "first.h5"
    with h5py.File(first, "r") as f:
        (run,) = f["runs"].values()
        fractions = run["summary"]["peak_fraction"][:]
        assert all(fractions > 0)
        assert list(run["summary"]["above_peak"][:]) == [int(x > 1) for x in fractions]

    # strata-step: an MFU above 100 % is marked the same way.
    step_out = tmp_path / "step.h5"
    with environment(tmp_path):
        step = mpirun(1, [program("strata-step"), "--model", "tiny", "--seq", "32", "--micro-batch", "2", "-q", "-w",
                          "1", "-n", "2", "--output", str(step_out)], cwd=str(tmp_path))
    assert step.returncode == 0, step.stderr
    assert "MFU" in step.stderr and "cannot be true" in step.stderr, step.stderr
    with h5py.File(step_out, "r") as f:
        (run,) = f["runs"].values()
        assert run["summary"]["above_peak"][0] == 1
        assert run["summary"]["mfu"][0] > 1


def test_a_peak_that_disagrees_with_the_clock_is_a_failed_measurement(tmp_path):
    out, result = gemm(tmp_path, "first")
    assert result.returncode == 0, result.stderr
    # The FP32 peak 0.43 of what the clock and the FMA units say (what an accumulator spilled to the stack
    # measures): reported as failed, not used as a denominator. FP64 is left as measured.
    def spill(m):
        m["peak"]["fp32"]["one_core"] *= 0.43
        m["peak"]["fp32"]["all_cores"] *= 0.43
    edit_cached_machine(str(tmp_path / "cache"), spill)
    out, result = gemm(tmp_path, "failed")
    assert result.returncode == 0, result.stderr
    assert "# peak check: FP32 FAILED: " in result.stdout and "expected" in result.stdout, result.stdout
    assert "FAILED its check, not used" in result.stdout
    env = env_of(out)
    assert env["peak_fp32_check"].startswith("FAILED: ")
    assert env["peak_fp64_check"].startswith("agrees: ")
    assert env["clock_agrees_with_fp32_peak"] == "no"
    with h5py.File(out, "r") as f:
        (run,) = f["runs"].values()
        dtype = [x.decode() for x in run["cases"]["dtype"][:]]
        peak = dict(zip(dtype, run["summary"]["peak_per_rank"][:]))
        fraction = dict(zip(dtype, run["summary"]["peak_fraction"][:]))
        source = dict(zip(dtype, (x.decode() for x in run["summary"]["peak_source"][:])))
    assert peak["fp32"] == 0 and fraction["fp32"] == 0
    assert source["fp32"].startswith("unknown: the measured peak is a failed measurement")
    assert peak["fp64"] > 0 and fraction["fp64"] > 0
    rows = {row[2]: row for row in (line.split() for line in result.stdout.splitlines()) if row[:1] == ["cpu"]}
    assert rows["fp32"][-2] == "n/a" and rows["fp64"][-2] != "n/a"


def test_a_precision_without_a_unit_says_why(tmp_path):
    out, result = gemm(tmp_path, "bf16")
    assert result.returncode == 0, result.stderr
    env = env_of(out)
    head = result.stdout.splitlines()[1]
    if "avx512_bf16" in env["cpu_flags"].split():
        assert "BF16 n/a" not in head
        assert env["peak_bf16_check"].startswith("agrees: ")
    else:
        assert "BF16 n/a (this CPU has no AVX-512 BF16 dot-product unit)" in head, head
        assert "BF16 0.0" not in head
        assert env["peak_bf16_check"].startswith("n/a: ")
