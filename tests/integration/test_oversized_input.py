"""Values each flag accepts that describe something far beyond any job (a billion layers, ranks or micro-batches, a
timeout of centuries): refused within seconds with exit code 2 and a message naming what is too large, or run as
asked; never a hang, an exhausted memory or a crash, and the results file given with --output left as it was."""
from __future__ import annotations

import os
import subprocess

import pytest

from conftest import ROOT, digest, mpi_env, program

SYSTEM = os.path.join(ROOT, "project", "systems", "h100-sxm-ndr400.json")
PREDICT = ["strata-project", "predict", "--system", SYSTEM, "-q"]
SEARCH = ["strata-project", "search", "--system", SYSTEM, "--model", "gpt3-1.3b", "--gpus", "16", "-q"]


def run(args: list[str], tmp_path, out) -> subprocess.CompletedProcess:
    exe, *rest = args
    # A hang would end the test at the timeout; a runaway trace shows as exhausted memory long before.
    return subprocess.run([program(exe), *rest, "-O", str(out)], capture_output=True, text=True, cwd=str(tmp_path),
                          env=mpi_env(), timeout=60)


@pytest.fixture
def kept(tmp_path):
    """A results file with one run in it, and its digest."""
    out = tmp_path / "kept.h5"
    made = run([*PREDICT, "--model", "tiny", "--seq", "64"], tmp_path, out)
    assert made.returncode == 0, made.stderr
    return out, digest(str(out))


@pytest.mark.parametrize("args, message", [
    ([*PREDICT, "--layers", "1000000000"], "layer passes a step, more than the 262144 a trace covers"),
    ([*PREDICT, "--accumulation", "100000"], "12 layers x 100000 micro-batches = 1200000 layer passes"),
    ([*PREDICT, "--gpus", "1000000000"], "--gpus 1000000000: 1000000000 ranks, more than the 1048576 a trace covers"),
    ([*PREDICT, "--nodes", "1000000000"], "--nodes 1000000000 x 8 devices per node: 8000000000 ranks"),
    ([*PREDICT, "--micro-batch", "1000000000"], "out of memory (std::bad_alloc): the configuration is too large"),
    ([*PREDICT, "--gpus", "1", "--global-batch", "4294967301", "--micro-batch", "1"],
     "--global-batch 4294967301 over 1 rows a micro-batch is more micro-batches than a step can count"),
    ([*PREDICT, "--grid", "tp=1,pp=1,dp=2000000"], "--grid tp=1,pp=1,dp=2000000: 2000000 ranks, more than the 1048576"),
    ([*PREDICT, "--gpus", "8", "--nodes", "1000000000"], "--gpus 8 and --nodes 1000000000 disagree"),
    ([*PREDICT, "--tp-comm-overlap", "on"], "--tp-comm-overlap on needs --sp (and --tp 2 or more)"),
    ([*SEARCH, "--global-batch", "64", "--threads", "100000"], "--threads 100000: more than this machine's"),
    ([*SEARCH, "--gpus", "100000000", "--global-batch", "64"], "--gpus 100000000: more than the 1048576 ranks"),
    (["strata-gemm", "--shapes", "8x8x8", "-n", "1", "-w", "0", "--inject-hang", "5"],
     "--inject-hang 5: no such rank (the job has 1 rank)"),
])
def test_far_beyond_any_job_is_refused_at_once(tmp_path, kept, args, message):
    out, before = kept
    result = run(args, tmp_path, out)
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and "terminate called" not in result.stderr
    assert digest(str(out)) == before


def test_a_search_skips_configurations_beyond_a_trace_and_says_why(tmp_path):
    result = run([*SEARCH, "--global-batch", "1000000000"], tmp_path, tmp_path / "search.h5")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "size: layers x micro-batches above the 262144 layer passes a trace covers" in result.stdout + result.stderr


def test_a_timeout_of_centuries_is_no_timeout(tmp_path):
    result = run(["strata-gemm", "--shapes", "8x8x8", "-n", "1", "-w", "0", "-q", "--timeout", "1e12"], tmp_path,
                 tmp_path / "gemm.h5")
    assert result.returncode == 0, result.stdout + result.stderr
