#!/usr/bin/env python3
"""make bench: the CPU training step against PyTorch eager on this machine, side by side in one run.

    step_vs_pytorch.py --build BUILD [--python PYTHON] [--rounds N] [--steps N] [--pairs fp32,bf16] [--smoke]
                       [--report-only]

Both train the same model (GPT-2 124M as strata-step builds it, scripts/gpu/pytorch_reference.py's `step --device
cpu`), on the same batch (4 sequences of 64 tokens per step), with AdamW (betas 0.9/0.95, eps 1e-8, weight decay
0.1), global-norm clipping at 1, fp32, subnormals flushed to zero. Three pairs:
  1 core:  strata-step, one rank on one thread      against PyTorch on one intra-op thread;
  2 cores: strata-step, two data-parallel ranks     against PyTorch on two threads;
           strata-step, one rank with two threads   against the same PyTorch figure.
On CPUs with AVX-512 BF16 or AMX one more pair, bf16 GEMMs over fp32 master weights:
  1 core:  strata-step --dtype bf16, one rank, one thread  against PyTorch's CPU autocast to bf16 on one thread;
elsewhere strata-step refuses --dtype bf16 and its reason is printed instead.
Each program reports the median of its timed steps after a warm-up step; each round runs every configuration once,
the order of Strata and PyTorch alternating by round, and the figures are medians over rounds. Target: Strata's
tokens/s at least 1.5 x PyTorch's in every fp32 pair and 1.2 x in the bf16 pair (exit 3 on a miss; --report-only:
the verdicts printed, exit 0). --pairs: which pairs run (the GPU check runs the bf16 one on its host's CPU). Without PyTorch (scripts/install-deps.sh
--pytorch puts it into .venv-pytorch) nothing is measured and that is said; exit 0.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

TARGET = 1.5
BF16_TARGET = 1.2
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REFERENCE = os.path.join(ROOT, "scripts", "gpu", "pytorch_reference.py")
STEP_LINE = re.compile(r"^# NNN: step ([0-9.]+) ms", re.MULTILINE)


def find_python(given: str | None) -> str | None:
    """A Python that imports torch: --python alone when given, else $STRATA_PYTORCH_PYTHON, the checkout's
    .venv-pytorch, python3."""
    candidates = [given] if given else [os.environ.get("STRATA_PYTORCH_PYTHON"),
                                        os.path.join(ROOT, ".venv-pytorch", "bin", "python"), "python3"]
    for python in candidates:
        if not python:
            continue
        try:
            probe = subprocess.run([python, "-c", "import torch"], capture_output=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if probe.returncode == 0:
            return python
    return None


def mpi_env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return env


def strata_command(build: str, model: str, steps: int, dtype: str, out: str) -> list[str]:
    return [os.path.join(build, "strata-step"), "-m", model, "-s", "64", "--global-batch", "4", "--dtype", dtype,
            "-w", "1", "-n", str(steps), "-O", out]


def bf16_refusal(build: str) -> str | None:
    """strata-step's reason for refusing --dtype bf16 on this CPU (exit 2), None where it runs."""
    with tempfile.TemporaryDirectory() as scratch:
        command = strata_command(build, "tiny", 1, "bf16", os.path.join(scratch, "probe.h5"))
        result = subprocess.run(command, capture_output=True, text=True, env=mpi_env(), timeout=600)
    if result.returncode == 2:
        return result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "refused without a reason"
    if result.returncode != 0:
        sys.exit(f"step_vs_pytorch: strata-step --dtype bf16 failed (exit {result.returncode}):\n{result.stderr[-2000:]}")
    return None


def strata_seconds(build: str, ranks: int, threads: int, model: str, steps: int, dtype: str = "fp32") -> float:
    """Median step of strata-step (its own summary line: the median over timed steps, max over ranks)."""
    with tempfile.TemporaryDirectory() as scratch:
        command = strata_command(build, model, steps, dtype, os.path.join(scratch, "step.h5"))
        if threads > 1:
            command += ["--blas-threads", str(threads)]
        if ranks > 1:
            command = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(ranks)] + command
        result = subprocess.run(command, capture_output=True, text=True, env=mpi_env(), timeout=3600)
    found = STEP_LINE.search(result.stdout)
    if result.returncode != 0 or not found:
        sys.exit(f"step_vs_pytorch: strata-step failed (exit {result.returncode}):\n{result.stdout[-2000:]}"
                 f"{result.stderr[-2000:]}")
    return float(found.group(1)) / 1e3


