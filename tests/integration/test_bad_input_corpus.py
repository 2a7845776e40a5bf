"""A corpus of bad inputs, generated per program and flag from each program's own --help: every value a flag
cannot take (not a number, a fraction for a count, a number out of range, an empty value, an unknown choice, a
switch given a non-boolean) must be refused with exit code 2, a message naming the flag, and the results file
given with --output left byte-for-byte as it was. Beside them, bad input files: missing, a folder, empty, not
HDF5, and the inputs' own paths as outputs."""
from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from conftest import BUILD, ROOT, digest, mpi_env, program

SYSTEM = os.path.join(ROOT, "project", "systems", "a100-80gb-sxm-hdr200.json")

# Each program with arguments that make it a quick, valid run; the corpus changes one flag at a time.
PROGRAMS = {
    "strata-gemm": ["--shapes", "8x8x8", "-n", "1", "-w", "0"],
    "strata-attention": ["-s", "16", "-D", "8", "-H", "1", "-n", "1", "-w", "0"],
    "strata-collective": ["-b", "8", "-e", "8", "-n", "1", "-w", "0"],
    "strata-step": ["--model", "tiny", "--seq", "16", "-n", "1", "-w", "0"],
    "strata-elementwise": ["--preset", "tiny", "-n", "1", "-w", "0"],
    "strata-interference": ["--gemm", "8x8x8", "-s", "16", "-D", "8", "-H", "1", "-n", "1", "-w", "0"],
    "strata-project predict": ["--system", SYSTEM, "--model", "tiny", "-q"],
    "strata-project search": ["--system", SYSTEM, "--model", "gpt2-124m", "--gpus", "8", "--top", "1", "-q"],
    "strata-project speed": ["--smoke"],
}
# Flags whose value no generated value can make wrong, or that end the program before it runs.
SKIPPED = {"help", "list-presets", "bench"}

BAD_VALUES = {
    "N": ["abc", "1.5", "", "99999999999999999999"],
    "X": ["abc", "", "nan", "1e999"],
    "TEXT": [""],
}

OPTION = re.compile(r"^\s+(?:-(\w),)?--([\w-]+)((?:,--[\w-]+)*)(?:\s+(\S+))?\s{2,}")


def options_of(name: str) -> list[tuple[str, list[str], str]]:
    """(long name, every name, value type) for each option the program's --help lists."""
    exe, *sub = name.split()
    result = subprocess.run([program(exe), *sub, "--help"], capture_output=True, text=True, env=mpi_env(), timeout=60)
    assert result.returncode == 0, result.stderr
    options = []
    for line in result.stdout.splitlines():
        match = OPTION.match(line)
        if not match:
            continue
        short, long, aliases, kind = match.groups()
        names = ["--" + long] + [a for a in aliases.split(",") if a] + (["-" + short] if short else [])
        kind = kind or ""
        # A choice whose default is empty ("--grid-dim tp|pp|dp", no "=") takes an empty value too.
        if "|" in kind and "=" not in kind:
            kind = "|" + kind
        options.append((long, names, kind.split("=")[0]))
    return options


def corpus() -> list[tuple[str, str, list[str], str]]:
    """(program, flag, the arguments that give it its bad value, the value) for every flag and bad value."""
    cases = []
    for name in PROGRAMS:
        for long, names, kind in options_of(name):
            if long in SKIPPED:
                continue
            if kind == "":  # a switch
                values = ["maybe"]
                make = lambda v, long=long: [f"--{long}={v}"]  # noqa: E731
            elif kind in BAD_VALUES:
                values = BAD_VALUES[kind]
                make = lambda v, long=long: [f"--{long}", v]  # noqa: E731
            elif "|" in kind:  # choices, of which "" may be one
                values = [v for v in ("", "bogus") if v not in kind.split("|")]
                make = lambda v, long=long: [f"--{long}", v]  # noqa: E731
            else:
                continue
            for value in values:
                cases.append((name, long, make(value), value))
    return cases


