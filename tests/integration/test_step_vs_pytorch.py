"""make bench's comparison of the CPU step with PyTorch eager (scripts/bench/step_vs_pytorch.py): without PyTorch it
says the comparison was not measured and does not fail; with PyTorch its smoke run trains the tiny model in both
and prints the three pairs, not judged."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import BUILD, ROOT

SCRIPT = os.path.join(ROOT, "scripts", "bench", "step_vs_pytorch.py")


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, "--build", BUILD, "--smoke", *args], capture_output=True,
                          text=True, timeout=1200)


def test_without_pytorch_it_is_not_measured_and_does_not_fail():
    result = run("--python", "/bin/false")
    assert result.returncode == 0, result.stderr
    assert "not measured: --python /bin/false does not import torch" in result.stdout


def python_with_torch():
    for python in (os.environ.get("STRATA_PYTORCH_PYTHON"), os.path.join(ROOT, ".venv-pytorch", "bin", "python"),
                   sys.executable):
        if python and os.path.exists(python) and subprocess.run([python, "-c", "import torch"],
                                                                 capture_output=True).returncode == 0:
            return python
    return None


def test_smoke_trains_both_and_prints_the_pairs():
    python = python_with_torch()
    if python is None:
        pytest.skip("no Python with PyTorch here (scripts/install-deps.sh --pytorch installs one)")
    result = run("--python", python)
    assert result.returncode == 0, result.stdout + result.stderr
    for pair in ("1 core: 1 rank x 1 thread", "2 cores: 2 ranks (data parallel)", "2 cores: 1 rank x 2 BLAS threads"):
        assert pair in result.stdout, result.stdout
    assert "smoke: not judged" in result.stdout