def pytorch_seconds(python: str, threads: int, model: str, steps: int, dtype: str = "fp32") -> tuple[float, str]:
    with tempfile.TemporaryDirectory() as scratch:
        out = os.path.join(scratch, "pytorch.jsonl")
        command = [python, REFERENCE, "step", "--device", "cpu", "--dtype", dtype, "--threads", str(threads),
                   "--model", model, "--seq", "64", "--micro-batch", "4", "--warmup", "1", "--iters", str(steps),
                   "--json", out]
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=3600)
        if result.returncode != 0 or not os.path.exists(out):
            sys.exit(f"step_vs_pytorch: PyTorch's step failed (exit {result.returncode}):\n{result.stderr[-2000:]}")
        with open(out) as handle:
            record = json.loads(handle.readline())
    return float(record["seconds"]), str(record["torch"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", required=True, help="the build folder holding strata-step")
    parser.add_argument("--python", help="a Python with PyTorch (default: $STRATA_PYTORCH_PYTHON, .venv-pytorch, python3)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per program run")
    parser.add_argument("--smoke", action="store_true", help="the tiny model, one round, one step: not judged")
    parser.add_argument("--pairs", default="fp32,bf16", help="fp32, bf16 or both (comma-separated)")
    parser.add_argument("--report-only", action="store_true", help="print the verdicts, exit 0 on a missed target")
    args = parser.parse_args()
    kinds = set(args.pairs.split(","))
    if not kinds or not kinds <= {"fp32", "bf16"}:
        parser.error(f"--pairs: fp32, bf16 or both, got '{args.pairs}'")
    python = find_python(args.python)
    if python is None:
        print(f"# step vs PyTorch: not measured: {'--python ' + args.python if args.python else 'no Python here'} does "
              "not import torch "
              "(scripts/install-deps.sh --pytorch installs it into .venv-pytorch)")
        return 0
    model = "tiny" if args.smoke else "gpt2-124m"
    rounds, steps = (1, 1) if args.smoke else (args.rounds, args.steps)

    refusal = bf16_refusal(args.build) if "bf16" in kinds else None
    # (label, Strata's ranks and threads, PyTorch's threads, dtype)
    pairs = [("1 core: 1 rank x 1 thread", 1, 1, 1, "fp32"), ("2 cores: 2 ranks (data parallel)", 2, 1, 2, "fp32"),
             ("2 cores: 1 rank x 2 BLAS threads", 1, 2, 2, "fp32")] if "fp32" in kinds else []
    if "bf16" in kinds and refusal is None:
        pairs.append(("1 core bf16: 1 rank x 1 thread", 1, 1, 1, "bf16"))
    strata = {label: [] for label, *_ in pairs}
    torch_times = {(threads, dtype): [] for _, _, _, threads, dtype in pairs}
    version = ""
    for r in range(rounds):
        for threads, dtype in torch_times:
            order = ("pytorch", "strata") if r % 2 else ("strata", "pytorch")
            for who in order:
                if who == "pytorch":
                    seconds, version = pytorch_seconds(python, threads, model, steps, dtype)
                    torch_times[(threads, dtype)].append(seconds)
                else:
                    for label, ranks, strata_threads, torch_threads, strata_dtype in pairs:
                        if (torch_threads, strata_dtype) == (threads, dtype):
                            strata[label].append(strata_seconds(args.build, ranks, strata_threads, model, steps, dtype))

    tokens = 4 * 64
    print(f"# step vs PyTorch {version} eager: {model}, 4 x 64 tokens per step, AdamW, fp32 (bf16: GEMMs in bf16 over "
          f"fp32 master weights, PyTorch's CPU autocast), flush to zero; "
          f"medians of {rounds} round(s) of {steps} timed step(s) after one warm-up, order alternating")
    print(f"# {'pair':36s} {'Strata s':>9s} {'PyTorch s':>10s} {'Strata tok/s':>13s} {'PyTorch tok/s':>14s} "
          f"{'ratio':>6s}")
    missed = False
    for label, _, _, torch_threads, dtype in pairs:
        ours, theirs = statistics.median(strata[label]), statistics.median(torch_times[(torch_threads, dtype)])
        ratio = theirs / ours
        target = BF16_TARGET if dtype == "bf16" else TARGET
        verdict = "" if args.smoke else (" PASS" if ratio >= target else " MISSED")
        missed |= not args.smoke and ratio < target
        print(f"  {label:36s} {ours:9.3f} {theirs:10.3f} {tokens / ours:13.1f} {tokens / theirs:14.1f} "
              f"{ratio:6.2f}{verdict}")
    if refusal is not None:
        print(f"# bf16 pair not measured: {refusal}")
    print(f"# ratio: Strata's tokens/s over PyTorch's; target >= {TARGET} (fp32), >= {BF16_TARGET} (bf16)" +
          (" (smoke: not judged)" if args.smoke else ""))
    return 3 if missed and not args.report_only else 0


if __name__ == "__main__":
    sys.exit(main())