CORPUS = corpus() if os.path.exists(os.path.join(BUILD, "strata-gemm")) else []


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """A valid results file with one run, and a machine description cached for every program of the corpus."""
    folder = tmp_path_factory.mktemp("corpus")
    env = {**mpi_env(), "STRATA_CACHE_DIR": str(folder / "cache")}
    env.pop("OPENBLAS_CORETYPE", None)
    results = folder / "reference.h5"
    made = subprocess.run([program("strata-gemm"), "--shapes", "8x8x8", "-n", "1", "-w", "0", "-q", "--output",
                           str(results)], capture_output=True, text=True, env=env, cwd=str(folder), timeout=120)
    assert made.returncode == 0, made.stderr
    return folder, results, env


def test_the_corpus_is_large_and_covers_every_program():
    assert len(CORPUS) >= 300, len(CORPUS)
    assert {c[0] for c in CORPUS} == set(PROGRAMS)


def run_refused(reference, name: str, args: list[str]) -> subprocess.CompletedProcess:
    folder, results, env = reference
    exe, *sub = name.split()
    target = folder / "target.h5"
    shutil.copyfile(results, target)
    before = digest(str(target))
    has_output = any(n == "--output" for _, names, _ in options_of_cached(name) for n in names)
    command = [program(exe), *sub, *PROGRAMS[name], *args, *(["--output", str(target)] if has_output else [])]
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=str(folder), timeout=300)
    assert digest(str(target)) == before, f"{name} {args}: the results file changed"
    return result


_OPTIONS: dict[str, list] = {}


def options_of_cached(name: str):
    if name not in _OPTIONS:
        _OPTIONS[name] = options_of(name)
    return _OPTIONS[name]


@pytest.mark.parametrize("name, flag, args, value", CORPUS,
                         ids=[f"{c[0].replace(' ', '-')}--{c[1]}={c[3] or 'empty'}" for c in CORPUS])
def test_a_bad_value_is_refused_naming_its_flag(reference, name, flag, args, value):
    result = run_refused(reference, name, args)
    assert result.returncode == 2, f"{name} {args}: exit {result.returncode}\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
    names = next(names for long, names, _ in options_of_cached(name) if long == flag)
    assert any(n in result.stderr for n in names), f"{name} {args}: the message names no {names}: {result.stderr[-1000:]}"
    assert "Traceback" not in result.stderr and "MPI_ABORT" not in result.stderr


def bad_files(folder) -> dict[str, str]:
    (folder / "empty.h5").write_bytes(b"")
    (folder / "text.h5").write_text("not a results file\n")
    (folder / "a-folder.h5").mkdir(exist_ok=True)
    return {"missing": str(folder / "missing.h5"), "empty": str(folder / "empty.h5"), "text": str(folder / "text.h5"),
            "folder": str(folder / "a-folder.h5")}


@pytest.mark.parametrize("kind", ["missing", "empty", "text", "folder"])
@pytest.mark.parametrize("command", ["calibrate", "validate"])
def test_a_bad_input_file_is_refused_naming_it(reference, command, kind):
    folder, _, env = reference
    path = bad_files(folder)[kind]
    extra = ["-o", str(folder / "system.json")] if command == "calibrate" else ["--system", SYSTEM]
    result = subprocess.run([program("strata-project"), command, path, *extra], capture_output=True, text=True,
                            env=env, cwd=str(folder), timeout=120)
    assert result.returncode == 2, (result.stdout[-1000:], result.stderr[-1000:])
    assert path in result.stderr or os.path.basename(path) in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and "MPI_ABORT" not in result.stderr


