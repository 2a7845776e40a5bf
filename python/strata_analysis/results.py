"""Read Strata results files (schema: results/SCHEMA.md) into pandas DataFrames.

    import strata_results as sr
    runs = sr.read_runs(["a.h5", "b.h5"])            # one row per run, attributes as columns
    summary = sr.read_table(["a.h5"], "summary")      # rows of every run, run attributes as columns
    units = sr.column_units("a.h5", "summary")        # {"time_rankmax_median": "s", ...}
    # One run's table, only some columns and rows (reads no more of a large table than it must):
    ev = sr.read_run_table("a.h5", run_id, "events", columns=["start", "end"], where={"case": 2, "rank": 3})

Files that are not Strata results, that use a newer major schema version, that are damaged (an object that does
not read back) or that another program is writing, raise StrataFileError. The scripts check their outputs with
check_outputs before writing anything, and run their main through run_script, which turns these errors into one
line `<script>: error: ...` and exit status 2.
"""
from __future__ import annotations

import fcntl
import json
import math
import os
import sys
import tempfile
import time
from typing import Callable, Iterable

import h5py
import numpy as np
import pandas as pd

SCHEMA_NAME = "strata-results"
SCHEMA_MAJOR = 1
SCHEMA_EVENTS = "events"  # the step records' timeline (schema 1.1)
# Run attributes copied onto every table row (prefixed "run_" where they would clash with a column).
RUN_COLUMNS = ("benchmark", "status", "start_utc", "end_utc", "launcher", "n_nodes", "n_ranks", "ranks_per_node",
               "slurm_job_id", "command_line")


# The run attributes every writer sets (SCHEMA.md) that the readers rely on.
RUN_ATTRIBUTES = ("benchmark", "status", "n_ranks", "n_nodes", "launcher", "start_utc")


class StrataFileError(Exception):
    """A file Strata cannot read or write: not HDF5, not Strata results, a newer major schema, damaged, held by
    another writer; or an output that would overwrite an input or a results file."""


class FileInUseError(StrataFileError):
    """Another program holds the file's lock: a writer (or, for a writer, a reader) has it open."""


HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
LOCK_WAIT_VARIABLE = "STRATA_LOCK_WAIT"  # seconds a writer waits for another writer of its file (default 30)
DEFAULT_LOCK_WAIT = 30.0


def _text(value) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.ndarray) and value.shape == ():
        return _text(value[()])
    return str(value)


