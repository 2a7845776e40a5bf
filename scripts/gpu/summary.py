#!/usr/bin/env python3
"""The GPU check's summary: every part's status, then Strata against PyTorch on the same GPU, with the targets.

    summary.py --results results.h5 --pytorch pytorch.jsonl --parts parts.tsv --markdown OUT.md --json OUT.json
    summary.py --shapes-of results.h5      (the MxNxK shapes strata-gemm ran on the GPU, comma-separated)

Targets (one run, ratios of throughputs on the same device): GEMM >= 0.97 of torch.matmul per dtype and shape;
attention forward >= 0.8 and backward >= 0.7 of SDPA's flash backend; the training step >= 1.0 x PyTorch eager
(tokens/s). PyTorch's MFU is Strata's FLOP count for the same step (6N + 6Lhs per token) over its step time and
the same peak. Exit 1 when a target is missed or a part failed.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TARGETS = {"gemm": 0.97, "fwd": 0.8, "bwd": 0.7, "step": 1.0}


def strata_cases(path: str, benchmark: str):
    if not os.path.exists(path):
        return None
    import strata_results as sr
    try:
        frame = sr.read_cases_with_summary(path, benchmark)
    except (KeyError, ValueError):
        return None
    return frame if len(frame) else None


def pytorch_records(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as handle:
        return [json.loads(line) for line in handle if line.strip()]


def table(header: list[str], rows: list[list]) -> list[str]:
    widths = [max(len(str(x)) for x in column) for column in zip(header, *rows)]
    line = lambda row: "| " + " | ".join(str(x).ljust(w) for x, w in zip(row, widths)) + " |"  # noqa: E731
    return [line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *(line(r) for r in rows)]


def judged(ratio: float | None, target: float) -> str:
    if ratio is None:
        return "n/a"
    return f"{ratio:.3f} ({'PASS' if ratio >= target else 'MISS'} >= {target})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes-of")
    parser.add_argument("--results", default="")
    parser.add_argument("--pytorch", default="")
    parser.add_argument("--parts", default="")
    parser.add_argument("--markdown", default="")
    parser.add_argument("--json", default="")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()

    if args.shapes_of:
        gemm = strata_cases(args.shapes_of, "strata-gemm")
        if gemm is None or "backend" not in gemm:
            return 1
        gpu = gemm[gemm["backend"] == "cuda"]
        shapes = dict.fromkeys(f"{m}x{n}x{k}" for m, n, k in zip(gpu["m"], gpu["n"], gpu["k"]))
        if not shapes:
            return 1
        print(",".join(shapes))
        return 0

    lines = ["# Strata GPU check" + (" (dry run: no GPU here)" if args.dry_run else ""), ""]
    record: dict = {"parts": [], "gemm": [], "attention": [], "step": [], "collective": [], "missed": []}
    parts = []
    if args.parts and os.path.exists(args.parts):
        with open(args.parts) as handle:
            parts = [line.rstrip("\n").split("\t") for line in handle if line.strip()]
    failed = [p for p in parts if p[1].startswith("FAILED") or p[1] == "timed out"]
    lines += ["## Parts", "", *table(["part", "status", "seconds", "note"], [p + [""] * (4 - len(p)) for p in parts]), ""]
    record["parts"] = [dict(zip(("part", "status", "seconds", "note"), p)) for p in parts]
    torch_rows = pytorch_records(args.pytorch)
    device = next((r["device"] for r in torch_rows), None)

    gemm = strata_cases(args.results, "strata-gemm")
    if gemm is not None and (gemm["backend"] == "cpu").any():
        smoke = gemm[gemm["backend"] == "cpu"].iloc[0]
        lines += [f"CPU smoke, read back from the results file: strata-gemm {smoke['dtype']} {smoke['m']}x{smoke['n']}x"
                  f"{smoke['k']} at {smoke['flop_rate_per_rank'] / 1e9:.1f} GFLOP/s "
                  f"({'checked ok' if smoke['wrong_elements'] == 0 else 'CHECK FAILED'}).", ""]
        record["cpu_smoke_gflops"] = float(smoke["flop_rate_per_rank"] / 1e9)
    if gemm is not None and (gemm["backend"] == "cuda").any():
        rows = []
        for c in gemm[gemm["backend"] == "cuda"].itertuples():
            ours = c.flop_rate_per_rank / 1e12
            theirs = next((r["tflops"] for r in torch_rows if r["kind"] == "gemm" and r["dtype"] == c.dtype
                           and (r["m"], r["n"], r["k"]) == (c.m, c.n, c.k)), None)
            ratio = ours / theirs if theirs else None
            if ratio is not None and ratio < TARGETS["gemm"]:
                record["missed"].append(f"gemm {c.dtype} {c.m}x{c.n}x{c.k}")
            rows.append([c.dtype, f"{c.m}x{c.n}x{c.k}", f"{ours:.1f}", f"{theirs:.1f}" if theirs else "n/a",
                         f"{100 * c.peak_fraction:.1f}" if c.peak_fraction > 0 else "n/a", judged(ratio, TARGETS["gemm"])])
            record["gemm"].append({"dtype": c.dtype, "shape": f"{c.m}x{c.n}x{c.k}", "strata_tflops": ours,
                                   "pytorch_tflops": theirs, "ratio": ratio})
        lines += ["## GEMM: strata-gemm (cuBLASLt) against torch.matmul", "",
                  "TFLOP/s = 2MNK / median time; C (M, N) = A (M, K) W (N, K)^T; fp8 e4m3 inputs, bf16 output.", "",
                  *table(["dtype", "MxNxK", "Strata TFLOP/s", "PyTorch TFLOP/s", "% of peak", "Strata / PyTorch"], rows), ""]

    attention = strata_cases(args.results, "strata-attention")
    if attention is not None:
        rows = []
        for c in attention.to_dict("records"):  # "pass" is a keyword: itertuples() would rename it
            ours = c["flop_rate_per_rank"] / 1e12
            causal = bool(c["causal"])
            theirs = next((r["tflops"] for r in torch_rows if r["kind"] == "attention" and r["pass"] == c["pass"]
                           and r["causal"] == causal and r["seq"] == c["seq_q"]), None)
            ratio = ours / theirs if theirs else None
            target = TARGETS.get(c["pass"], 1.0)
            if ratio is not None and ratio < target:
                record["missed"].append(f"attention {c['pass']} causal={causal}")
            rows.append([c["impl"], c["pass"], "yes" if causal else "no", f"{ours:.1f}",
                         f"{theirs:.1f}" if theirs else "n/a", judged(ratio, target)])
            record["attention"].append({"impl": c["impl"], "pass": c["pass"], "causal": causal,
                                        "strata_tflops": ours, "pytorch_tflops": theirs, "ratio": ratio})
        lines += ["## Attention: strata-attention (flash) against SDPA's flash backend", "",
                  "TFLOP/s in flash-attention's convention: forward 4 b h s^2 d (causal half), backward 2.5 x forward.",
                  "", *table(["impl", "pass", "causal", "Strata TFLOP/s", "PyTorch TFLOP/s", "Strata / PyTorch"], rows), ""]

    step = strata_cases(args.results, "strata-step")
    if step is not None:
        rows = []
        for c in step.itertuples():
            step_s = c.time_rankmax_median
            flop_per_step = c.flop  # per rank per step; one rank
            peak = c.peak_per_rank
            entry = {"model": c.model, "strata_tokens_per_s": c.tokens_per_s, "strata_mfu": c.mfu}
            cells = [c.model, f"{step_s * 1e3:.1f}", f"{c.tokens_per_s:.0f}", f"{100 * c.mfu:.1f}"]
            for mode in ("eager", "compile"):
                theirs = next((r for r in torch_rows if r["kind"] == "step" and r["model"] == c.model and r["mode"] == mode), None)
                if theirs:
                    mfu = flop_per_step / theirs["seconds"] / peak if peak > 0 else float("nan")
                    cells += [f"{theirs['tokens_per_s']:.0f}", f"{100 * mfu:.1f}"]
                    entry[f"pytorch_{mode}_tokens_per_s"] = theirs["tokens_per_s"]
                    entry[f"pytorch_{mode}_mfu"] = mfu
                else:
                    cells += ["n/a", "n/a"]
            eager = entry.get("pytorch_eager_tokens_per_s")
            ratio = c.tokens_per_s / eager if eager else None
            if ratio is not None and ratio < TARGETS["step"]:
                record["missed"].append(f"step {c.model}")
            entry["ratio_eager"] = ratio
            cells.append(judged(ratio, TARGETS["step"]))
            rows.append(cells)
            record["step"].append(entry)
        lines += ["## Training step: strata-step --backend cuda against PyTorch (bf16 autocast, fused AdamW)", "",
                  "MFU: 6N + 6Lhs model FLOPs per token (Strata's count, for both) over step time x the dense bf16 peak.",
                  "", *table(["model", "Strata step (ms)", "Strata tok/s", "Strata MFU %", "eager tok/s", "eager MFU %",
                              "compile tok/s", "compile MFU %", "Strata / eager"], rows), ""]

    collective = strata_cases(args.results, "strata-collective")
    if collective is not None and "busbw" in collective:
        rows = []
        for (op, dtype), group in collective.groupby(["collective", "datatype"]):
            best = group.loc[group["busbw"].idxmax()]
            rows.append([op, dtype, f"{best['busbw'] / 1e9:.1f}", int(best["bytes"]) if "bytes" in best else ""])
            record["collective"].append({"collective": op, "datatype": dtype, "busbw_max": float(best["busbw"])})
        lines += ["## Collectives: strata-collective --backend nccl, one rank", "",
                  *table(["collective", "datatype", "max busbw (GB/s)", "at bytes"], rows), ""]

    if device:
        lines.insert(1, f"Device: {device}; PyTorch {torch_rows[0]['torch']}.")
    if record["missed"]:
        lines += [f"Targets missed: {', '.join(record['missed'])}", ""]
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as handle:
            handle.write(text + "\n")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(record, handle, indent=1)
    return 1 if failed or record["missed"] else 0


if __name__ == "__main__":
    sys.exit(main())
