"""Step records (schema 1.1) end to end: strata-test-record-steps records phases, events, memory and metrics
under mpirun with 3 ranks by rules stated in tests/programs/record_steps.cpp; the Python reader (with column
selection and row filters), the C++ reader and strata-trace read them back, and a writer killed between two
column appends leaves a file both readers read."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

import h5py
import numpy as np
import pytest

import strata_results as sr
from conftest import SCRIPTS, mpi_env, mpirun, program

RANKS, ITERS, CASES, COUNT = 3, 3, 2, 64
ARGS = ["-n", str(ITERS), "-w", "1", "--cases", str(CASES), "--count", str(COUNT), "-q"]


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    folder = tmp_path_factory.mktemp("records")
    out = folder / "steps.h5"
    result = mpirun(RANKS, [program("strata-test-record-steps"), *ARGS, "--output", str(out)], cwd=str(folder))
    assert result.returncode == 0, result.stderr
    return str(out), sr.run_ids(str(out))[0]


def cxx_table(path, run, table):
    result = subprocess.run([program("strata-test-read-table"), path, run, table], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_events_per_rank_with_column_selection_and_filters(records):
    path, run = records
    for case in range(CASES):
        for rank in range(RANKS):
            ev = sr.read_run_table(path, run, "events", columns=["operation", "stream", "bytes", "group", "start", "end"],
                                   where={"case": case, "rank": rank})
            assert list(ev.columns) == ["operation", "stream", "bytes", "group", "start", "end"]
            # rank r: r + 1 matmuls and one allreduce per timed iteration
            assert len(ev) == ITERS * (rank + 2)
            matmul = ev[ev["operation"] == "matmul"]
            assert len(matmul) == ITERS * (rank + 1) and set(matmul["stream"]) == {"compute"}
            assert sorted(set(matmul["bytes"])) == [1000 * (k + 1) for k in range(rank + 1)]
            allreduce = ev[ev["operation"] == "allreduce"]
            assert len(allreduce) == ITERS and set(allreduce["bytes"]) == {8 * COUNT}
            assert set(allreduce["group"]) == {"world"} and set(allreduce["stream"]) == {"comm"}
            assert (ev["end"] >= ev["start"]).all() and (matmul["end"] - matmul["start"] >= 1e-4).all()
    everything = sr.read_run_table(path, run, "events")
    assert len(everything) == CASES * ITERS * sum(r + 2 for r in range(RANKS))
    assert everything.attrs["units"]["start"] == "s" and everything.attrs["units"]["bytes"] == "B"
    # A filter on a column the table is not sorted by, and a list of values.
    listed = sr.read_run_table(path, run, "events", columns=["rank"], where={"operation": "allreduce", "rank": [0, 2]})
    assert sorted(listed["rank"].value_counts().items()) == [(0, CASES * ITERS), (2, CASES * ITERS)]


def test_common_clock_lines_up_the_allreduce(records):
    path, run = records
    clock = sr.read_run_table(path, run, "clock")
    assert list(clock["rank"]) == list(range(RANKS))
    # One host, one steady clock: the true offset is 0, so each measured one lies within its uncertainty.
    assert (np.abs(clock["offset"]) <= clock["uncertainty"] + 1e-9).all()
    assert clock["offset"].iloc[0] == 0 and (clock["rounds"].iloc[1:] > 0).all()
    slack = clock["uncertainty"].sum() + 1e-6
    ev = sr.read_run_table(path, run, "events", columns=["case", "iteration", "start", "end"],
                           where={"operation": "allreduce"})
    for _, one in ev.groupby(["case", "iteration"]):
        assert len(one) == RANKS
        # No rank leaves an allreduce before the last rank entered it.
        assert one["end"].min() >= one["start"].max() - slack


def test_phases_memory_and_metrics_follow_their_rules(records):
    path, run = records
    phases = sr.read_run_table(path, run, "phases")
    samples = sr.read_run_table(path, run, "samples")
    metrics = sr.read_run_table(path, run, "metrics")
    for (case, rank, iteration), one in phases.groupby(["case", "rank", "iteration"]):
        by_name = dict(zip(one["phase"], one["time"]))
        assert sorted(by_name) == ["backward", "bubble", "forward"]  # backward entered twice: one summed row
        assert by_name["bubble"] == pytest.approx(0.001 * (rank + 1) * (iteration + 1), rel=1e-12)
        assert by_name["forward"] >= 1e-3 and by_name["backward"] >= 2e-3
        sample = samples[(samples["case"] == case) & (samples["rank"] == rank) & (samples["iteration"] == iteration)]
        assert by_name["forward"] + by_name["backward"] <= float(sample["time"].iloc[0])
        mine = metrics[(metrics["case"] == case) & (metrics["rank"] == rank) & (metrics["iteration"] == iteration)]
        values = dict(zip(mine["metric"], mine["value"]))
        assert values["loss"] == pytest.approx(1 / (iteration + 1) + case)
        assert values["grad_norm"] == rank + iteration
        assert dict(zip(mine["metric"], mine["unit"])) == {"loss": "1", "grad_norm": "1", "step_time": "s"}
        assert values["step_time"] <= float(sample["time"].iloc[0])
    assert len(phases) == CASES * RANKS * ITERS * 3
    memory = sr.read_table(path, "memory", columns=["case", "rank", "category", "bytes"])
    assert len(memory) == CASES * RANKS * 2
    for row in memory.itertuples():
        expected = 1000 * (row.rank + 1) * ITERS if row.category == "activations" else 4096
        assert row.bytes == expected


def test_cxx_reader_reads_what_python_reads(records):
    path, run = records
    for table in ("events", "phases", "memory", "metrics", "clock"):
        cxx = cxx_table(path, run, table)
        py = sr.read_run_table(path, run, table)
        assert cxx["schema_version"] == "1.1" and cxx["rows"] == len(py)
        assert list(cxx["columns"]) == list(py.columns)
        for name, column in cxx["columns"].items():
            assert column["values"] == py[name].tolist(), (table, name)


def test_strata_trace_writes_a_perfetto_trace(records, tmp_path):
    path, run = records
    out = tmp_path / "trace.json"
    result = subprocess.run([os.path.join(SCRIPTS, "strata-trace"), path, "--case", "1", "-o", str(out)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    trace = json.loads(out.read_text())
    events = trace["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    expected = sr.read_run_table(path, run, "events", where={"case": 1})
    assert len(spans) == len(expected)
    processes = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(processes) == list(range(RANKS)) and processes[2].startswith("rank 2")
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    for rank in range(RANKS):
        assert sorted(name for (pid, _), name in threads.items() if pid == rank) == ["comm", "compute"]
    for span in spans:
        assert threads[(span["pid"], span["tid"])] == span["cat"] and span["dur"] >= 0
        assert span["args"]["case"] == 1 and set(span["args"]) >= {"bytes", "group", "iteration"}
    # Microseconds on the common clock.
    first = expected.iloc[0]
    match = [s for s in spans if s["pid"] == first["rank"] and s["name"] == first["operation"]]
    assert min(abs(s["ts"] - first["start"] * 1e6) for s in match) < 1e-3
    allreduce = [s for s in spans if s["name"] == "allreduce"]
    assert all(s["args"]["bytes"] == 8 * COUNT and s["args"]["group"] == "world" for s in allreduce)

    missing = subprocess.run([os.path.join(SCRIPTS, "strata-trace"), path, "--run", "nope", "-o", str(out)],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "has no run nope" in missing.stderr


def read_when_unlocked(function, *args, limit=30.0):
    """A process killed with SIGKILL drops its HDF5 file lock only at the very end of its exit."""
    deadline = time.monotonic() + limit
    while True:
        try:
            return function(*args)
        except (sr.StrataFileError, OSError) as error:
            assert time.monotonic() < deadline, error
            time.sleep(0.2)


def test_writer_killed_between_column_appends_leaves_a_readable_file(records, tmp_path):
    reference, _ = records
    # Column appends in the order the writer makes them: ranks, clock, then per case cases, samples, summary,
    # phases, events, memory, metrics. Die after the 4th column of case 1's events.
    with h5py.File(reference, "r") as f:
        width = {name: len(group) for name, group in next(iter(f["runs"].values())).items() if name != "env"}
    per_case = ["cases", "samples", "summary", "phases", "events", "memory", "metrics"]
    kill_after = width["ranks"] + width["clock"] + sum(width[t] for t in per_case) + \
        sum(width[t] for t in per_case[:4]) + 4
    out = tmp_path / "killed.h5"
    env = mpi_env()
    env["STRATA_TEST_KILL_AFTER_COLUMNS"] = str(kill_after)
    result = subprocess.run(["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(RANKS),
                             program("strata-test-record-steps"), *ARGS, "--output", str(out)],
                            cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    run = read_when_unlocked(sr.run_ids, str(out))[0]
    case0_events = len(sr.read_run_table(reference, sr.run_ids(reference)[0], "events", where={"case": 0}))
    with h5py.File(out, "r") as f:
        group = f["runs"][run]["events"]
        lengths = {name: ds.shape[0] for name, ds in group.items()}
        assert int(group.attrs["rows"]) == case0_events
        # The kill really fell between appends: 4 columns hold case 1's rows, the others do not.
        assert sorted(n for n, length in lengths.items() if length > case0_events) == \
            sorted(["case", "rank", "iteration", "operation"])
    events = sr.read_run_table(str(out), run, "events")
    assert len(events) == case0_events and set(events["case"]) == {0}
    assert sr.read_runs(str(out))["status"].iloc[0] == "interrupted"
    assert len(sr.read_run_table(str(out), run, "phases", where={"case": 1})) == RANKS * ITERS * 3
    cxx = cxx_table(str(out), run, "events")
    assert cxx["rows"] == case0_events
    assert all(len(column["values"]) == case0_events for column in cxx["columns"].values())
    assert cxx["columns"]["start"]["values"] == events["start"].tolist()

    # Where `rows` is missing (a writer older than the readers), both cut to the shortest column.
    bare = tmp_path / "no-rows.h5"
    shutil.copy(out, bare)
    with h5py.File(bare, "r+") as f:
        del f["runs"][run]["events"].attrs["rows"]
    assert len(sr.read_run_table(str(bare), run, "events")) == case0_events
    assert cxx_table(str(bare), run, "events")["rows"] == case0_events