def lock_holder(path: str) -> str | None:
    """Who holds the file's lock: "writer", "readers" or None. HDF5 takes an exclusive flock on a file it opens for
    writing and a shared one on a file it opens for reading, and keeps it until the file is closed."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return "writer"
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return "readers"
        return None
    finally:
        os.close(fd)  # releases what the probe took


def in_use_message(path: str, holder: str = "writer") -> str:
    if holder == "readers":
        return f"{path}: in use by another program reading it (it holds the file's lock)"
    return f"{path}: in use by another writer (it holds the file's lock)"


def has_hdf5_signature(path: str) -> bool:
    try:
        with open(path, "rb") as handle:
            return handle.read(len(HDF5_SIGNATURE)) == HDF5_SIGNATURE
    except OSError:
        return False


# Files already read whole, by identity and version: a script opens one file many times.
_walked: set[tuple] = set()
_WALK_SLAB_BYTES = 16 << 20


def _walk(handle: h5py.File, path: str) -> None:
    """Reads the file as any reader may (every link, attribute and dataset value, datasets in slabs), so a damaged
    file is reported here, naming it, instead of failing later inside a plot."""
    stat = os.stat(path)
    key = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
    if key in _walked:
        return
    where = "/"
    try:
        for name in handle.attrs:
            where = f"attribute {name!r} of /"
            handle.attrs[name]

        def visit(name, obj):
            nonlocal where
            for attr in obj.attrs:
                where = f"attribute {attr!r} of /{name}"
                obj.attrs[attr]
            where = f"/{name}"
            if isinstance(obj, h5py.Dataset):
                if obj.shape is None or obj.shape == ():
                    if obj.shape == ():
                        obj[()]
                    return
                row = max(obj.dtype.itemsize, 1) * int(math.prod(obj.shape[1:]) or 1)
                step = max(_WALK_SLAB_BYTES // row, 1)
                for start in range(0, obj.shape[0], step):
                    obj[start:start + step]

        handle.visititems(visit)
    except Exception as error:  # noqa: BLE001 - whatever HDF5 raises on a damaged object
        raise StrataFileError(f"{path}: damaged HDF5 file: {where} cannot be read ({error})") from None
    _walked.add(key)


def open_file(path: str) -> h5py.File:
    """Opens a Strata file read-only after checking its schema name and major version, and reading it whole once."""
    if not str(path):
        raise StrataFileError("an empty file name where a Strata results file is needed")
    if not os.path.isfile(path):
        raise StrataFileError(f"{path}: no such file")
    try:
        handle = h5py.File(path, "r")
    except OSError as error:
        if not has_hdf5_signature(path):
            raise StrataFileError(f"{path} is not an HDF5 file ({error})") from None
        if lock_holder(path) == "writer":
            raise FileInUseError(in_use_message(path) + ": read it when the writer has finished") from None
        raise StrataFileError(f"{path}: damaged HDF5 file: HDF5 cannot open it (truncated?): {error}") from None
    try:
        name = _text(handle.attrs.get("schema", ""))
        major = int(handle.attrs.get("schema_version_major", -1))
        minor = int(handle.attrs.get("schema_version_minor", -1))
    except Exception as error:  # noqa: BLE001 - a damaged root
        handle.close()
        raise StrataFileError(f"{path}: damaged HDF5 file: its root attributes cannot be read ({error})") from None
    if name != SCHEMA_NAME:
        handle.close()
        raise StrataFileError(f"{path} is an HDF5 file but not a Strata results file")
    if major < 0 or minor < 0:
        handle.close()
        raise StrataFileError(f"{path}: damaged Strata file: a Strata file without a schema version "
                              f"(schema_version_major, schema_version_minor)")
    if major > SCHEMA_MAJOR:
        handle.close()
        raise StrataFileError(f"{path} uses Strata results schema {major}.{minor}, newer than this reader's "
                              f"{SCHEMA_MAJOR}.x: use a newer Strata")
    try:
        _walk(handle, path)
        runs = handle.get("runs", {})
        if not isinstance(runs, (h5py.Group, dict)):
            raise StrataFileError(f"{path}: damaged Strata file: /runs is not a group")
        for run_id, run in runs.items():
            missing = [name for name in RUN_ATTRIBUTES if name not in run.attrs]
            if missing:
                raise StrataFileError(f"{path}: damaged Strata file: run {run_id} lacks the attribute(s) "
                                      f"{', '.join(missing)} every run has")
    except StrataFileError:
        handle.close()
        raise
    return handle


def lock_wait_seconds() -> float:
    text = os.environ.get(LOCK_WAIT_VARIABLE, "")
    if not text:
        return DEFAULT_LOCK_WAIT
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not math.isfinite(seconds) or seconds < 0:
        raise StrataFileError(f"{LOCK_WAIT_VARIABLE}={text}: expected the seconds to wait for another writer of a "
                              f"results file, a number >= 0")
    return seconds


def open_for_writing(path: str, on_wait: Callable[[float], None] | None = None) -> h5py.File:
    """Opens an existing Strata file for writing, as the programs do: when another program holds it, waits up to
    STRATA_LOCK_WAIT seconds (default 30) for it to finish, then raises FileInUseError. The file is checked whole
    (open_file) before it is opened for writing."""
    wait = lock_wait_seconds()
    deadline = time.monotonic() + wait
    waited = False
    while True:
        holder = lock_holder(path)
        if holder is None:
            with open_file(path):
                pass
            try:
                return h5py.File(path, "r+", libver=("earliest", "v110"))
            except OSError as error:
                holder = lock_holder(path)
                if holder is None:
                    raise StrataFileError(f"{path}: cannot be opened for writing ({error})") from None
        if time.monotonic() >= deadline:
            raise FileInUseError(in_use_message(path, holder) + (f"; waited {wait:.0f} s for it to finish" if wait > 0
                                                                 else "") +
                                 f" ({LOCK_WAIT_VARIABLE}=SECONDS sets the wait)")
        if not waited and on_wait:
            on_wait(wait)
        waited = True
        time.sleep(0.1)


def same_file(a: str, b: str) -> bool:
    """Whether two paths name one file: by device and inode where both exist, else by their real paths."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def check_outputs(inputs: Iterable[tuple[str, str]], appended: Iterable[tuple[str, str]] = (),
                  replaced: Iterable[tuple[str, str, str]] = ()) -> None:
    """Before anything is written: refuses (StrataFileError naming the argument and the file) an output that is an
    input or another output (same path, or same file by device and inode). `appended` are results files runs go
    into; `replaced` are (argument, path, what it holds) written whole, which must besides not be an existing HDF5
    file (results would be lost), a folder, or unwritable, in a folder that exists and takes new files."""
    inputs = [(flag, path) for flag, path in inputs if path]
    outputs = [(flag, path) for flag, path in appended if path] + [(f, p) for f, p, _ in replaced if p and p != "-"]
    for i, (flag, path) in enumerate(outputs):
        for in_flag, in_path in inputs:
            if same_file(path, in_path):
                raise StrataFileError(f"{path}: {flag} is also an input ({in_flag} {in_path}); a script never writes "
                                      f"over a file it reads: give another output path")
        for other_flag, other in outputs[:i]:
            if same_file(path, other):
                raise StrataFileError(f"{path}: {flag} and {other_flag} are the same file; each output needs its own")
    for flag, path, what in replaced:
        if not path or path == "-":
            continue
        if os.path.isdir(path):
            raise StrataFileError(f"{path}: {flag} is a directory, not a file")
        if os.path.exists(path):
            if not os.path.isfile(path):
                raise StrataFileError(f"{path}: {flag} is not a regular file")
            if has_hdf5_signature(path):
                raise StrataFileError(f"{path}: {flag} is an existing HDF5 file, which may hold results: refusing to "
                                      f"overwrite it with {what}; give another path")
            try:
                os.close(os.open(path, os.O_WRONLY))
            except OSError as error:
                raise StrataFileError(f"{path}: {flag} is not writable ({error.strerror})") from None
        check_folder_writable(flag, os.path.dirname(os.path.abspath(path)))


