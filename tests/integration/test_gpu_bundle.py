"""The GPU bundle and the GPU check, proven as far as a machine without a GPU can: the bundle is built from this
build, fits the limit of what travels to a GPU machine, and every program in it resolves every library from the
bundle or from the list of what the GPU machine's image has; the check's dry run starts every part, each
reporting "no device", and runs strata-gemm on the CPU through the bundled launcher and libraries, with the
host's own Open MPI, PMIx and the bundled libraries hidden in a private mount namespace."""
from __future__ import annotations

import json
import os
import subprocess
import tarfile

import h5py
import pytest

from conftest import BUILD, ROOT

LIMIT_MIB = 60
PROGRAMS = ["strata-gemm", "strata-attention", "strata-collective", "strata-step", "strata-elementwise",
            "strata-project"]
GPU_TESTS = ["strata-gpu-tests", "strata-nccl-groups-gpu-tests", "strata-trainer-gpu-tests"]


def device_libraries() -> set[str]:
    with open(os.path.join(ROOT, "scripts", "gpu", "device-libraries.txt")) as handle:
        return {line.strip() for line in handle if line.strip() and not line.startswith("#")}


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    if not os.path.exists(os.path.join(BUILD, "strata-gpu-tests")):
        pytest.skip("this build has no CUDA (STRATA_CUDA=OFF, or no nvcc, cuBLASLt or NCCL): no GPU bundle to build")
    out = tmp_path_factory.mktemp("bundle")
    result = subprocess.run([os.path.join(ROOT, "scripts", "gpu", "bundle.sh"), "--no-build", "--build", BUILD,
                             "--out", str(out)], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    unpacked = tmp_path_factory.mktemp("unpacked")
    with tarfile.open(out / "strata-gpu.tar.xz") as archive:
        archive.extractall(unpacked)
    return out, unpacked, result.stdout


def test_the_bundle_fits_and_lists_what_it_carries(bundle):
    out, unpacked, stdout = bundle
    size = os.path.getsize(out / "strata-gpu.tar.xz")
    assert size <= LIMIT_MIB << 20, f"{size / 2**20:.1f} MiB"
    manifest = (out / "MANIFEST.txt").read_text()
    for name in PROGRAMS + GPU_TESTS:
        assert f" bin/{name}\n" in manifest, name
        assert os.access(unpacked / "bin" / name, os.X_OK), name
    assert "needs on the machine: GLIBC_2." in manifest
    assert os.path.exists(unpacked / "openmpi" / "bin" / "orted")
    assert any(p.name == "mca_pml_ob1.so" for p in (unpacked / "openmpi").rglob("*.so"))
    assert "MiB" in stdout and "limit 60 MiB" in stdout


def elf_files(root) -> list[str]:
    files = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            with open(path, "rb") as handle:
                if handle.read(4) == b"\x7fELF":
                    files.append(str(path))
    return files


def test_every_bundled_program_resolves_its_libraries_from_the_bundle_or_the_device(bundle):
    _, unpacked, _ = bundle
    device = device_libraries()
    env = {**os.environ, "LD_LIBRARY_PATH": str(unpacked / "lib")}
    checked = 0
    for path in elf_files(unpacked):
        result = subprocess.run(["ldd", path], capture_output=True, text=True, env=env)
        if "not a dynamic executable" in result.stdout + result.stderr:
            continue
        checked += 1
        for line in result.stdout.splitlines():
            parts = line.split()
            assert "not found" not in line, f"{path}: {line.strip()}"
            if len(parts) >= 3 and parts[1] == "=>":
                soname, resolved = parts[0], parts[2]
                assert resolved.startswith(str(unpacked)) or soname in device, \
                    f"{os.path.relpath(path, unpacked)} loads {soname} from {resolved}: neither in the bundle nor on the device"
    assert checked >= len(PROGRAMS) + len(GPU_TESTS) + 2


def host_copies(unpacked) -> list[str]:
    """The host's files the bundle replaces: its libraries (less those this Python's h5py loads itself, which the
    check's summary needs), Open MPI's and PMIx's folders and the launcher."""
    probe = subprocess.run(["python3", "-c", "import h5py, os; print(open('/proc/self/maps').read())"],
                           capture_output=True, text=True)
    used_by_python = {line.split()[-1] for line in probe.stdout.splitlines() if line.split()[-1:] and line.split()[-1].startswith("/")}
    cache = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    paths = set()
    for soname in os.listdir(unpacked / "lib"):
        for line in cache.splitlines():
            if line.strip().startswith(soname + " "):
                real = os.path.realpath(line.split("=>")[-1].strip())
                if real not in used_by_python:
                    paths.add(real)
    return sorted(paths)


def test_the_dry_run_starts_every_part_with_the_hosts_own_copies_hidden(bundle, tmp_path):
    out, unpacked, _ = bundle
    if subprocess.run(["unshare", "--mount", "--propagation", "private", "true"], capture_output=True).returncode != 0:
        pytest.skip("no private mount namespace here (needs root or CAP_SYS_ADMIN): the host's copies cannot be hidden")
    empty = tmp_path / "empty"
    empty.mkdir()
    hide = [f"mount --bind /dev/null {p}" for p in host_copies(unpacked)]
    for folder in ("/usr/lib/x86_64-linux-gnu/openmpi", "/usr/lib/x86_64-linux-gnu/pmix2", "/usr/share/openmpi",
                   "/etc/openmpi"):
        if os.path.isdir(folder):
            hide.append(f"mount --bind {empty} {folder}")
    for tool in ("orted", "orterun"):
        path = os.path.realpath(f"/usr/bin/{tool}")
        if os.path.exists(path):
            hide.append(f"mount --bind /dev/null {path}")
    assert len(hide) > 20
    check_out = tmp_path / "out"
    script = " && ".join(hide) + f" && {ROOT}/scripts/gpu/check.sh --dry-run --bundle {out} --out {check_out} --budget 300"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "OPAL_", "PMIX_"))}
    env["TMPDIR"] = str(tmp_path)
    result = subprocess.run(["unshare", "--mount", "--propagation", "private", "bash", "-c", script],
                            capture_output=True, text=True, timeout=600, env=env)
    log = (check_out / "check.log").read_text() if (check_out / "check.log").exists() else ""
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    summary = json.loads((check_out / "summary.json").read_text())
    status = {p["part"]: p["status"] for p in summary["parts"]}
    assert status.pop("cpu-smoke") == "ok", log[-4000:]
    assert status.pop("cpu-bf16") == "ok", log[-4000:]  # run, or skipped with the reason, on this host's CPU
    assert status.pop("cpu-bf16-step") == "ok", log[-4000:]
    assert status.pop("memcheck") in ("skipped", "no device")
    expected = {"gpu-tests", "nccl-groups-tests", "trainer-tests", "gemm", "gemm-pytorch", "attention",
                "attention-pytorch", "collective-nccl"}
    for model in ("gpt2-124m", "gpt2-350m"):
        expected |= {f"step-{model}", f"step-{model}-pytorch-eager", f"step-{model}-pytorch-compile"}
    assert set(status) == expected
    assert all(s == "no device" for s in status.values()), status
    for name in expected:
        assert f"part {name}: starting" in log and f"part {name}: no device" in log, name
    # The smoke ran through the bundle's launcher and libraries, and its run was read back.
    assert f"{tmp_path}/strata-gpu-bundle/bin/strata-gemm" in log
    assert summary["cpu_smoke_gflops"] > 0
    with h5py.File(check_out / "results.h5", "r") as f:
        (run,) = f["runs"].values()
        assert run.attrs["status"] in (b"ok", "ok")
    assert sorted(os.listdir(check_out)) == ["check.log", "results.h5", "summary.json", "summary.md"]


