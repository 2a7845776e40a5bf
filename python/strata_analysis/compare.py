"""strata-compare BASE NEW | --reference REF.json FILE... : did performance change, or meet its reference?

Two files (BASE NEW): cases are matched by benchmark, node and rank counts and every parameter column of the
`cases` table except `case`. Per matched case it compares the per-iteration time of the slowest rank (the
`rankmax` samples): relative change of the medians, a two-sided Mann-Whitney U p-value on the samples, and a
verdict in the style of asv: a case is `slower` or `faster` only when the ratio of medians lies beyond the
noise factor AND p < alpha. A geometric-mean row summarises all cases. Several runs of one case in a file
(e.g. a merged job array) are pooled. Exit status: 0 no regression, 1 a case is slower by more than
--threshold, 2 bad input (not a Strata file, a newer major schema, cases that do not match).

--reference REF.json FILE...: checks metrics against reference values written as ReFrame writes them,
(value, lower fraction, upper fraction, unit) per system and case, and stores the verdict in each checked
run as the table /runs/<id>/reference_check (an addition; nothing measured is changed). Exit status: 0 all
pass, 1 a check failed, 2 bad input. `strata-compare --help-reference` describes the reference file.
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
import os
import re
import signal
import sys

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from strata_analysis import results as sr  # noqa: E402

PROG = "strata-compare"
# Run attributes that are part of a case's identity: the same GEMM on 2 or on 4 ranks is not the same case.
RUN_KEY_COLUMNS = ("n_nodes", "n_ranks")
MIN_SAMPLES = 9  # below this the U test has little power; asv and compare.py users expect a warning

REFERENCE_HELP = """\
Reference file (JSON), in the spirit of ReFrame's `reference` dictionary:

  {
    "format": "strata-reference", "version": 1,
    "systems": {
      "ci-vm": {
        "hosts": ["vm", "ci-[0-9]+"],
        "references": [
          {"benchmark": "strata-gemm",
           "case": {"backend": "cpu", "dtype": "fp32", "m": 1024, "n": 1024, "k": 1024, "n_ranks": 2},
           "metric": "flop_rate_per_rank",
           "reference": [20.0, -0.10, null, "GFLOP/s"]}
        ]
      },
      "*": {"references": []}
    }
  }

- A system applies to a run when every host of the run fully matches one of its `hosts` regular
  expressions; `--system NAME` picks one by name instead; "*" applies when nothing else does.
- `case` selects cases by equality on any `cases` column or run attribute (n_ranks, n_nodes, ...); keys left
  out match anything, so one entry may check several cases.
- `metric` is a column of the `summary` or `cases` table (e.g. flop_rate_per_rank, time_rankmax_median,
  busbw); `reference` is (value, lower, upper, unit) as in ReFrame: the check passes when
  value * (1 + lower) <= measured <= value * (1 + upper); lower <= 0 <= upper; null means unbounded. The
  unit is the column's SI unit, optionally with a prefix (n u m k M G T P), e.g. GFLOP/s, GB/s, ms.