def check_folder_writable(flag: str, folder: str) -> None:
    if not os.path.isdir(folder):
        raise StrataFileError(f"{folder}: {flag}: the folder does not exist")
    try:
        fd, probe = tempfile.mkstemp(prefix=".strata-write-probe-", dir=folder)
    except OSError as error:
        raise StrataFileError(f"{folder}: {flag}: the folder is not writable ({error.strerror})") from None
    os.close(fd)
    os.unlink(probe)


def run_script(prog: str, main: Callable[[list[str]], int], argv: list[str]) -> int:
    """Runs a script's main: a file it cannot read or write (StrataFileError, OSError) is one line
    `<prog>: error: ...` on stderr and exit status 2, never a traceback."""
    try:
        return main(argv)
    except StrataFileError as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
    except OSError as error:
        what = error.strerror or str(error)
        name = error.filename
        print(f"{prog}: error: {name}: {what}" if name else f"{prog}: error: {what}", file=sys.stderr)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 128 + 2
    return 2


def _attrs(group) -> dict:
    out = {}
    for key, value in group.attrs.items():
        if isinstance(value, (bytes, str)) or (isinstance(value, np.ndarray) and value.dtype.kind in "OSU"):
            out[key] = _text(value)
        elif isinstance(value, np.generic):
            out[key] = value.item()
        else:
            out[key] = value
    return out