@pytest.mark.parametrize("kind", ["empty", "text", "folder"])
@pytest.mark.parametrize("name", ["strata-gemm", "strata-step", "strata-project predict"])
def test_an_output_that_is_not_a_results_file_is_refused(reference, name, kind):
    folder, _, env = reference
    path = bad_files(folder)[kind]
    before = digest(path) if os.path.isfile(path) else None
    exe, *sub = name.split()
    result = subprocess.run([program(exe), *sub, *PROGRAMS[name], "--output", path], capture_output=True, text=True,
                            env=env, cwd=str(folder), timeout=120)
    assert result.returncode == 2, (result.stdout[-1000:], result.stderr[-1000:])
    assert path in result.stderr or os.path.basename(path) in result.stderr, result.stderr
    if before is not None:
        assert digest(path) == before


def system_with(folder, name: str, text: str) -> str:
    path = folder / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("command", ["predict", "search"])
def test_a_bad_system_description_names_the_file_and_the_field(reference, command):
    folder, _, env = reference
    with open(SYSTEM) as handle:
        text = handle.read()
    # A number beyond what a double holds, in the first numeric field of the shipped description.
    field, number = re.search(r'"(\w+)":\s*(\d+(?:\.\d+)?(?:e\d+)?)', text).groups()
    overflow = system_with(folder, "overflow.json", text.replace(f'"{field}": {number}', f'"{field}": 1e999', 1))
    broken = system_with(folder, "broken.json", text[: len(text) // 2])
    # The same field twice in its object: JSON parsers keep one of the two without a word.
    twice = system_with(folder, "twice.json", text.replace(f'"{field}": {number}',
                                                           f'"{field}": {number}, "{field}": {number}', 1))
    args = PROGRAMS[f"strata-project {command}"]
    for path, expected in ((overflow, field), (broken, "not JSON"), (twice, f"{field} appears twice in its object"),
                           (str(folder), "is a directory"), (str(folder / "none.json"), "none.json")):
        at = args.index("--system") + 1
        result = subprocess.run([program("strata-project"), command, *args[:at], path, *args[at + 1:]],
                                capture_output=True, text=True, env=env, cwd=str(folder), timeout=120)
        assert result.returncode == 2, (path, result.stderr)
        assert os.path.basename(path) in result.stderr and expected in result.stderr, (path, result.stderr)


SCRIPT_CASES = [
    ("strata-compare", ["--threshold", "nan"], "--threshold"),
    ("strata-compare", ["--threshold", "-1"], "--threshold"),
    ("strata-compare", ["--noise-factor", "inf"], "--noise-factor"),
    ("strata-compare", ["--noise-factor", "0.5"], "--noise-factor"),
    ("strata-compare", ["--alpha", "2"], "--alpha"),
    ("strata-compare", ["--min-samples", "0"], "--min-samples"),
    ("strata-compare", ["--threshold", "abc"], "--threshold"),
    ("strata-trace", ["--case", "abc"], "--case"),
    ("strata-compare", ["--bogus"], "--bogus"),
    ("strata-report", ["--bogus"], "--bogus"),
    ("strata-merge", ["--bogus"], "--bogus"),
    ("strata-trace", ["--bogus"], "--bogus"),
]


@pytest.mark.parametrize("script, args, flag", SCRIPT_CASES, ids=[f"{s}{' '.join(a)}" for s, a, _ in SCRIPT_CASES])
def test_the_scripts_refuse_bad_values_naming_the_flag(reference, script, args, flag):
    folder, results, env = reference
    target = folder / "script-target.h5"
    shutil.copyfile(results, target)
    before = digest(str(target))
    files = {"strata-compare": [str(target), str(target)], "strata-merge": [str(folder / "merged.h5"), str(target)]}.get(
        script, [str(target)])
    result = subprocess.run(["python3", os.path.join(ROOT, "scripts", script), *files, *args], capture_output=True,
                            text=True, env=env, cwd=str(folder), timeout=120)
    assert result.returncode == 2, (result.stdout[-1000:], result.stderr[-1000:])
    assert flag in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert digest(str(target)) == before