"""

PREFIXES = {"n": 1e-9, "u": 1e-6, "µ": 1e-6, "m": 1e-3, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}


class InputError(Exception):
    """Bad input: reported with a clear message and exit status 2."""


def say(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr)


# ---- two-file comparison ----------------------------------------------------------------------------------

def _key_value(value):
    """Case parameters as plain Python values, so 64 (int64) from one file equals 64 from another."""
    if isinstance(value, (bytes, np.bytes_)):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value)  # run attributes are strings ("2"); columns are numbers
        except ValueError:
            return value
    return value


def load_cases(path: str, ignore: set[str]) -> tuple[pd.DataFrame, dict[str, list[str]], list[str]]:
    """Cases of every usable run in `path` with their rankmax samples. Returns (frame with one row per
    (run, case): benchmark, parameters, samples), the parameter columns per benchmark, and notes."""
    notes = []
    runs = sr.read_runs(path)
    if runs.empty:
        raise InputError(f"{path} holds no runs")
    cases = sr.read_table(path, "cases")
    samples = sr.read_rankmax_samples(path)
    if cases.empty or samples.empty:
        raise InputError(f"{path} holds no cases with samples")
    failed = set(runs.loc[runs["status"] == "failed", "run_id"])
    if failed:
        notes.append(f"{path}: left out {len(failed)} failed run(s) (wrong results): {', '.join(sorted(failed))}")
        cases = cases[~cases["run_id"].isin(failed)]
    bookkeeping = {"file", "run_id", "case", *sr.RUN_COLUMNS, *("run_" + c for c in sr.RUN_COLUMNS)}
    columns_by_benchmark = {}
    for benchmark, group in cases.groupby("benchmark", sort=False):
        columns = [c for c in group.columns if c not in bookkeeping and c not in ignore and group[c].notna().any()]
        columns_by_benchmark[benchmark] = [c for c in RUN_KEY_COLUMNS if c not in ignore] + columns
    by_case = {k: g["time"].to_numpy() for k, g in samples.groupby(["run_id", "case"], sort=False)}
    rows = []
    for record in cases.to_dict("records"):
        times = by_case.get((record["run_id"], record["case"]))
        if times is None or len(times) == 0:
            continue  # a case whose run was killed before its first timed iteration
        rows.append({**record, "samples": times})
    return pd.DataFrame(rows), columns_by_benchmark, notes


def case_name(key_columns: list[str], key: tuple, label: str | None) -> str:
    parts = dict(zip(key_columns, key))
    ranks = f"{parts.get('n_ranks', '?')}r/{parts.get('n_nodes', '?')}n"
    if label:
        return f"{label} [{ranks}]"
    return " ".join(f"{c}={v}" for c, v in parts.items() if c not in RUN_KEY_COLUMNS) + f" [{ranks}]"


def group_cases(frame: pd.DataFrame, key_columns: dict[str, list[str]]) -> dict:
    """{(benchmark, key): {"samples": pooled array, "runs": n, "label": label}}."""
    out = {}
    for record in frame.to_dict("records"):
        benchmark = record["benchmark"]
        key = tuple(_key_value(record.get(c)) for c in key_columns[benchmark])
        entry = out.setdefault((benchmark, key), {"samples": [], "runs": 0, "label": record.get("label")})
        entry["samples"].append(np.asarray(record["samples"], dtype=float))
        entry["runs"] += 1
    for entry in out.values():
        entry["samples"] = np.concatenate(entry["samples"])
    return out


def mann_whitney_p(a: np.ndarray, b: np.ndarray) -> float:
    from scipy.stats import mannwhitneyu
    if len(a) == 0 or len(b) == 0:
        return float("nan")
    if np.all(a == a[0]) and np.all(b == a[0]):
        return 1.0  # identical constant samples (a coarse clock): no evidence of a change
    return float(mannwhitneyu(a, b, alternative="two-sided").pvalue)


def spread(x: np.ndarray) -> float:
    """Interquartile range over the median: how noisy one side is."""
    median = float(np.median(x))
    if median == 0:
        return float("nan")
    q25, q75 = np.percentile(x, [25, 75])
    return float((q75 - q25) / median)


def compare(args) -> int:
    ignore = set(filter(None, (args.ignore or "").split(",")))
    base, base_cols, notes = load_cases(args.files[0], ignore)
    new, new_cols, more = load_cases(args.files[1], ignore)
    notes += more
    if args.benchmark:
        base = base[base["benchmark"] == args.benchmark]
        new = new[new["benchmark"] == args.benchmark]
        if base.empty or new.empty:
            raise InputError(f"benchmark {args.benchmark} is missing from "
                             f"{args.files[0] if base.empty else args.files[1]}")
    key_columns = {}
    for benchmark in set(base_cols) | set(new_cols):
        a, b = base_cols.get(benchmark, []), new_cols.get(benchmark, [])
        key_columns[benchmark] = [c for c in a if c in b]
        only = sorted(set(a) ^ set(b))
        if only and benchmark in base_cols and benchmark in new_cols:
            notes.append(f"{benchmark}: column(s) {', '.join(only)} exist in one file only and are not matched on")
    base_cases = group_cases(base, key_columns) if not base.empty else {}
    new_cases = group_cases(new, key_columns) if not new.empty else {}
    for side, cases in (("BASE", base_cases), ("NEW", new_cases)):
        pooled = sum(1 for e in cases.values() if e["runs"] > 1)
        if pooled:
            notes.append(f"{side}: {pooled} case(s) appear in several runs; their samples are pooled")
    for note in notes:
        say(f"note: {note}")

    matched = [k for k in base_cases if k in new_cases]
    only_base = [k for k in base_cases if k not in new_cases]
    only_new = [k for k in new_cases if k not in base_cases]
    if only_base or only_new:
        lines = [f"  only in BASE: {b} {case_name(key_columns[b], k, base_cases[(b, k)]['label'])}" for b, k in only_base]
        lines += [f"  only in NEW:  {b} {case_name(key_columns[b], k, new_cases[(b, k)]['label'])}" for b, k in only_new]
        if not args.allow_unmatched:
            say(f"error: {len(only_base) + len(only_new)} case(s) do not match between {args.files[0]} and "
                f"{args.files[1]} (matching on benchmark and {_describe_keys(key_columns)}):\n" + "\n".join(lines) +
                "\n  use --allow-unmatched to compare the matching cases only, or --ignore COLUMN,...")
            return 2
        say("note: unmatched cases (not compared):\n" + "\n".join(lines))
    if not matched:
        say("error: no case of BASE matches a case of NEW")
        return 2

    rows = []
    for benchmark, key in matched:
        b, n = base_cases[(benchmark, key)], new_cases[(benchmark, key)]
        mb, mn = float(np.median(b["samples"])), float(np.median(n["samples"]))
        ratio = mn / mb if mb > 0 else float("nan")
        p = mann_whitney_p(b["samples"], n["samples"])
        significant = p < args.alpha
        if significant and ratio > args.noise_factor:
            verdict = "slower"
        elif significant and ratio < 1 / args.noise_factor:
            verdict = "faster"
        else:
            verdict = "same"
        regression = verdict == "slower" and ratio - 1 > args.threshold
        few = min(len(b["samples"]), len(n["samples"])) < args.min_samples
        rows.append({
            "benchmark": benchmark, "case": case_name(key_columns[benchmark], key, b["label"]),
            "key": dict(zip(key_columns[benchmark], key)),
            "n_base": len(b["samples"]), "n_new": len(n["samples"]),
            "median_base_s": mb, "median_new_s": mn, "ratio": ratio, "change": ratio - 1, "p_value": p,
            "spread_base": spread(b["samples"]), "spread_new": spread(n["samples"]),
            "verdict": verdict, "regression": regression, "few_samples": few,
        })
    ratios = np.array([r["ratio"] for r in rows if r["ratio"] > 0 and math.isfinite(r["ratio"])])
    geomean = float(np.exp(np.mean(np.log(ratios)))) if len(ratios) else float("nan")
    print_comparison(rows, geomean, args)
    few = [r for r in rows if r["few_samples"]]
    if few:
        say(f"warning: {len(few)} case(s) have fewer than {args.min_samples} samples on a side; the Mann-Whitney "
            f"U test has little power there (with 3 per side it cannot reach p < 0.05): run more iterations (-n)")
    regressions = [r for r in rows if r["regression"]]
    if args.json:
        summary = {"base": args.files[0], "new": args.files[1], "alpha": args.alpha, "noise_factor": args.noise_factor,
                   "threshold": args.threshold, "metric": "per-iteration time of the slowest rank (rankmax), s",
                   "cases": rows, "geometric_mean_ratio": geomean, "regressions": len(regressions)}
        with open(args.json, "w") as handle:
            json.dump(summary, handle, indent=1, default=_json_default)
    if regressions:
        say(f"{len(regressions)} case(s) regressed by more than {args.threshold:.0%} "
            f"(p < {args.alpha}, ratio > noise factor {args.noise_factor})")
        return 1
    return 0


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(type(value))


def _describe_keys(key_columns: dict[str, list[str]]) -> str:
    return "; ".join(f"{b}: {', '.join(c)}" for b, c in key_columns.items())


def _time(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "n/a"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.4g} {unit}"
    return f"{seconds / 1e-9:.4g} ns"


def print_table(header: list[str], body: list[list[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(header)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip())
    print("  ".join("-" * w for w in widths))
    for row in body:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())


def print_comparison(rows: list[dict], geomean: float, args) -> None:
    print(f"BASE: {args.files[0]}")
    print(f"NEW:  {args.files[1]}")
    print(f"time: per-iteration time of the slowest rank (rankmax); change: NEW median / BASE median - 1; "
          f"p: two-sided Mann-Whitney U; a change counts when ratio > {args.noise_factor} or < "
          f"1/{args.noise_factor} and p < {args.alpha}; regression: slower by more than {args.threshold:.0%}")
    print()
    body = []
    for r in rows:
        mark = r["verdict"] + (" REGRESSION" if r["regression"] else "") + (" (few samples)" if r["few_samples"] else "")
        body.append([r["benchmark"], r["case"], f"{r['n_base']}/{r['n_new']}", _time(r["median_base_s"]),
                     _time(r["median_new_s"]), f"{r['change']:+.1%}", f"{r['p_value']:.2g}",
                     f"{max(r['spread_base'], r['spread_new']):.1%}", mark])
    slower = sum(r["verdict"] == "slower" for r in rows)
    faster = sum(r["verdict"] == "faster" for r in rows)
    body.append(["geometric mean", f"{len(rows)} cases ({slower} slower, {faster} faster)", "", "", "",
                 f"{geomean - 1:+.1%}" if math.isfinite(geomean) else "n/a", "", "", ""])
    print_table(["benchmark", "case", "samples", "median BASE", "median NEW", "change", "p", "iqr/median",
                 "verdict"], body)


# ---- reference check --------------------------------------------------------------------------------------

def unit_scale(reference_unit: str, column_unit: str) -> float:
    """Factor turning a value in reference_unit into column_unit (an SI unit), e.g. GFLOP/s -> FLOP/s = 1e9."""
    if reference_unit == column_unit:
        return 1.0
    if len(reference_unit) > 1 and reference_unit[1:] == column_unit and reference_unit[0] in PREFIXES:
        return PREFIXES[reference_unit[0]]
    raise InputError(f"unit {reference_unit!r} does not fit the column's unit {column_unit!r}")


def load_reference(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except OSError as error:
        raise InputError(f"cannot read reference file {path}: {error.strerror}") from None
    except json.JSONDecodeError as error:
        raise InputError(f"reference file {path} is not valid JSON: {error}") from None
    except UnicodeDecodeError:
        raise InputError(f"reference file {path} is not a text file (a JSON reference file is needed)") from None
    if not isinstance(data, dict) or data.get("format") != "strata-reference":
        raise InputError(f"{path} is not a Strata reference file (expected \"format\": \"strata-reference\"); "
                         f"see {PROG} --help-reference")
    if int(data.get("version", 0)) != 1:
        raise InputError(f"{path}: reference format version {data.get('version')} is not supported (1 is)")
    systems = data.get("systems")
    if not isinstance(systems, dict) or not systems:
        raise InputError(f"{path}: \"systems\" must be a non-empty object")
    for name, system in systems.items():
        entries = system.get("references", []) if isinstance(system, dict) else None
        if not isinstance(entries, list):
            raise InputError(f"{path}: system {name}: \"references\" must be a list")
        for i, entry in enumerate(entries):
            where = f"{path}: system {name}, reference {i}"
            for field in ("benchmark", "metric", "reference"):
                if field not in entry:
                    raise InputError(f"{where}: missing \"{field}\"")
            ref = entry["reference"]
            if not (isinstance(ref, list) and len(ref) == 4 and isinstance(ref[0], (int, float))
                    and all(x is None or isinstance(x, (int, float)) for x in ref[1:3]) and isinstance(ref[3], str)):
                raise InputError(f"{where}: \"reference\" must be [value, lower, upper, unit], e.g. [20, -0.1, null, "
                                 f"\"GFLOP/s\"]")
            if not all(math.isfinite(x) for x in ref[:3] if isinstance(x, float)):
                raise InputError(f"{where}: \"reference\" must hold finite numbers, got {ref}")
            if (ref[1] is not None and ref[1] > 0) or (ref[2] is not None and ref[2] < 0):
                raise InputError(f"{where}: the lower fraction must be <= 0 and the upper >= 0 (ReFrame's "
                                 f"convention: [value, -0.1, 0.1, unit] allows 10% either way)")
            if not isinstance(entry.get("case", {}), dict):
                raise InputError(f"{where}: \"case\" must be an object of column: value")
        hosts = system.get("hosts", []) if isinstance(system, dict) else []
        if not isinstance(hosts, list) or not all(isinstance(pattern, str) for pattern in hosts):
            raise InputError(f"{path}: system {name}: \"hosts\" must be a list of host name patterns")
        for pattern in hosts:
            try:
                re.compile(pattern)
            except re.error as error:
                raise InputError(f"{path}: system {name}: bad host pattern {pattern!r}: {error}") from None
    return data


def pick_system(data: dict, hosts: list[str], forced: str | None, path: str) -> str:
    systems = data["systems"]
    if forced:
        if forced not in systems:
            raise InputError(f"system {forced!r} is not in {path} (it has: {', '.join(systems)})")
        return forced
    for name, system in systems.items():
        patterns = system.get("hosts", [])
        if name != "*" and hosts and patterns and all(any(re.fullmatch(p, h) for p in patterns) for h in hosts):
            return name
    if "*" in systems:
        return "*"
    raise InputError(f"no system in {path} matches hosts {hosts} (systems: {', '.join(systems)}); "
                     f"use --system NAME or add a \"*\" system")


def _matches(record: dict, selector: dict) -> bool:
    for column, wanted in selector.items():
        if column not in record:
            return False
        if _key_value(record[column]) != _key_value(wanted):
            try:
                if float(record[column]) == float(wanted):
                    continue
            except (TypeError, ValueError):
                pass
            return False
    return True


def check_reference(args) -> int:
    data = load_reference(args.reference)
    with open(args.reference, "rb") as handle:
        ref_digest = hashlib.sha256(handle.read()).hexdigest()
    entries_used = {}
    results = []  # (path, run_id, system, rows)
    for path in args.files:
        sr.open_file(path).close()
        frame = sr.read_cases_with_summary(path)
        units = frame.attrs.get("units", {})
        runs = sr.read_runs(path)
        if frame.empty:
            raise InputError(f"{path} holds no cases")
        for run_id, cases in frame.groupby("run_id", sort=True):
            run = runs[runs["run_id"] == run_id].iloc[0].to_dict()
            system = pick_system(data, sr.run_hosts(path, run_id), args.system, args.reference)
            rows = []
            for index, entry in enumerate(data["systems"][system].get("references", [])):
                if entry["benchmark"] != run.get("benchmark"):
                    continue
                value, lower, upper, unit = entry["reference"]
                metric = entry["metric"]
                for record in cases.to_dict("records"):
                    merged = {**{k: run[k] for k in sr.RUN_COLUMNS if k in run}, **record}
                    if not _matches(merged, entry.get("case", {})):
                        continue
                    if metric not in record:
                        raise InputError(f"{path} run {run_id}: no metric column {metric!r} "
                                         f"(reference {index} of system {system})")
                    scale = unit_scale(unit, units.get(metric, ""))
                    ref = value * scale
                    low = -math.inf if lower is None else ref + abs(ref) * lower
                    high = math.inf if upper is None else ref + abs(ref) * upper
                    measured = float(record[metric])
                    if not math.isfinite(measured):
                        raise InputError(f"{path} run {run_id} case {record['case']}: {metric} is {measured} (not "
                                         f"measured for this case; reference {index} of system {system})")
                    verdict = "pass" if low <= measured <= high else "fail"
                    entries_used[(system, index)] = entries_used.get((system, index), 0) + 1
                    rows.append({"case": int(record["case"]), "label": str(record.get("label", "")), "metric": metric,
                                 "unit": units.get(metric, ""), "value": measured, "reference": ref,
                                 "lower_fraction": math.nan if lower is None else float(lower),
                                 "upper_fraction": math.nan if upper is None else float(upper),
                                 "lower_bound": low, "upper_bound": high, "verdict": verdict,
                                 "reference_unit": unit, "scale": scale})
            results.append((path, run_id, system, run.get("benchmark"), rows))
    unused = [(s, i) for s in data["systems"] for i, _ in enumerate(data["systems"][s].get("references", []))
              if (s, i) not in entries_used and s in {r[2] for r in results}]
    if unused:
        described = [f"  system {s}, reference {i}: {data['systems'][s]['references'][i]['benchmark']} "
                     f"{json.dumps(data['systems'][s]['references'][i].get('case', {}))}" for s, i in unused]
        if not args.allow_unmatched:
            say("error: reference entries match no case in the files:\n" + "\n".join(described) +
                "\n  use --allow-unmatched to check the others only")
            return 2
        say("note: reference entries that match no case:\n" + "\n".join(described))
    checked = [r for r in results if r[4]]
    if not checked:
        say("error: no case of the files has a reference value")
        return 2

    failures = 0
    body = []
    for path, run_id, system, benchmark, rows in checked:
        for r in rows:
            failures += r["verdict"] == "fail"
            scale = r["scale"]
            bound = lambda x: "-" if not math.isfinite(x) else f"{x / scale:.4g}"  # noqa: E731
            body.append([os.path.basename(path), run_id, system, benchmark, r["label"], r["metric"],
                         f"{r['value'] / scale:.4g}", f"{r['reference'] / scale:.4g}",
                         f"[{bound(r['lower_bound'])}, {bound(r['upper_bound'])}]", r["reference_unit"],
                         r["verdict"].upper() if r["verdict"] == "fail" else r["verdict"]])
    print(f"reference: {args.reference}")
    print_table(["file", "run", "system", "benchmark", "case", "metric", "value", "reference", "bounds", "unit",
                 "verdict"], body)
    if not args.no_store:
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        for path, run_id, system, _, rows in checked:
            store_verdict(path, run_id, system, rows, args.reference, ref_digest, now)
        say(f"stored the verdicts as /runs/<id>/reference_check in {len({c[0] for c in checked})} file(s)")
    if failures:
        say(f"{failures} reference check(s) failed")
        return 1
    return 0


def store_verdict(path, run_id, system, rows, reference_path, digest, now) -> None:
    columns = {name: [r[name] for r in rows] for name in
               ("case", "label", "metric", "unit", "value", "reference", "lower_fraction", "upper_fraction",
                "lower_bound", "upper_bound", "verdict")}
    in_row_unit = "the unit in this row's `unit` column (SI)"
    units = {"case": "1", "label": "", "metric": "", "unit": "", "value": "", "reference": "",
             "lower_fraction": "1", "upper_fraction": "1", "lower_bound": "", "upper_bound": "", "verdict": ""}
    conventions = {
        "value": f"the run's value of `metric` for the case, in {in_row_unit}",
        "reference": f"reference value, in {in_row_unit}",
        "lower_fraction": "ReFrame-style lower threshold (<= 0); NaN: unbounded",
        "upper_fraction": "ReFrame-style upper threshold (>= 0); NaN: unbounded",
        "lower_bound": f"reference * (1 + lower_fraction) for positive references; -inf: unbounded; {in_row_unit}",
        "upper_bound": f"reference * (1 + upper_fraction) for positive references; +inf: unbounded; {in_row_unit}",
        "verdict": "pass when lower_bound <= value <= upper_bound, else fail",
    }
    overall = "fail" if any(r["verdict"] == "fail" for r in rows) else "pass"
    attrs = {"verdict": overall, "system": system, "reference_file": os.path.basename(reference_path),
             "reference_sha256": digest, "checked_utc": now, "checked_by": PROG}
    try:
        sr.write_run_table(path, run_id, "reference_check", columns, units, conventions, attrs)
    except OSError as error:
        raise InputError(f"cannot store the verdict in {path}: {error} (use --no-store to check only)") from None


# ---- command line -----------------------------------------------------------------------------------------

def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Exit status: 0 no regression / all references met, 1 regression or "
                                            "failed reference, 2 bad input.")
    parser.add_argument("files", nargs="*", help="BASE NEW, or with --reference the files to check")
    parser.add_argument("--threshold", type=float, default=0.10,
                        help="exit 1 when a significantly slower case changed by more than this fraction [0.10]")
    parser.add_argument("--noise-factor", type=float, default=1.10,
                        help="a ratio of medians within [1/F, F] counts as no change, whatever p says [1.10, asv's]")
    parser.add_argument("--alpha", type=float, default=0.05, help="significance level of the U test [0.05]")
    parser.add_argument("--min-samples", type=int, default=MIN_SAMPLES,
                        help=f"warn when a case has fewer samples than this on a side [{MIN_SAMPLES}]")
    parser.add_argument("--ignore", metavar="COLUMN,...",
                        help="case columns (or n_ranks, n_nodes) left out when matching cases")
    parser.add_argument("--benchmark", help="compare this benchmark's cases only")
    parser.add_argument("--allow-unmatched", action="store_true",
                        help="list cases (or reference entries) without a partner instead of failing")
    parser.add_argument("--json", metavar="FILE", help="also write the comparison as JSON")
    parser.add_argument("--reference", metavar="REF.json", help="check FILE... against reference values")
    parser.add_argument("--system", help="reference system to use instead of matching host names")
    parser.add_argument("--no-store", action="store_true", help="with --reference: do not store the verdict")
    parser.add_argument("--help-reference", action="store_true", help="describe the reference file format")
    args = parser.parse_args(argv)
    if args.help_reference:
        print(REFERENCE_HELP)
        return 0
    # NaN compares false both ways, so each bound is written to fail for it too.
    if not 1 <= args.noise_factor < float("inf"):
        parser.error(f"--noise-factor {args.noise_factor}: need a finite number >= 1")
    if not 0 < args.alpha < 1:
        parser.error(f"--alpha {args.alpha}: need a number between 0 and 1")
    if not 0 <= args.threshold < float("inf"):
        parser.error(f"--threshold {args.threshold}: need a finite number >= 0")
    if args.min_samples < 1:
        parser.error(f"--min-samples {args.min_samples}: need at least 1")
    try:
        inputs = [("FILE", path) for path in args.files] + [("--reference", args.reference or "")]
        sr.check_outputs(inputs, replaced=[("--json", args.json or "", "the comparison as JSON")])
        if args.reference:
            if not args.files:
                parser.error("--reference needs at least one results file")
            for path in args.files:
                sr.open_file(path).close()
            return check_reference(args)
        if len(args.files) != 2:
            parser.error("expected BASE NEW (two results files), or --reference REF.json FILE...")
        for path in args.files:
            sr.open_file(path).close()
        return compare(args)
    except (sr.StrataFileError, InputError) as error:
        say(f"error: {error}")
        return 2


def console_main() -> int:
    """The `strata-compare` command (the package's entry point and scripts/strata-compare)."""
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `strata-compare ... | head` ends quietly
    return sr.run_script(PROG, main, sys.argv[1:])


if __name__ == "__main__":
    sys.exit(console_main())
