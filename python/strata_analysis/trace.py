"""strata-trace FILE [--run ID] [--case N] [-o OUT] : a run's event timeline as a Chrome/Perfetto trace.

Reads the `events` table (schema 1.1, results/SCHEMA.md) and writes the Trace Event Format that
ui.perfetto.dev and chrome://tracing open: one process per rank ("rank R (host)"), one thread per stream
(host, compute, comm, ...), one complete event (ph "X") per row with ts and dur in microseconds on the run's
common clock; args carry bytes, group, case and iteration. Without --run, the last run that has events;
without --case, every case. OUT defaults to FILE with .h5 replaced by -<run>.trace.json; "-" is stdout.
Exit status: 0 written, 2 bad input (not a Strata file, a damaged one, no such run or case, no events, an output
that is the input, an HDF5 file or unwritable; the output is written whole or not at all).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from strata_analysis import results as sr  # noqa: E402

PROG = "strata-trace"


class TraceError(Exception):
    pass


def pick_run(path: str, run: str | None) -> str:
    with sr.open_file(path) as f:
        runs = f.get("runs", {})
        if run is not None:
            if run not in runs:
                raise TraceError(f"{path} has no run {run}")
            if sr.SCHEMA_EVENTS not in runs[run]:
                raise TraceError(f"run {run} has no {sr.SCHEMA_EVENTS} table (written by schema 1.1 step records)")
            return run
        with_events = [r for r in runs if sr.SCHEMA_EVENTS in runs[r]]
        if not with_events:
            raise TraceError(f"{path} has no run with an {sr.SCHEMA_EVENTS} table")
        return sorted(with_events)[-1]  # run ids sort by start time


def build_trace(path: str, run: str, case: int | None) -> dict:
    where = {"case": case} if case is not None else None
    events = sr.read_run_table(path, run, "events", where=where,
                               columns=["case", "rank", "iteration", "operation", "stream", "start", "end", "bytes",
                                        "group"])
    if case is not None and events.empty:
        raise TraceError(f"run {run} has no events in case {case}")
    hosts = {}
    try:
        ranks = sr.read_run_table(path, run, "ranks", columns=["rank", "host"])
        hosts = dict(zip(ranks["rank"], ranks["host"]))
    except sr.StrataFileError:
        pass
    trace = []
    threads: dict[tuple[int, str], int] = {}
    for rank in sorted(set(int(r) for r in events["rank"])):
        name = f"rank {rank}" + (f" ({hosts[rank]})" if rank in hosts else "")
        trace.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": name}})
        trace.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}})
    for row in events.itertuples(index=False):
        key = (int(row.rank), str(row.stream))
        if key not in threads:
            threads[key] = sum(1 for k in threads if k[0] == key[0])
            trace.append({"ph": "M", "name": "thread_name", "pid": key[0], "tid": threads[key],
                          "args": {"name": key[1]}})
        trace.append({"ph": "X", "name": str(row.operation), "cat": key[1], "pid": key[0], "tid": threads[key],
                      "ts": float(row.start) * 1e6, "dur": max(float(row.end) - float(row.start), 0.0) * 1e6,
                      "args": {"bytes": int(row.bytes), "group": str(row.group), "case": int(row.case),
                               "iteration": int(row.iteration)}})
    return {"traceEvents": trace, "displayTimeUnit": "ms",
            "otherData": {"source": os.path.abspath(path), "run_id": run,
                          "case": "all" if case is None else case,
                          "clock": "rank 0's steady clock since the run's clock measurement (events table)"}}


def write_whole(path: str, text: str) -> None:
    """Writes the file whole or not at all: a temporary beside it, renamed over it."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, temporary = tempfile.mkstemp(prefix=".strata-trace-", suffix=".json", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(temporary, 0o666 & ~_umask())
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("file")
    parser.add_argument("--run", help="run id (default: the last run with events)")
    parser.add_argument("--case", type=int, help="only this case (default: all)")
    parser.add_argument("-o", "--output", help="trace file to write; - for stdout")
    args = parser.parse_args(argv)
    if args.output == "":
        parser.error("-o/--output: an empty file name")
    if args.output:
        sr.check_outputs([("FILE", args.file)], replaced=[("-o/--output", args.output, "a Chrome trace")])
    try:
        run = pick_run(args.file, args.run)
        trace = build_trace(args.file, run, args.case)
    except (sr.StrataFileError, TraceError) as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    out = args.output or os.path.splitext(args.file)[0] + f"-{run}.trace.json"
    if not args.output:
        sr.check_outputs([("FILE", args.file)], replaced=[("the default output", out, "a Chrome trace")])
    text = json.dumps(trace)
    if out == "-":
        sys.stdout.write(text + "\n")
    else:
        write_whole(out, text)
        n = sum(1 for e in trace["traceEvents"] if e["ph"] == "X")
        print(f"{PROG}: {n} events of run {run} -> {out}", file=sys.stderr)
    return 0


def console_main() -> int:
    """The `strata-trace` command (the package's entry point and scripts/strata-trace)."""
    return sr.run_script(PROG, main, sys.argv[1:])


if __name__ == "__main__":
    sys.exit(console_main())
