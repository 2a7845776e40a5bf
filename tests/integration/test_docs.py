"""The README is a guide and the documentation holds together: every relative link of README.md and docs/ (and of
the pages they link to inside the repository) names a file or folder that exists, every anchor names a heading of
its page, every source path the pages name in backticks exists, and the README stays short."""
from __future__ import annotations

import glob
import os
import re

from conftest import ROOT

README_MAX_LINES = 320

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")
INLINE_CODE = re.compile(r"`[^`\n]*`")
# A path into the source tree, as the pages write it: `train/schedule.h`, `collectives/algorithms.{h,cpp}`,
# `bench/project/system_json` (a module: any file of that stem), `project/systems/*.json`, `scripts/slurm/`.
TOP_FOLDERS = ("bench", "collectives", "docs", "kernels", "packaging", "project", "python", "results", "scripts",
               "tests", "train")
SOURCE_PATH = re.compile(r"^(?:%s)/[\w./*{},-]*$" % "|".join(TOP_FOLDERS))
WRITTEN_BY_RUNS = ("results/runs",)  # what the programs write: named in the pages, absent from a checkout


def pages() -> list[str]:
    found = [os.path.join(ROOT, "README.md")]
    found += sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))
    return found


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.split("\n"):
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: str) -> set[str]:
    with open(path, encoding="utf-8") as f:
        headings = [line.lstrip("#") for line in prose_lines(f.read()) if re.match(r"^#{1,6} ", line)]
    seen: dict[str, int] = {}
    result = set()
    for heading in headings:
        base = slug(heading)
        count = seen.get(base, 0)
        result.add(base if count == 0 else f"{base}-{count}")
        seen[base] = count + 1
    return result


def link_problems(page: str, text: str) -> list[str]:
    problems = []
    where = os.path.relpath(page, ROOT)
    for line in prose_lines(text):
        for target in LINK.findall(INLINE_CODE.sub("", line)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            if not path:
                if anchor and anchor not in anchors(page):
                    problems.append(f"{where}: {target}: no heading '{anchor}' on this page")
                continue
            resolved = os.path.normpath(os.path.join(os.path.dirname(page), path))
            if not resolved.startswith(ROOT + os.sep) and resolved != ROOT:
                problems.append(f"{where}: {target} leaves the repository")
            elif not os.path.exists(resolved):
                problems.append(f"{where}: {target} does not exist")
            elif anchor and resolved.endswith(".md") and anchor not in anchors(resolved):
                problems.append(f"{where}: {target}: no heading '{anchor}' in {os.path.relpath(resolved, ROOT)}")
    return problems


def expand(path: str) -> list[str]:
    """`a/b.{h,cpp}` -> [`a/b.h`, `a/b.cpp`]."""
    match = re.search(r"\{([^}]*)\}", path)
    if not match:
        return [path]
    return [p for choice in match.group(1).split(",")
            for p in expand(path[:match.start()] + choice + path[match.end():])]


def source_path_exists(path: str) -> bool:
    for candidate in expand(path.rstrip(".,;:")):
        full = os.path.join(ROOT, candidate)
        if "*" in candidate:
            ok = bool(glob.glob(full))
        else:
            # A module named without its extension (`bench/project/system_json`) is any file of that stem.
            ok = os.path.exists(full) or bool(glob.glob(full + ".*"))
        if not ok:
            return False
    return True


def source_path_problems(page: str, text: str) -> list[str]:
    problems = []
    where = os.path.relpath(page, ROOT)
    for line in prose_lines(text):
        for code in INLINE_CODE.findall(line):
            path = code.strip("`")
            if SOURCE_PATH.match(path) and not path.startswith(WRITTEN_BY_RUNS) and not source_path_exists(path):
                problems.append(f"{where}: `{path}` does not exist")
    return problems


def test_every_relative_link_resolves():
    problems = []
    for page in pages():
        with open(page, encoding="utf-8") as f:
            problems += link_problems(page, f.read())
    assert not problems, "\n".join(problems)


def test_every_source_path_named_exists():
    problems = []
    for page in pages():
        with open(page, encoding="utf-8") as f:
            problems += source_path_problems(page, f.read())
    assert not problems, "\n".join(problems)


def test_the_readme_is_a_guide():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        lines = f.read().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; the reference belongs in docs/"


def test_the_checks_catch_what_they_are_for():
    page = os.path.join(ROOT, "docs", "page.md")
    assert link_problems(page, "[x](missing-page.md)")
    assert link_problems(page, "[x](layout.md#no-such-heading)")
    assert link_problems(page, "[x](../../outside.md)")
    assert not link_problems(page, "[x](layout.md) [y](https://example.org/a.md) [z](#) `[w](nowhere.md)`")
    assert not link_problems(page, "```\n[x](missing-page.md)\n```")
    assert link_problems(page, "[x](design/training.md#adding-a-schedule-typo)")
    assert not link_problems(page, "[x](design/training.md#adding-a-schedule)")
    assert source_path_problems(page, "`train/no_such_file.h`")
    assert source_path_problems(page, "`collectives/algorithms.{h,nope}`")
    assert not source_path_problems(page, "`collectives/algorithms.{h,cpp}` `bench/project/system_json` `project/systems/*.json`")
    assert not source_path_problems(page, "`results/runs/suite-<UTC time>.h5`")
    assert slug("`strata-gemm`: matrix multiplication") == "strata-gemm-matrix-multiplication"
    assert slug("Predicting a step: `strata-project predict`") == "predicting-a-step-strata-project-predict"


def test_the_code_cites_only_documents_the_repository_holds():
    """A comment citing a document by file name (`docs/metrics.md`, `project/SYSTEM.md`) names one that is here, so a
    reader of the code can follow it."""
    cited = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w.-]+\.md)\b")
    problems = []
    for pattern in ("bench/**/*.[ch]*", "kernels/**/*.[ch]*", "collectives/**/*.[ch]*", "train/**/*.[ch]*",
                    "project/**/*.[ch]*", "results/**/*.[ch]*", "tests/unit/*.cpp", "tests/gpu/*.cpp"):
        for path in glob.glob(os.path.join(ROOT, pattern), recursive=True):
            for number, line in enumerate(open(path, encoding="utf-8", errors="replace"), 1):
                for name in cited.findall(line):
                    if not (os.path.exists(os.path.join(ROOT, name)) or
                            os.path.exists(os.path.join(os.path.dirname(path), name))):
                        problems.append(f"{os.path.relpath(path, ROOT)}:{number}: {name}")
    assert not problems, "cited documents that are not in the repository:\n" + "\n".join(problems)
