"""The reference pages keep up with the programs: every long option a registered program's --help lists (each
strata-project subcommand's included, aliases too) is named on the program's page in docs/reference/ or, for the
options every program shares, in harness.md."""
from __future__ import annotations

import os
import re

import pytest

from conftest import BUILD, ROOT, registry, run_single

REFERENCE = os.path.join(ROOT, "docs", "reference")
SHARED_PAGE = "harness.md"
BENCHMARK_PAGE = "benchmark-programs.md"
# An option line of --help: two spaces, then the option column (`-w,--warmup,--warmup_iters N=5`).
OPTION_LINE = re.compile(r"^ {2}(-\S+)")
COMMAND_LINE = re.compile(r"^ {2}([a-z][\w-]*) ")


def page_of(name: str, report: str) -> str:
    if report == "-" and name.startswith("strata-bench-"):
        return BENCHMARK_PAGE
    return f"{name}.md"


def read_page(page: str) -> str:
    with open(os.path.join(REFERENCE, page), encoding="utf-8") as f:
        return f.read()


def help_text(args: list[str]) -> str:
    result = run_single(args + ["--help"], cwd=ROOT, timeout=60)
    assert result.returncode == 0, f"{' '.join(args)} --help exited {result.returncode}: {result.stderr}"
    return result.stdout


def long_options(text: str) -> list[str]:
    """Every long option of a --help text's option column, aliases included."""
    options = []
    for line in text.split("\n"):
        match = OPTION_LINE.match(line)
        if match:
            options += [name for name in match.group(1).split(",") if name.startswith("--")]
    return options


def subcommands(text: str) -> list[str]:
    """The commands a `PROGRAM COMMAND [options]` program lists under `commands:`."""
    lines = text.split("\n")
    if "commands:" not in lines:
        return []
    found = []
    for line in lines[lines.index("commands:") + 1:]:
        match = COMMAND_LINE.match(line)
        if not match:
            break
        found.append(match.group(1))
    return found


def named(option: str, text: str) -> bool:
    return re.search(r"(?<![\w-])%s(?![\w-])" % re.escape(option), text) is not None


def missing_options(label: str, options: list[str], page: str) -> list[str]:
    texts = read_page(page) + "\n" + read_page(SHARED_PAGE)
    return [f"{label}: {option} is on neither docs/reference/{page} nor docs/reference/{SHARED_PAGE}"
            for option in options if not named(option, texts)]


@pytest.mark.parametrize("fields", registry(), ids=lambda fields: fields[0])
def test_every_option_of_the_help_is_on_the_reference_page(fields):
    name, _, report, _ = fields
    path = os.path.join(BUILD, name)
    if not os.access(path, os.X_OK):
        pytest.skip(f"{name} is not built")
    page = page_of(name, report)
    assert os.path.isfile(os.path.join(REFERENCE, page)), f"{name}: no reference page docs/reference/{page}"
    text = help_text([path])
    commands = subcommands(text)
    problems = missing_options(name, long_options(text), page)
    for command in commands:
        options = long_options(help_text([path, command]))
        assert options, f"{name} {command}: no options found in its --help"
        problems += missing_options(f"{name} {command}", options, page)
    if not commands:
        assert long_options(text), f"{name}: no options found in its --help"
    assert not problems, "\n".join(problems)
