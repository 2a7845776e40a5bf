"""strata-collective under a real mpirun: every operation, algorithm and dtype checked on 2-5 ranks; layouts
and grid groups; nccl-tests' size and bandwidth conventions; traffic per tier; the mixed pattern; the
timeout on an injected hang; bad input."""
from __future__ import annotations

import h5py
import numpy as np
import pytest

import strata_results as sr
from conftest import digest, mpirun, program

FACTORS = {"allreduce": lambda n: 2 * (n - 1) / n, "allgather": lambda n: (n - 1) / n,
           "reduce_scatter": lambda n: (n - 1) / n, "alltoall": lambda n: (n - 1) / n,
           "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0, "sendrecv": lambda n: 1.0}


def collective(np_, args, tmp_path, name="c.h5", timeout=300):
    out = tmp_path / name
    result = mpirun(np_, [program("strata-collective"), "-q", "--output", str(out), *args], cwd=str(tmp_path),
                    timeout=timeout)
    return result, out


# One rank per node everywhere, and two per node at np 4 so the hierarchical algorithms run a real two-level
# case (reduce-scatter in the node, across nodes, allgather in the node) rather than their degenerate one.
@pytest.mark.parametrize("ranks,per_node", [(2, 1), (3, 1), (4, 1), (5, 1), (4, 2)])
def test_every_operation_and_algorithm_is_correct(tmp_path, ranks, per_node):
    # Sizes that do not divide by the rank count, and a zero size.
    result, out = collective(ranks, ["--collective", "all", "-a", "all", "-d", "int8,float,half,bfloat16",
                                     "-o", "sum,max,avg", "-b", "0", "-e", "8K", "-f", "9", "-n", "2", "-w", "1",
                                     "--ranks-per-node", str(per_node)], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    if per_node > 1:
        data = sr.read_cases_with_summary(str(out))
        assert set(data["n_nodes"]) == {ranks // per_node} and set(data["ranks_per_node"]) == {per_node}
        hier = data[(data["algo"] == "hierarchical") & (data["size_bytes"] > 0)]
        assert len(hier) > 0 and (hier["intra_bytes_per_rank"] > 0).all() and (hier["inter_bytes_per_rank"] > 0).all()
    data = sr.read_cases_with_summary(str(out))
    assert (data["wrong_elements"] == 0).all()
    assert set(data["operation"]) == set(FACTORS)
    assert {"library", "ring", "recursive_doubling", "hierarchical"} <= set(data["algo"])
    assert set(data["in_place"]) == {0, 1}
    assert 0 in set(data["size_bytes"])


def test_tiny_ring_segments_and_split_messages_through_the_program(tmp_path):
    # Segments of 8 bytes and messages cut every 3 bytes: the segmented reduction and the splitting of
    # messages, which the default 1 MiB / 1 GiB never reach at test sizes, give exact results, on the process
    # groups (which alone run horing and shm) and on the blocking algorithms (recursive doubling, reduce).
    result, out = collective(4, ["--collective", "allreduce,reduce_scatter,allgather,broadcast,reduce", "-a", "all",
                                 "-d", "int8,float,double", "-o", "sum,max", "-b", "0", "-e", "2K", "-f", "7",
                                 "--ranks-per-node", "2", "--segment-bytes", "8", "--max-message-bytes", "3",
                                 "-n", "1", "-w", "0"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    data = sr.read_cases_with_summary(str(out))
    assert (data["wrong_elements"] == 0).all() and len(data) > 0
    assert {"ring", "hierarchical", "horing", "shm", "recursive_doubling"} <= set(data["algo"])


def test_nccl_tests_conventions(tmp_path):
    result, out = collective(4, ["--collective", "all", "-b", "64K", "-e", "64K", "-d", "float", "-n", "3"], tmp_path)
    assert result.returncode == 0, result.stderr
    data = sr.read_cases_with_summary(str(out))
    for row in data.itertuples():
        n = row.group_size
        assert row.bus_factor == pytest.approx(FACTORS[row.operation](n))
        assert row.algbw == pytest.approx(row.size_bytes / row.time_rankmax_median)
        assert row.busbw == pytest.approx(row.algbw * row.bus_factor)
        if row.operation in ("allgather", "reduce_scatter"):
            assert row.bytes_per_rank * n == row.size_bytes
        else:
            assert row.bytes_per_rank == row.size_bytes
    with h5py.File(out) as f:
        summary = list(f["runs"].values())[0]["summary"]
        assert summary["busbw"].attrs["units"] == "B/s"
        assert "nccl-tests" in summary["busbw"].attrs["convention"]


def group_members(out, kind_filter=None):
    groups = sr.read_table(str(out), "groups")
    cases = sr.read_table(str(out), "cases")
    merged = groups.merge(cases[["case", "group_kind"]], on="case")
    return {kind: sorted(set(g["world_ranks"])) for kind, g in merged.groupby("group_kind")}


@pytest.mark.parametrize("group, expected", [("world", ["0,1,2,3"]), ("intra", ["0,1", "2,3"]),
                                             ("inter", ["0,2", "1,3"])])
def test_layout_groups(tmp_path, group, expected):
    result, out = collective(4, ["--ranks-per-node", "2", "--group", group, "-b", "1K", "-e", "1K", "-n", "2"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert group_members(out)[group] == expected
    cases = sr.read_table(str(out), "cases")
    assert set(cases["n_nodes"]) == {2} and set(cases["emulated_nodes"]) == {1}


@pytest.mark.parametrize("dim, expected", [("tp", ["0,1", "2,3"]), ("dp", ["0,2", "1,3"]), ("pp", ["0", "1", "2", "3"])])
def test_grid_groups(tmp_path, dim, expected):
    result, out = collective(4, ["--grid", "tp=2,pp=1,dp=2", "--grid-dim", dim, "--ranks-per-node", "2",
                                 "-b", "1K", "-e", "1K", "-n", "2"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert group_members(out)[dim] == expected


def test_traffic_per_tier(tmp_path):
    size = 1 << 20
    result, out = collective(4, ["--ranks-per-node", "2", "-a", "ring,hierarchical,library", "-b", "1M", "-e", "1M",
                                 "--placement", "out", "-n", "2"], tmp_path)
    assert result.returncode == 0, result.stderr
    data = sr.read_cases_with_summary(str(out)).set_index("algo")
    ring = data.loc["ring"]
    # A ring allreduce sends 2(n-1)/n of the buffer per rank; with two emulated nodes of two, half the ring's
    # links cross nodes.
    assert ring.intra_bytes_per_rank + ring.inter_bytes_per_rank == pytest.approx(2 * 3 / 4 * size, rel=0.01)
    hier = data.loc["hierarchical"]
    # Hierarchical: only the shard (1/2 of the buffer) crosses nodes, twice (reduce-scatter + allgather of a
    # 2-rank ring): less than the flat ring's inter-node bytes.
    assert 0 < hier.inter_bytes_per_rank < ring.inter_bytes_per_rank
    assert np.isnan(data.loc["library"].inter_bytes_per_rank)


def test_mixed_pattern_reports_slowdown(tmp_path):
    result, out = collective(4, ["--grid", "tp=2,dp=2", "--mixed", "-b", "64K", "-e", "64K", "-n", "3"], tmp_path)
    assert result.returncode == 0, result.stderr
    data = sr.read_cases_with_summary(str(out))
    assert len(data) == 4 and (data["wrong_elements"] == 0).all()
    concurrent = data[data["concurrent_with"] != ""]
    assert set(concurrent["operation"]) == {"allreduce", "reduce_scatter"}
    assert (concurrent["slowdown_vs_alone"] > 0).all()
    alone = data[data["concurrent_with"] == ""]
    assert (alone["slowdown_vs_alone"] == 1.0).all()


def test_mixed_pattern_runs_on_the_process_groups_with_any_of_their_algorithms(tmp_path):
    result, out = collective(4, ["--grid", "tp=2,dp=2", "--ranks-per-node", "2", "--mixed", "-a", "hierarchical",
                                 "-b", "16K", "-e", "16K", "-n", "2"], tmp_path)
    assert result.returncode == 0, result.stderr
    data = sr.read_cases_with_summary(str(out))
    assert len(data) == 4 and (data["wrong_elements"] == 0).all()
    assert set(data["algo"]) == {"hierarchical"}
    for args, message in ((["--backend", "nccl"], "--mixed runs on the MPI process groups"),
                          (["-a", "recursive_doubling"],
                           "--mixed takes one algorithm of the process groups: library, ring, hierarchical, horing, shm"),
                          (["-a", "library,ring"], "--mixed takes one algorithm of the process groups")):
        bad = tmp_path / "bad.h5"
        result, _ = collective(4, ["--grid", "tp=2,dp=2", "--mixed", *args, "--output", str(bad)], tmp_path)
        if "built without" in result.stderr:
            continue
        assert result.returncode == 2, (args, result.stderr)
        assert message in result.stderr, (args, result.stderr)
        assert not bad.exists()


def test_timeout_fires_on_an_injected_hang(tmp_path):
    result, out = collective(3, ["-b", "1K", "-e", "4K", "-n", "2", "--timeout", "3", "--inject-hang", "1"],
                             tmp_path, timeout=120)
    assert result.returncode == 124, result.stderr[-3000:]
    reports = [line for line in result.stderr.splitlines() if "timed out" in line]
    # One report, by the lowest rank that waits (rank 0, which holds the file): the stderr line and the stored
    # failure say the same.
    assert len(reports) == 1, result.stderr
    assert reports[0].startswith("strata: rank 1 timed out after 3.0 s in the setup of allreduce library float sum 4096 B "
                                 "in place, world group 0 (this rank did not arrive: it is still in "), reports[0]
    assert reports[0].endswith("; ranks 0, 2 wait there); ending the job"), reports[0]
    runs = sr.read_runs(str(out))
    assert runs["status"].iloc[0] == "failed"
    assert reports[0] == f"strata: {runs['failure'].iloc[0]}; ending the job"
    summary = sr.read_table(str(out), "summary")
    assert len(summary) == 5  # every case before the hung one (1K, 2K out and in; 4K out) is kept


def test_flush_bytes_start_each_blocking_operation_from_its_inputs(tmp_path):
    # A cold measurement, as nvbench flushes the L2: before each timed operation every rank rewrites its inputs and
    # writes a buffer of its own. The last timed in-place allreduce is checked as well: without the rewrite its
    # result would be the sum of sums of every iteration before it.
    result, out = collective(2, ["-m", "blocking", "--flush-bytes", "1M", "-b", "1K", "-e", "4K", "-f", "4", "-n", "5",
                                 "-w", "2", "--collective", "allreduce,allgather"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    data = sr.read_cases_with_summary(str(out))
    assert set(data["flush_bytes"]) == {1 << 20} and set(data["in_place"]) == {0, 1}
    assert (data["wrong_elements"] == 0).all()
    plain, plain_out = collective(2, ["-m", "blocking", "-b", "1K", "-e", "1K", "-n", "2"], tmp_path, "plain.h5")
    assert plain.returncode == 0 and set(sr.read_cases_with_summary(str(plain_out))["flush_bytes"]) == {0}
    # A few bytes write a whole float, recorded as written.
    odd, odd_out = collective(2, ["-m", "blocking", "--flush-bytes", "3", "-b", "1K", "-e", "1K", "-n", "2"], tmp_path,
                              "odd.h5")
    assert odd.returncode == 0 and set(sr.read_cases_with_summary(str(odd_out))["flush_bytes"]) == {4}


def test_pipelined_samples_are_per_operation(tmp_path):
    # A pipelined sample times --ops-per-sample operations back to back; its time is stored per operation, so the
    # median of one operation per sample and of sixteen agree within the machine's noise (not sixteenfold).
    medians = []
    for ops in (1, 16):
        result, out = collective(2, ["-m", "pipelined", "--ops-per-sample", str(ops), "--collective", "allreduce",
                                     "-a", "ring", "-b", "1M", "-e", "1M", "-n", "20", "-w", "2"], tmp_path, f"p{ops}.h5")
        assert result.returncode == 0, result.stderr[-3000:]
        data = sr.read_cases_with_summary(str(out))
        assert set(data["ops_per_sample"]) == {ops}
        medians.append(float(np.median(data["time_rankmax_median"])))
    assert 0.25 < medians[1] / medians[0] < 4, medians


@pytest.mark.parametrize("args, message", [
    (["--collective", "gather"], "unknown operation 'gather'"),
    (["-d", "float8"], "unknown datatype 'float8'"),
    (["--collective", "allgather", "-o", "max"], "--redop applies to reductions"),
    (["-b", "6", "-e", "6", "-d", "float"], "not a multiple of float's 4 bytes"),
    (["-b", "1M", "-e", "1K"], "larger than --maxbytes"),
    (["--grid", "tp=2,dp=2"], "needs 4 ranks but the job has 3"),
    (["--segment-bytes", "0"], "--segment-bytes must be positive"),
    (["--max-message-bytes", "4G"], "--max-message-bytes must be in 1.."),
    (["--grid", "tp=3", "--ranks-per-node", "1"], "tp must divide the ranks per node"),
    (["--ranks-per-node", "2"], "divide the 3 ranks"),
    (["--backend", "nccl"], "--backend nccl"),
    (["--device-buffers"], "--device-buffers"),
    (["-a", "hierarchical", "--collective", "sendrecv"], "not available for sendrecv"),
    (["--flush-bytes", "1M"], "--flush-bytes writes between timed operations: it needs --mode blocking"),
    (["-m", "blocking", "--flush-bytes", "1M", "--backend", "nccl"], "--flush-bytes writes host memory: it needs --backend mpi"),
])
def test_bad_input_exits_2(tmp_path, args, message):
    existing = tmp_path / "c.h5"
    first, _ = collective(3, ["-b", "8", "-e", "8", "-n", "1"], tmp_path)
    assert first.returncode == 0
    before = digest(str(existing))
    result, _ = collective(3, args, tmp_path)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert digest(str(existing)) == before
