"""strata-project calibrate on real runs: strata-gemm, strata-attention, strata-collective (one node, and two
emulated nodes of one rank) and strata-interference at tiny sizes under mpirun with 2 ranks, then the
calibration's JSON; and its bad input (missing benchmarks, a file that is not results, a base description with a
negative value), each a message and exit 2 with the output file left as it was."""
from __future__ import annotations

import json
import os
import shutil

import h5py
import pytest

from conftest import ROOT, digest, mpirun, program, run_single

SYSTEMS = os.path.join(ROOT, "project", "systems")
QUICK = ["-n", "3", "-w", "1", "-q"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One results file holding every benchmark a calibration reads, and one holding only GEMM runs."""
    folder = tmp_path_factory.mktemp("calibrate")
    full, gemm_only = str(folder / "full.h5"), str(folder / "gemm.h5")
    commands = [
        ["strata-gemm", "--square", "32:128", "-d", "fp32"],
        ["strata-attention", "-s", "32,64", "-H", "2", "-D", "16", "-p", "fwd,bwd", "--impl", "flash"],
        ["strata-collective", "--collective", "allreduce,sendrecv", "-b", "8", "-e", "64K", "-f", "4", "-a", "ring",
         "--placement", "out"],
        ["strata-collective", "--collective", "allreduce,sendrecv", "-b", "8", "-e", "64K", "-f", "4", "-a", "ring",
         "--placement", "out", "--ranks-per-node", "1"],
        ["strata-interference", "--gemm", "64x64x64", "-s", "64", "-H", "2", "-D", "16", "-b", "64K", "-e", "256K",
         "--calls", "2"],
    ]
    for name, *args in commands:
        result = mpirun(2, [program(name), *args, *QUICK, "--output", full], cwd=str(folder))
        assert result.returncode == 0, (name, result.stderr[-2000:])
    result = mpirun(2, [program("strata-gemm"), "--square", "32:64", "-d", "fp32", *QUICK, "--output", gemm_only],
                    cwd=str(folder))
    assert result.returncode == 0, result.stderr[-2000:]
    return folder, full, gemm_only


def calibrate(args, cwd):
    return run_single([program("strata-project"), "calibrate", *args], cwd=str(cwd))


def test_calibration_of_real_runs_writes_a_whole_description(runs):
    folder, full, _ = runs
    out = folder / "system.json"
    result = calibrate([full, "-o", str(out), "--name", "test machine"], folder)
    assert result.returncode == 0, result.stderr
    system = json.loads(out.read_text())
    assert system["format"] == "strata-system" and system["version"] == 2
    assert system["name"] == "test machine"
    device = system["device"]
    assert device["devices_per_node"] == 2
    fp32 = device["compute"]["fp32"]
    assert len(fp32["gemm_points"]) == 3  # 32, 64, 128
    assert fp32["peak_flops"]["source"].startswith("measured")
    assert set(fp32["attention_efficiency"]) == {"fwd", "bwd"}
    assert len(fp32["attention_points"]) == 8  # 2 lengths x causal both x fwd, bwd
    assert device["memory_bandwidth"]["value"] > 0 and 0 < device["memory_efficiency"]["value"] <= 1
    # Both tiers measured; the inter-node one on emulated nodes, and it says so.
    assert system["network"]["intra_node"]["source"] == "measured"
    assert "emulated" in system["network"]["inter_node"]["source"]
    fitted = {(c["operation"], c["algorithm"], c["group"]) for c in system["collectives"]}
    assert ("allreduce", "ring", "intra_node") in fitted and ("allreduce", "ring", "inter_node") in fitted
    for c in system["collectives"]:
        assert set(c["compared"]) == {"latency_bandwidth", "chunked"}
        ranges = c["ranges"] if c["form"] == "latency_bandwidth" else [c]
        assert all(r["residual"] >= 0 and r["sizes"] >= 3 for r in ranges)
        assert c["ranks"] == 2
    assert system["overlap_slowdown"]["value"] >= 0 and "bootstrap" in system["overlap_slowdown"]["source"]
    assert "communication_slowdown" in system
    assert "collective_contention" not in system  # needs four ranks
    # The summary names every fit and its residual.
    assert "allreduce ring intra_node n=2" in result.stdout and "residual" in result.stdout
    assert "overlap slowdown s =" in result.stdout
    assert "collective contention: not measured" in result.stdout
    # The written description reads back through the same validation (a second calibration onto it as base).
    again = calibrate([full, "-o", str(folder / "again.json"), "--base", str(out), "-q"], folder)
    assert again.returncode == 0, again.stderr
    assert again.stdout == ""


def test_hot_elementwise_times_of_older_files_give_way_to_evicted_ones(runs, tmp_path):
    # strata-elementwise evicts AdamW's and the gradient norm's operands before each timed call (its evict_bytes
    # column); a file from before that column timed them hot. Calibrated together, the evicted ones count alone.
    _, full, _ = runs
    files = {}
    for age in ("new", "old"):
        files[age] = tmp_path / f"{age}.h5"
        shutil.copy(full, files[age])
        result = mpirun(2, [program("strata-elementwise"), "--preset", "tiny", "--tokens", "64", *QUICK, "--output",
                            str(files[age])], cwd=str(tmp_path))
        assert result.returncode == 0, result.stderr[-2000:]
    with h5py.File(files["old"], "a") as f:
        (run,) = [r for r in f["runs"].values() if r.attrs["benchmark"] in (b"strata-elementwise", "strata-elementwise")]
        evicted = set(k.decode() if isinstance(k, bytes) else k
                      for k, e in zip(run["cases"]["kernel"][:], run["cases"]["evict_bytes"][:]) if e > 0)
        del run["cases"]["evict_bytes"]
    assert {"adamw", "squared_norm"} <= evicted
    alone = calibrate([str(files["old"]), "-o", str(tmp_path / "old.json")], tmp_path)
    assert alone.returncode == 0, alone.stderr
    assert "left out for the evicted ones" not in alone.stdout
    together = calibrate([str(files["new"]), str(files["old"]), "-o", str(tmp_path / "both.json")], tmp_path)
    assert together.returncode == 0, together.stderr
    for kernel in sorted(evicted):
        assert (f"elementwise kernel {kernel}: 1 measurement(s) with hot operands left out for the evicted ones"
                in together.stdout), together.stdout


def test_missing_benchmarks_are_named_and_leave_the_output_untouched(runs):
    folder, _, gemm_only = runs
    out = folder / "kept.json"
    out.write_text("an earlier description\n")
    before = digest(str(out))
    result = calibrate([gemm_only, "-o", str(out)], folder)
    assert result.returncode == 2, result.stderr
    assert "no strata-collective run with intra-node groups" in result.stderr
    assert "the inter_node tier cannot be fitted" in result.stderr
    assert "no strata-interference run" in result.stderr
    assert "--base FILE" in result.stderr
    assert digest(str(out)) == before
    # With a spec sheet as the base the same runs give a whole description, the missing parts marked.
    merged = folder / "merged.json"
    result = calibrate([gemm_only, "-o", str(merged), "--base", os.path.join(SYSTEMS, "h100-sxm-ndr400.json")], folder)
    assert result.returncode == 0, result.stderr
    system = json.loads(merged.read_text())
    assert "not measured here" in system["network"]["inter_node"]["source"]
    base = json.loads(open(os.path.join(SYSTEMS, "h100-sxm-ndr400.json")).read())
    assert system["network"]["inter_node"]["bandwidth"]["value"] == base["network"]["inter_node"]["bandwidth"]["value"]
    assert "not measured here" in system["overlap_slowdown"]["source"]
    assert system["device"]["compute"]["fp32"]["peak_flops"]["source"].startswith("measured")


def test_a_file_that_is_not_results_exits_2(runs):
    folder, full, _ = runs
    notes = folder / "notes.txt"
    notes.write_text("not results\n")
    out = folder / "kept-too.json"
    out.write_text("an earlier description\n")
    before = digest(str(out))
    result = calibrate([full, str(notes), "-o", str(out)], folder)
    assert result.returncode == 2
    assert "is not an HDF5 file" in result.stderr
    assert digest(str(out)) == before
    other = folder / "other.h5"
    with h5py.File(other, "w") as f:
        f.attrs["something"] = 1
    result = calibrate([str(other), "-o", str(out)], folder)
    assert result.returncode == 2 and "strata-project calibrate: error:" in result.stderr
    assert "not a Strata results file" in result.stderr or "schema" in result.stderr, result.stderr
    assert digest(str(out)) == before
    assert not list(folder.glob("kept-too.json.tmp-*"))  # no temporary left behind


def test_a_negative_value_in_the_base_is_named(runs, tmp_path):
    _, full, _ = runs
    with open(os.path.join(SYSTEMS, "a100-80gb-sxm-hdr200.json")) as f:
        base = json.load(f)
    base["network"]["inter_node"]["bandwidth"]["value"] = -25e9
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(base))
    out = tmp_path / "out.json"
    out.write_text("{}\n")
    before = digest(str(out))
    result = calibrate([full, "-o", str(out), "--base", str(bad)], tmp_path)
    assert result.returncode == 2
    assert "network.inter_node.bandwidth must be positive" in result.stderr
    assert digest(str(out)) == before


@pytest.mark.parametrize("args, message", [
    ([], "expected at least 1 FILE"),
    (["x.h5"], "-o/--output FILE is required"),
    (["x.h5", "-o", "/no/such/folder/s.json"], "does not exist"),
    (["x.h5", "-o", "s.json", "--device", "tpu"], "expected one of auto|cpu|cuda"),
])
def test_usage_errors_exit_2(tmp_path, args, message):
    result = calibrate(args, tmp_path)
    assert result.returncode == 2
    assert message in result.stderr, result.stderr


def test_unknown_command_and_help(tmp_path):
    result = run_single([program("strata-project"), "predikt"], cwd=str(tmp_path))
    assert result.returncode == 2 and "unknown command 'predikt'" in result.stderr
    result = run_single([program("strata-project"), "--help"], cwd=str(tmp_path))
    assert result.returncode == 0 and "calibrate" in result.stdout


def test_interference_tables_and_a_wrong_element(tmp_path):
    """The interference run's four cases per (kernel, collective, size) and their slowdowns; an injected wrong
    element on every rank fails the run with one wrong element per rank and case."""
    import strata_results as sr
    out = str(tmp_path / "i.h5")
    args = [program("strata-interference"), "--kernel", "gemm,attention", "--gemm", "48x40x32", "-s", "32", "-H", "2",
            "-D", "16", "-b", "4K", "-e", "4K", "--calls", "2", "-n", "2", "-w", "0"]
    ok = mpirun(2, [*args, "-q", "--output", out], cwd=str(tmp_path))
    assert ok.returncode == 0, ok.stderr[-2000:]
    data = sr.read_cases_with_summary(out, "strata-interference")
    assert len(data) == 8
    assert list(data["section"][:4]) == ["compute", "communication", "compute", "communication"]
    assert list(data["overlapped"][:4]) == [0, 0, 1, 1]
    alone = data[data["overlapped"] == 0]
    assert (alone["slowdown_vs_alone"] == 1).all()
    overlapped = data[data["overlapped"] == 1]
    assert (overlapped["slowdown_vs_alone"] > 0).all()
    # The overlapped compute section tested the collective between calls; nothing else did.
    assert (overlapped[overlapped["section"] == "compute"]["test_seconds"] > 0).all()
    assert overlapped[overlapped["section"] == "communication"]["test_seconds"].isna().all()
    assert (overlapped[overlapped["section"] == "communication"]["exposed_seconds"] >= 0).all()
    medians = data.set_index(["kernel", "section", "overlapped"])["time_rankmax_median"]
    for kernel in ("gemm", "attention"):
        for section in ("compute", "communication"):
            ratio = medians[(kernel, section, 1)] / medians[(kernel, section, 0)]
            assert overlapped.set_index(["kernel", "section"])["slowdown_vs_alone"][(kernel, section)] == pytest.approx(ratio)
    assert (data["wrong_elements"] == 0).all()
    bad = str(tmp_path / "bad.h5")
    failed = mpirun(2, [*args, "--output", bad, "--inject-wrong-element", "-2"], cwd=str(tmp_path))
    assert failed.returncode == 1
    assert "OUTPUT CHECK FAILED" in failed.stderr
    assert list(sr.read_cases_with_summary(bad, "strata-interference")["wrong_elements"]) == [2] * 8