def test_the_summary_sets_attention_beside_pytorch(tmp_path):
    """The summary reads strata-attention's rows (whose column "pass" is a Python keyword) and matches them to
    PyTorch's by pass, causality and sequence."""
    from conftest import mpirun, program
    results = tmp_path / "results.h5"
    run = mpirun(1, [program("strata-attention"), "-s", "64", "-H", "2", "-D", "16", "--causal", "both", "-p",
                     "fwd,bwd", "--impl", "flash", "-n", "1", "-w", "0", "-q", "--output", str(results)],
                 cwd=str(tmp_path), timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    torch_rows = tmp_path / "pytorch.jsonl"
    torch_rows.write_text("".join(json.dumps({"torch": "t", "device": "d", "kind": "attention", "pass": p, "causal": c,
                                              "seq": 64, "tflops": 1e-6}) + "\n"
                                  for p in ("fwd", "bwd") for c in (False, True)))
    parts = tmp_path / "parts.tsv"
    parts.write_text("attention\tok\t1\t\n")
    summary = subprocess.run(["python3", os.path.join(ROOT, "scripts", "gpu", "summary.py"), "--results", str(results),
                              "--pytorch", str(torch_rows), "--parts", str(parts), "--markdown",
                              str(tmp_path / "summary.md"), "--json", str(tmp_path / "summary.json")],
                             capture_output=True, text=True, timeout=120)
    assert "Traceback" not in summary.stderr, summary.stderr
    record = json.loads((tmp_path / "summary.json").read_text())
    assert sorted((row["pass"], row["causal"]) for row in record["attention"]) == [
        ("bwd", False), ("bwd", True), ("fwd", False), ("fwd", True)]
    assert all(row["pytorch_tflops"] == 1e-6 for row in record["attention"])


def test_only_with_no_matching_part_is_refused(tmp_path):
    """Before anything is run or removed: the last check's files stay."""
    (tmp_path / "summary.md").write_text("the last check")
    result = subprocess.run([os.path.join(ROOT, "scripts", "gpu", "check.sh"), "--build", BUILD, "--dry-run",
                             "--out", str(tmp_path), "--budget", "60", "--only", "gpu-test"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "--only 'gpu-test' names no part" in result.stderr
    assert (tmp_path / "summary.md").read_text() == "the last check"