def run_ids(path: str) -> list[str]:
    with open_file(path) as f:
        return list(f["runs"].keys()) if "runs" in f else []


def read_runs(paths: str | Iterable[str]) -> pd.DataFrame:
    """One row per run: file, run_id, every run attribute, and the env group's attributes prefixed env_."""
    rows = []
    for path in _paths(paths):
        with open_file(path) as f:
            for run_id, group in f.get("runs", {}).items():
                row = {"file": path, "run_id": run_id, **_attrs(group)}
                if "env" in group:
                    row.update({f"env_{k}": v for k, v in _attrs(group["env"]).items()})
                rows.append(row)
    return pd.DataFrame(rows)


def _column(dataset, stop: int | None = None, start: int = 0) -> np.ndarray:
    """Values [start, stop) of a column dataset (strings decoded)."""
    stop = dataset.shape[0] if stop is None else stop
    if h5py.check_string_dtype(dataset.dtype) is not None:
        return dataset.asstr()[start:stop]
    return dataset[start:stop]


def table_rows(group: h5py.Group) -> int:
    """Rows of a table group every reader agrees on: the `rows` attribute, cut to the shortest column (a job
    killed between two column appends leaves some columns longer; a writer sets `rows` last)."""
    lengths = [ds.shape[0] for ds in group.values() if isinstance(ds, h5py.Dataset)]
    rows = min(lengths) if lengths else 0
    if "rows" in group.attrs:
        rows = min(rows, max(int(group.attrs["rows"]), 0))
    return rows


def _sorted_by(group: h5py.Group) -> list[str]:
    return [c for c in _text(group.attrs.get("sorted_by", "")).split(",") if c]


def _equal_range(dataset, lo: int, hi: int, value) -> tuple[int, int]:
    """[first, last) of `value` in rows [lo, hi) of a column sorted there, by bisection: O(log n) reads of
    single elements instead of the whole column."""
    def bisect(strict: bool) -> int:
        a, b = lo, hi
        while a < b:
            mid = (a + b) // 2
            x = dataset[mid]
            if x < value or (strict and x == value):
                a = mid + 1
            else:
                b = mid
        return a
    return bisect(False), bisect(True)


def _select(group: h5py.Group, columns: Iterable[str] | None, where: dict | None) -> dict[str, np.ndarray]:
    """The chosen columns of a table group for the rows matching `where` ({column: value or list of values}).
    Leading `where` columns the table is sorted by (its `sorted_by` attribute) narrow the row range by
    bisection; the rest are read only inside that range and applied as a mask."""
    rows = table_rows(group)
    names = [n for n, ds in group.items() if isinstance(ds, h5py.Dataset)]
    wanted = names if columns is None else list(columns)
    for name in [*wanted, *(where or {})]:
        if name not in group:
            raise KeyError(f"table {group.name} has no column {name!r}; it has {names}")
    lo, hi = 0, rows
    rest = dict(where or {})
    for key in _sorted_by(group):
        value = rest.get(key)
        if value is None or isinstance(value, (list, tuple, set, np.ndarray)):
            break
        lo, hi = _equal_range(group[key], lo, hi, value)
        del rest[key]
    mask = np.ones(hi - lo, dtype=bool)
    for key, value in rest.items():
        data = _column(group[key], hi, lo)
        mask &= np.isin(data, list(value)) if isinstance(value, (list, tuple, set, np.ndarray)) else data == value
    return {name: _column(group[name], hi, lo)[mask] for name in wanted}


