"""strata-merge OUT IN... : combine Strata results files (e.g. one per Slurm job) into one.

Every run group of every input is copied whole (attributes, env, every table, anything a newer minor
version added) into OUT. OUT is created with the root attributes of the schema, or, when it exists, must be
a Strata file and gets the runs appended. A run id already present with the same content is skipped with a
note; the same id with different content is an error. Inputs are never modified, and OUT is replaced
atomically: on any error it is left as it was. OUT is held for writing while it is merged into: a merge waits
for another program writing it (STRATA_LOCK_WAIT seconds, default 30), and others wait for the merge. Exit
status: 0 merged, 2 bad input (not a Strata file, a damaged one, a newer major schema, a clashing run id, OUT
among the inputs, OUT in use by another writer).
"""
from __future__ import annotations

import argparse
import datetime
import errno
import os
import shutil
import sys
import tempfile

import h5py  # noqa: E402
import numpy as np  # noqa: E402

from strata_analysis import results as sr  # noqa: E402

PROG = "strata-merge"


class MergeError(Exception):
    """Bad input: reported with a clear message and exit status 2."""


def say(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr)


def check_version(path: str) -> tuple[int, int]:
    major, minor = sr.schema_version(path)  # raises for non-Strata files and newer majors
    if major != sr.SCHEMA_MAJOR:
        raise MergeError(f"{path} uses Strata results schema {major}.{minor}; this merge writes {sr.SCHEMA_MAJOR}.x "
                         f"files and cannot mix major versions")
    return major, minor


def plan(out: str, inputs: list[str]) -> tuple[list[tuple[str, str]], list[str], int]:
    """Checks everything before anything is written. Returns the (input, run id) pairs to copy, notes about
    skipped duplicates, and the minor schema version OUT must declare."""
    minors = []
    for path in inputs:
        minors.append(check_version(path)[1])
    seen = {}  # run id -> (file, ) where its content lives
    if os.path.exists(out):
        minors.append(check_version(out)[1])
        for run_id in sr.run_ids(out):
            seen[run_id] = out
    copies, notes = [], []
    for path in inputs:
        for run_id in sr.run_ids(path):
            if run_id in seen:
                with sr.open_file(seen[run_id]) as a, sr.open_file(path) as b:
                    identical = sr.groups_equal(a["runs"][run_id], b["runs"][run_id])
                if not identical:
                    raise MergeError(f"run {run_id} is in both {seen[run_id]} and {path} with different content; "
                                     f"refusing to choose one")
                notes.append(f"{path}: run {run_id} is already in {'OUT' if seen[run_id] == out else seen[run_id]} "
                             f"with the same content; skipped")
                continue
            seen[run_id] = path
            copies.append((path, run_id))
    return copies, notes, max(minors) if minors else 0


def new_file_attrs(handle: h5py.File, minor: int) -> None:
    handle.attrs["schema"] = sr.SCHEMA_NAME
    handle.attrs["schema_version_major"] = np.int64(sr.SCHEMA_MAJOR)
    handle.attrs["schema_version_minor"] = np.int64(minor)
    handle.attrs["created_utc"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def merge(out: str, inputs: list[str]) -> int:
    sr.check_outputs([("IN", path) for path in inputs], appended=[("OUT", out)])
    folder = os.path.dirname(os.path.abspath(out))
    sr.check_folder_writable("OUT", folder)
    existed = os.path.exists(out)
    # OUT open for writing from before it is read to after it is replaced: another writer waits meanwhile, and
    # this merge waits for one that is writing OUT now.
    held = sr.open_for_writing(out, lambda seconds: say(f"{sr.in_use_message(out)}; waiting up to {seconds:.0f} s "
                                                         f"for it to finish")) if existed else None
    try:
        return merge_held(out, inputs, folder, existed)
    finally:
        if held is not None:
            held.close()


def merge_held(out: str, inputs: list[str], folder: str, existed: bool) -> int:
    copies, notes, minor = plan(out, inputs)
    # Write a temporary file beside OUT and rename it over OUT at the end, so a failure never leaves a
    # half-merged OUT and readers never see one.
    fd, temp = tempfile.mkstemp(prefix=".strata-merge-", suffix=".h5", dir=folder)
    os.close(fd)
    try:
        if existed:
            shutil.copy2(out, temp)
            handle = h5py.File(temp, "r+", libver=("earliest", "v110"))
            if int(handle.attrs["schema_version_minor"]) < minor:
                handle.attrs["schema_version_minor"] = np.int64(minor)
        else:
            handle = h5py.File(temp, "w", libver=("earliest", "v110"))
            new_file_attrs(handle, minor)
        with handle:
            runs = handle.require_group("runs")
            for path, run_id in copies:
                with h5py.File(path, "r") as source:
                    source.copy(source["runs"][run_id], runs, name=run_id)
                    if not sr.groups_equal(source["runs"][run_id], runs[run_id]):
                        raise MergeError(f"run {run_id} from {path} did not copy intact")
        if existed:
            shutil.copymode(out, temp)
            os.replace(temp, out)
        else:
            os.chmod(temp, 0o666 & ~_umask())
            publish_new(temp, out)
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise
    for note in notes:
        say(f"note: {note}")
    per_file = {}
    for path, _ in copies:
        per_file[path] = per_file.get(path, 0) + 1
    for path in inputs:
        say(f"{path}: {per_file.get(path, 0)} run(s) copied")
    say(f"{out}: {len(sr.run_ids(out))} run(s) in all")
    return 0


def publish_new(temp: str, out: str) -> None:
    """Moves the merged file to OUT, which did not exist, without replacing one another writer created meanwhile."""
    try:
        os.link(temp, out)
    except FileExistsError:
        raise MergeError(f"{out} was created by another writer while merging; nothing was written to it: run the "
                         f"merge again to append to it") from None
    except OSError as error:
        if error.errno not in (errno.EPERM, errno.ENOTSUP, errno.EXDEV, errno.EOPNOTSUPP):
            raise
        os.replace(temp, out)  # a file system without hard links
        return
    os.unlink(temp)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                     epilog="Exit status: 0 merged, 2 bad input.")
    parser.add_argument("out", metavar="OUT", help="results file to create, or an existing Strata file to append to")
    parser.add_argument("inputs", metavar="IN", nargs="+", help="Strata results files to copy runs from")
    args = parser.parse_args(argv)
    try:
        if not args.out:
            raise MergeError("OUT is an empty name: give the results file to create or append to")
        if os.path.exists(args.out) and not os.path.isfile(args.out):
            raise MergeError(f"{args.out} exists and is not a file")
        return merge(args.out, args.inputs)
    except (sr.StrataFileError, MergeError) as error:
        say(f"error: {error}")
        return 2


def console_main() -> int:
    """The `strata-merge` command (the package's entry point and scripts/strata-merge)."""
    return sr.run_script(PROG, main, sys.argv[1:])


if __name__ == "__main__":
    sys.exit(console_main())
