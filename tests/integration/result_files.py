"""What the tests of data loss, damaged files, two writers and half-done runs share: small results files written by
the programs, the scripts run as users run them, a reader that walks a file as h5py users do, damage inside a file,
and a process that holds a file open for writing."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import h5py

from conftest import SCRIPTS, mpirun, program

# Metadata structures of an HDF5 file, by signature: group and chunk indexes (TREE, BTHD, BTLF, BTIN), symbol tables
# (SNOD), local and fractal heaps (HEAP, FRHP, FHDB, FHIB), variable-length strings' global heap (GCOL), object headers
# (OHDR, OCHK).
SIGNATURES = (b"TREE", b"SNOD", b"HEAP", b"GCOL", b"FRHP", b"FHDB", b"FHIB", b"BTHD", b"BTLF", b"BTIN", b"OHDR",
              b"OCHK")


def gemm_file(path, cwd, shapes="16x16x16"):
    """A results file with one strata-gemm run, written under mpirun with 2 ranks."""
    result = mpirun(2, [program("strata-gemm"), "--shapes", shapes, "-n", "1", "-w", "0", "-q", "--output", str(path)],
                    cwd=str(cwd), timeout=120)
    assert result.returncode == 0, result.stderr
    return path


def script(name, args, cwd, env=None, timeout=120):
    return subprocess.run([sys.executable, os.path.join(SCRIPTS, name), *map(str, args)], cwd=str(cwd),
                          capture_output=True, text=True, timeout=timeout, env=env)


def one_error_line(result, prog, path):
    """A script's refusal: exit 2, one line `<prog>: error: <file>: ...` naming the file, no traceback."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in lines if line.startswith(f"{prog}: error: ")]
    assert len(errors) == 1, result.stderr
    assert str(path) in errors[0], result.stderr
    return errors[0]


def walk_failure(path) -> str | None:
    """None when h5py opens the file and reads every link, attribute and dataset of it; else what failed."""
    try:
        with h5py.File(path, "r") as f:
            for key in f.attrs:
                f.attrs[key]

            def visit(_name, obj):
                for key in obj.attrs:
                    obj.attrs[key]
                if isinstance(obj, h5py.Dataset) and obj.shape:
                    obj[()]

            f.visititems(visit)
    except Exception as error:  # noqa: BLE001 - any failure of HDF5 on the file
        return f"{type(error).__name__}: {error}"
    return None


def structures(data: bytes):
    """(offset, signature) of every metadata structure, in file order."""
    found = []
    for signature in SIGNATURES:
        at = data.find(signature)
        while at >= 0:
            found.append((at, signature.decode()))
            at = data.find(signature, at + 1)
    return sorted(found)


def damage_inside(source, target, kinds=None):
    """Writes `target`: `source` with the bytes of one metadata structure in its second half flipped (not truncated:
    HDF5 still opens it), the first such structure whose damage h5py notices when it walks the file. Returns the
    signature damaged."""
    data = source.read_bytes()
    for at, signature in structures(data):
        if at < len(data) // 2 or (kinds and signature not in kinds):
            continue
        damaged = bytearray(data)
        for i in range(at, at + 8):
            damaged[i] ^= 0xFF
        target.write_bytes(bytes(damaged))
        try:
            h5py.File(target, "r").close()
        except OSError:
            continue
        if walk_failure(target):
            return signature
    raise AssertionError(f"no structure of {kinds or 'any kind'} past the middle of {source} whose damage h5py notices")


class Holder:
    """Another program holding a results file open for writing (h5py, as a user's script would), for `seconds` or
    until stopped; it closes the file properly either way, as HDF5 marks a file open for writing inside it."""

    def __init__(self, path, seconds=120.0):
        code = ("import select, sys, h5py\n"
                "f = h5py.File(sys.argv[1], 'r+')\n"
                "print('holding', flush=True)\n"
                "select.select([sys.stdin], [], [], float(sys.argv[2]))\n"
                "f.close()\n")
        self.process = subprocess.Popen([sys.executable, "-c", code, str(path), str(seconds)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)
        assert self.process.stdout.readline().strip() == "holding"

    def stop(self):
        if self.process.poll() is None:
            self.process.stdin.close()  # ends the wait: the file is closed and the lock released
        assert self.process.wait(timeout=30) == 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def wait_for_progress(process, count, limit=120.0):
    """Reads a program's progress lines on stderr until `count` cases are reported done; returns the lines read. A
    count above one needs the program run with `--progress-interval 0` (a line per case)."""
    deadline = time.monotonic() + limit
    lines, done = [], 0
    while done < count and time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line:
            break
        lines.append(line)
        done += "done;" in line
    assert done >= count, "".join(lines)
    return lines