def read_run_table(path: str, run_id: str, table: str, columns: Iterable[str] | None = None,
                   where: dict | None = None) -> pd.DataFrame:
    """One run's table as a DataFrame: only `columns` (default all), only rows matching `where`
    ({"rank": 3, "case": [0, 2]}: equality, or membership for a list). Units are in df.attrs["units"]."""
    with open_file(path) as f:
        runs = f.get("runs", {})
        if run_id not in runs:
            raise StrataFileError(f"{path} has no run {run_id}")
        if table not in runs[run_id]:
            raise StrataFileError(f"run {run_id} in {path} has no table {table}")
        group = runs[run_id][table]
        frame = pd.DataFrame(_select(group, columns, where))
        frame.attrs["units"] = {n: _text(group[n].attrs.get("units", "")) for n in frame.columns}
        return frame


def read_table(paths: str | Iterable[str], table: str, benchmark: str | None = None,
               columns: Iterable[str] | None = None, where: dict | None = None) -> pd.DataFrame:
    """Rows of `table` from every run in `paths` (optionally one benchmark only), with file, run_id and the
    run attributes in RUN_COLUMNS as extra columns. `columns` and `where` select as in read_run_table.
    Units are in df.attrs["units"]."""
    frames, units = [], {}
    for path in _paths(paths):
        with open_file(path) as f:
            for run_id, group in f.get("runs", {}).items():
                attrs = _attrs(group)
                if benchmark is not None and attrs.get("benchmark") != benchmark:
                    continue
                if table not in group:
                    continue
                selected = _select(group[table], columns, where)
                units.update({name: _text(group[table][name].attrs.get("units", "")) for name in selected})
                frame = pd.DataFrame(selected)
                frame.insert(0, "run_id", run_id)
                frame.insert(0, "file", path)
                for key in RUN_COLUMNS:
                    if key in attrs:
                        frame["run_" + key if key in frame.columns else key] = attrs[key]
                frames.append(frame)
    result = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    result.attrs["units"] = units
    return result


def read_cases_with_summary(paths: str | Iterable[str], benchmark: str | None = None) -> pd.DataFrame:
    """The summary table joined with the case parameters: one row per (run, case)."""
    cases = read_table(paths, "cases", benchmark)
    summary = read_table(paths, "summary", benchmark)
    if cases.empty or summary.empty:
        return pd.DataFrame()
    shared = [c for c in summary.columns if c in cases.columns and c not in ("file", "run_id", "case")]
    merged = cases.merge(summary.drop(columns=shared), on=["file", "run_id", "case"], how="inner")
    merged.attrs["units"] = {**cases.attrs.get("units", {}), **summary.attrs.get("units", {})}
    return merged


def column_units(path: str, table: str) -> dict[str, str]:
    with open_file(path) as f:
        units = {}
        for group in f.get("runs", {}).values():
            if table in group:
                units.update({n: _text(ds.attrs.get("units", "")) for n, ds in group[table].items()})
        return units


def config(path: str, run_id: str) -> dict:
    with open_file(path) as f:
        return json.loads(_text(f["runs"][run_id].attrs["config_json"]))


def _paths(paths: str | Iterable[str]) -> list[str]:
    return [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)


# ---- Comparing, merging and annotating files (strata-compare, strata-merge) ----------------------------

def schema_version(path: str) -> tuple[int, int]:
    """(major, minor) of a Strata file, after the same checks as open_file."""
    with open_file(path) as f:
        return int(f.attrs["schema_version_major"]), int(f.attrs["schema_version_minor"])


def read_rankmax_samples(paths: str | Iterable[str], benchmark: str | None = None) -> pd.DataFrame:
    """Per (file, run, case, timed iteration): the time of the slowest rank (the `rankmax` view of SCHEMA.md).
    Iterations start after a barrier, so a step is as slow as its slowest rank; columns file, run_id,
    benchmark, case, iteration, time (s)."""
    samples = read_table(paths, "samples", benchmark)
    if samples.empty:
        return pd.DataFrame(columns=["file", "run_id", "benchmark", "case", "iteration", "time"])
    out = samples.groupby(["file", "run_id", "benchmark", "case", "iteration"], as_index=False, sort=True)["time"].max()
    out.attrs["units"] = {"time": "s"}
    return out


