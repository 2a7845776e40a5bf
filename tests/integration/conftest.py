"""Shared fixtures: where the built programs are, and a root-safe `mpirun` that runs them for real."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("STRATA_BUILD_DIR", os.path.join(ROOT, "build"))
SCRIPTS = os.path.join(ROOT, "scripts")
sys.path.insert(0, SCRIPTS)


def program(name: str) -> str:
    path = os.path.join(BUILD, name)
    if not os.access(path, os.X_OK):
        pytest.fail(f"{path} is not built (run make build)")
    return path


def mpi_env() -> dict:
    env = dict(os.environ)
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1",
               ASAN_OPTIONS="detect_leaks=0")
    return env


def mpirun(np: int, args: list[str], cwd: str, timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
    command = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(np), *args]
    return subprocess.run(command, cwd=cwd, env=mpi_env(), capture_output=True, text=True, timeout=timeout, **kwargs)


def run_single(args: list[str], cwd: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, env=mpi_env(), capture_output=True, text=True, timeout=timeout)


def registry() -> list[list[str]]:
    """bench/programs.txt's lines: name | sources | report section | suite runs."""
    with open(os.path.join(ROOT, "bench", "programs.txt")) as f:
        return [[field.strip() for field in line.split("|")] for line in f if line.strip() and not line.startswith("#")]


def digest(path: str) -> str:
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()
