"""tests/mutants.json applies to the sources as they are: every entry's original occurs once in its file and every
test it names exists, so `scripts/mutants` runs instead of stopping at an entry the code moved away from."""
from __future__ import annotations

import fnmatch
import importlib.machinery
import json
import os
import subprocess
import sys
import types

from conftest import BUILD, ROOT

MUTANTS = os.path.join(ROOT, "scripts", "mutants")
LIST = os.path.join(ROOT, "tests", "mutants.json")


def check(list_file: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, MUTANTS, "--check", "--list-file", list_file], capture_output=True,
                          text=True, timeout=60)


def test_every_mutant_applies_to_the_sources():
    result = check(LIST)
    assert result.returncode == 0, result.stderr


def test_a_mutant_whose_code_moved_is_named_and_refused(tmp_path):
    with open(LIST) as handle:
        mutants = json.load(handle)
    stale = dict(mutants[0], id="moved-away", original=mutants[0]["original"] + " /* no longer here */")
    path = tmp_path / "mutants.json"
    path.write_text(json.dumps([mutants[1], stale]))
    result = check(str(path))
    assert result.returncode == 2
    assert "moved-away: the original occurs 0 times in " + stale["file"] in result.stderr
    assert mutants[1]["id"] not in result.stderr


def test_every_named_unit_test_filter_selects_a_test():
    listing = subprocess.run([os.path.join(BUILD, "strata-unit-tests"), "--gtest_list_tests"], capture_output=True,
                             text=True, check=True, timeout=60).stdout
    names, suite = [], ""
    for line in listing.splitlines():
        if not line.startswith(" "):
            suite = line.split()[0]
        else:
            names.append(suite + line.split()[0])
    with open(LIST) as handle:
        mutants = json.load(handle)
    for m in mutants:
        for test in m["tests"]:
            kind, _, arg = test.partition(":")
            binary, _, patterns = arg.partition(":")
            if kind != "gtest" or binary != "strata-unit-tests":
                continue
            for pattern in patterns.split("-")[0].split(":"):
                assert any(fnmatch.fnmatchcase(name, pattern) for name in names), \
                    f"{m['id']}: the filter {pattern} selects no unit test"


def test_a_changed_source_is_newer_in_the_scratch_tree_than_what_was_built_from_it(tmp_path, monkeypatch):
    # The scratch build is incremental: a file whose content changed must come out newer than the objects built from
    # its old content, even when its own mtime is older than they are; an unchanged file keeps its mtime.
    loader = importlib.machinery.SourceFileLoader("mutants_script", MUTANTS)
    script = types.ModuleType(loader.name)
    script.__file__ = MUTANTS
    loader.exec_module(script)
    source, tree = tmp_path / "source", tmp_path / "tree"
    source.mkdir(), tree.mkdir()
    for name, old, new in (("changed.cpp", "old", "new"), ("same.cpp", "same", "same")):
        (source / name).write_text(new)
        (tree / name).write_text(old)
        os.utime(source / name, (1000, 1000))
        os.utime(tree / name, (500, 500))
    built = 2000  # an object built from the old content after the source was edited
    monkeypatch.setattr(script, "ROOT", str(source))
    monkeypatch.setattr(script, "tracked_files", lambda: ["changed.cpp", "same.cpp"])
    script.sync_tree(str(tree))
    assert (tree / "changed.cpp").read_text() == "new"
    assert os.stat(tree / "changed.cpp").st_mtime > built
    assert os.stat(tree / "same.cpp").st_mtime == 500