def run_hosts(path: str, run_id: str) -> list[str]:
    """Host names of a run: the `hosts` attribute (JSON array), else the `ranks` table's hosts."""
    with open_file(path) as f:
        group = f["runs"][run_id]
        text = _text(group.attrs.get("hosts", ""))
        try:
            hosts = json.loads(text) if text else []
        except json.JSONDecodeError:
            hosts = []
        if not hosts and "ranks" in group and "host" in group["ranks"]:
            hosts = list(dict.fromkeys(_column(group["ranks"]["host"], table_rows(group["ranks"]))))
        return [str(h) for h in hosts]


def _as_column(values) -> np.ndarray:
    array = np.asarray(values)
    if array.dtype.kind in "iub":
        return array.astype(np.int64)
    if array.dtype.kind == "f":
        return array.astype(np.float64)
    return np.array([str(v) for v in values], dtype=object)


def write_run_table(path: str, run_id: str, table: str, columns: dict, units: dict[str, str],
                    conventions: dict[str, str] | None = None, attrs: dict | None = None) -> None:
    """Adds (or replaces) table `table` under /runs/<run_id> in the layout of SCHEMA.md: one 1-D dataset per
    column with a `units` attribute (and `convention` where given), int64 / float64 / UTF-8 strings, and a
    `rows` attribute. Only that table changes: the run's measured tables and attributes are not touched."""
    lengths = {len(v) for v in columns.values()}
    if len(lengths) > 1:
        raise ValueError(f"columns of {table} differ in length: {sorted(lengths)}")
    with open_for_writing(path) as f:  # the reader's checks, then another writer waited for
        run = f["runs"][run_id]
        if table in run:
            del run[table]
        group = run.create_group(table)
        group.attrs["rows"] = np.int64(lengths.pop() if lengths else 0)
        for key, value in (attrs or {}).items():
            group.attrs[key] = np.int64(value) if isinstance(value, (int, np.integer)) and not isinstance(value, bool) \
                else value
        for name, values in columns.items():
            data = _as_column(values)
            dtype = h5py.string_dtype("utf-8") if data.dtype == object else data.dtype
            ds = group.create_dataset(name, data=data, dtype=dtype)
            ds.attrs["units"] = units.get(name, "")
            if conventions and name in conventions:
                ds.attrs["convention"] = conventions[name]


def _values_equal(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.kind == "f":
        return bool(np.array_equal(a, b, equal_nan=True))
    if a.dtype.kind == "O":
        return all(_text(x) == _text(y) for x, y in zip(a.ravel(), b.ravel()))
    return bool(np.array_equal(a, b))


def groups_equal(a: h5py.Group, b: h5py.Group) -> bool:
    """True when two HDF5 groups hold the same attributes, datasets (type, shape, values) and subgroups."""
    if set(a.attrs.keys()) != set(b.attrs.keys()):
        return False
    if not all(_values_equal(a.attrs[k], b.attrs[k]) for k in a.attrs.keys()):
        return False
    if set(a.keys()) != set(b.keys()):
        return False
    for name in a.keys():
        x, y = a[name], b[name]
        if isinstance(x, h5py.Group) != isinstance(y, h5py.Group):
            return False
        if isinstance(x, h5py.Group):
            if not groups_equal(x, y):
                return False
        else:
            if set(x.attrs.keys()) != set(y.attrs.keys()):
                return False
            if not all(_values_equal(x.attrs[k], y.attrs[k]) for k in x.attrs.keys()):
                return False
            if x.dtype != y.dtype or x.shape != y.shape or not _values_equal(x[()], y[()]):
                return False
    return True
