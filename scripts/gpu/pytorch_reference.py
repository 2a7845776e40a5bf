#!/usr/bin/env python3
"""PyTorch beside Strata on the same GPU, the same shapes and the same conventions, for the GPU check.

    pytorch_reference.py gemm --dtypes fp32,tf32,fp16,bf16,fp8 --shapes 8192x8192x8192,... --json OUT
    pytorch_reference.py attention --batch 4 --heads 32 --seq 4096 --dim 128 --dtype bf16 --json OUT
    pytorch_reference.py step --model gpt2-124m --seq 1024 --micro-batch 8 --json OUT [--compile]
    pytorch_reference.py step --device cpu --threads 1 --dtype fp32 --model gpt2-124m --seq 64 --micro-batch 4 --json OUT

Each appends one JSON object per case to OUT (one line each). GEMM: C (M, N) = A (M, K) W (N, K)^T as
strata-gemm computes it, median time of the timed iterations after warm-up, CUDA events around each.
Attention: torch.nn.functional.scaled_dot_product_attention restricted to the flash backend, (B, H, S, D),
forward and backward (the backward of one forward, as strata-attention times its backward). Step: GPT-2 as
strata-step builds it (token and position embeddings, pre-LN blocks of causal attention and a tanh-GELU MLP,
final LN, tied LM head), AdamW (betas 0.9/0.95, eps 1e-8, weight decay 0.1, fused), global-norm clipping at 1,
bf16 autocast over fp32 master weights (Strata: fp32 masters, bf16 compute copy and activations), eager or
torch.compile. `step --device cpu` is the CPU step's counterpart (strata-step --backend cpu): fp32, or bf16 autocast
with --dtype bf16, on --threads intra-op threads, subnormals flushed to zero as strata-step flushes them, wall time
of each step. Without PyTorch or a CUDA device each command says so ("no device") and exits 0.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:  # the dry run on a machine without PyTorch
    torch = None


def no_device_reason(device: str = "cuda") -> str | None:
    if torch is None:
        return "no device: PyTorch is not installed here"
    if device == "cuda" and not torch.cuda.is_available():
        return "no device: PyTorch sees no CUDA device"
    return None


def emit(path: str, record: dict, device: str = "cuda") -> None:
    name = torch.cuda.get_device_name(0) if device == "cuda" else f"cpu, {torch.get_num_threads()} thread(s)"
    record = {"torch": torch.__version__, "device": name, **record}
    print(json.dumps(record), flush=True)
    with open(path, "a") as handle:
        handle.write(json.dumps(record) + "\n")


def timed_median(run, warmup: int, iters: int) -> float:
    """Median seconds of `iters` calls of `run` after `warmup`, each between two CUDA events."""
    for _ in range(warmup):
        run()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / 1e3)
    return statistics.median(times)


# ---- GEMM ------------------------------------------------------------------------------------------------
def gemm(args) -> None:
    for dtype in args.dtypes.split(","):
        for shape in args.shapes.split(","):
            m, n, k = (int(x) for x in shape.lower().split("x"))
            torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
            generator = torch.Generator(device="cuda").manual_seed(1)
            a = torch.rand(m, k, device="cuda", generator=generator) * 2 - 1  # values in [-1, 1), never zeros
            w = torch.rand(n, k, device="cuda", generator=generator) * 2 - 1
            if dtype in ("fp32", "tf32"):
                run = lambda: torch.matmul(a, w.t())  # noqa: E731
            elif dtype in ("fp16", "bf16"):
                t = torch.float16 if dtype == "fp16" else torch.bfloat16
                a16, w16 = a.to(t), w.to(t)
                run = lambda: torch.matmul(a16, w16.t())  # noqa: E731
            elif dtype == "fp8":
                a8, w8 = a.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
                one = torch.ones((), device="cuda")
                # _scaled_mm wants A row-major and B column-major: W (N, K) row-major is W^T column-major.
                run = lambda: torch._scaled_mm(a8, w8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)  # noqa: E731
            else:
                raise SystemExit(f"pytorch_reference.py gemm: unknown dtype '{dtype}'")
            seconds = timed_median(run, args.warmup, args.iters)
            emit(args.json, {"kind": "gemm", "dtype": dtype, "m": m, "n": n, "k": k, "seconds": seconds,
                             "tflops": 2 * m * n * k / seconds / 1e12})
            del a, w
            torch.cuda.empty_cache()
    torch.backends.cuda.matmul.allow_tf32 = False


# ---- attention -------------------------------------------------------------------------------------------
def attention(args) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    t = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    b, h, s, d = args.batch, args.heads, args.seq, args.dim
    generator = torch.Generator(device="cuda").manual_seed(1)
    q, k, v, dout = (torch.randn(b, h, s, d, device="cuda", generator=generator).to(t) for _ in range(4))
    for causal in (False, True):
        flop_forward = 4 * b * h * s * s * d * (0.5 if causal else 1.0)  # flash-attention's convention
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            forward = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # noqa: E731
            seconds = timed_median(forward, args.warmup, args.iters)
            emit(args.json, {"kind": "attention", "pass": "fwd", "causal": causal, "batch": b, "heads": h, "seq": s,
                             "dim": d, "dtype": args.dtype, "seconds": seconds, "tflops": flop_forward / seconds / 1e12})
            qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
            out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
            backward = lambda: torch.autograd.grad(out, (qg, kg, vg), dout, retain_graph=True)  # noqa: E731
            seconds = timed_median(backward, args.warmup, args.iters)
            emit(args.json, {"kind": "attention", "pass": "bwd", "causal": causal, "batch": b, "heads": h, "seq": s,
                             "dim": d, "dtype": args.dtype, "seconds": seconds,
                             "tflops": 2.5 * flop_forward / seconds / 1e12})


# ---- the training step -----------------------------------------------------------------------------------
PRESETS = {  # layers, hidden, heads; vocabulary and positions: VOCAB and POSITIONS, else GPT-2's 50257 and 1024
    "tiny": (2, 64, 4), "gpt2-124m": (12, 768, 12), "gpt2-350m": (24, 1024, 16), "gpt2-774m": (36, 1280, 20),
    "gpt2-1.5b": (48, 1600, 25),
}
VOCAB = {"tiny": 256}  # strata-step's presets; the GPT-2 shapes have GPT-2's 50257 tokens
POSITIONS = {"tiny": 64}


def gpt_class():
    """The model's classes, defined once PyTorch is known to be there."""
    class Block(nn.Module):
        def __init__(self, c: int, heads: int):
            super().__init__()
            self.heads = heads
            self.ln1, self.ln2 = nn.LayerNorm(c), nn.LayerNorm(c)
            self.qkv, self.proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
            self.fc, self.fc_proj = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

        def forward(self, x):  # (B, T, C)
            b, t, c = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
            q, k, v = (y.view(b, t, self.heads, c // self.heads).transpose(1, 2) for y in (q, k, v))  # (B, NH, T, HS)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
            x = x + self.proj(y)
            return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


    class Gpt(nn.Module):
        def __init__(self, layers: int, c: int, heads: int, vocab: int, positions: int):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, c), nn.Embedding(positions, c)
            self.blocks = nn.ModuleList(Block(c, heads) for _ in range(layers))
            self.ln_f = nn.LayerNorm(c)
            for name, p in self.named_parameters():  # GPT-2's initialisation
                if p.dim() >= 2:
                    std = 0.02 / math.sqrt(2 * layers) if name.endswith("proj.weight") else 0.02
                    nn.init.normal_(p, 0.0, std)
                elif name.endswith("bias"):
                    nn.init.zeros_(p)

        def forward(self, tokens, targets):  # (B, T) -> loss
            t = tokens.shape[1]
            x = self.wte(tokens) + self.wpe(torch.arange(t, device=tokens.device))
            for block in self.blocks:
                x = block(x)
            logits = F.linear(self.ln_f(x), self.wte.weight)  # the tied LM head, (B, T, V)
            return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))

    return Gpt


def step(args) -> None:
    layers, c, heads = PRESETS[args.model]
    device = args.device
    if device == "cpu":
        torch.set_num_threads(args.threads)
        torch.set_flush_denormal(True)
    torch.manual_seed(1)
    vocab = VOCAB.get(args.model, 50257)
    model = gpt_class()(layers, c, heads, vocab, max(POSITIONS.get(args.model, 1024), args.seq)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                                  fused=True)
    forward = torch.compile(model) if args.compile else model
    generator = torch.Generator(device=device).manual_seed(1)
    tokens = torch.randint(0, vocab, (args.micro_batch, args.seq + 1), device=device, generator=generator)
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    autocast = args.dtype == "bf16" or device == "cuda"

    def train_step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
            loss = forward(inputs, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return loss

    started = time.perf_counter()
    train_step()  # compiles, when compiling
    if device == "cuda":
        torch.cuda.synchronize()
    first = time.perf_counter() - started
    if device == "cuda":
        seconds = timed_median(train_step, args.warmup, args.iters)
    else:
        for _ in range(args.warmup):
            train_step()
        times = []
        for _ in range(args.iters):
            begin = time.perf_counter()
            train_step()
            times.append(time.perf_counter() - begin)
        seconds = statistics.median(times)
    tokens_per_step = args.micro_batch * args.seq
    emit(args.json, {"kind": "step", "model": args.model, "mode": "compile" if args.compile else "eager",
                     "dtype": "bf16" if autocast else "fp32", "seq": args.seq, "micro_batch": args.micro_batch,
                     "seconds": seconds, "tokens_per_s": tokens_per_step / seconds, "first_step_s": first,
                     "parameters": sum(p.numel() for p in model.parameters())}, device)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("gemm")
    g.add_argument("--dtypes", default="fp32,tf32,fp16,bf16,fp8")
    g.add_argument("--shapes", default="8192x8192x8192")
    a = sub.add_parser("attention")
    a.add_argument("--batch", type=int, default=4)
    a.add_argument("--heads", type=int, default=32)
    a.add_argument("--seq", type=int, default=4096)
    a.add_argument("--dim", type=int, default=128)
    a.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    s = sub.add_parser("step")
    s.add_argument("--model", choices=sorted(PRESETS), default="gpt2-124m")
    s.add_argument("--seq", type=int, default=1024)
    s.add_argument("--micro-batch", type=int, default=8)
    s.add_argument("--compile", action="store_true")
    s.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    s.add_argument("--threads", type=int, default=1, help="intra-op threads on the CPU")
    s.add_argument("--dtype", choices=("fp32", "bf16"), default="bf16",
                   help="on the CPU: fp32, or bf16 autocast (the GPU step always autocasts to bf16)")
    for p in (g, a, s):
        p.add_argument("--json", required=True, help="file the records are appended to (one JSON object per line)")
        p.add_argument("--warmup", type=int, default=3)
        p.add_argument("--iters", type=int, default=10)
    args = parser.parse_args()
    reason = no_device_reason(getattr(args, "device", "cuda"))
    if reason:
        print(f"pytorch_reference.py {args.command}: {reason}")
        return 0
    {"gemm": gemm, "attention": attention, "step": step}[args.command](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
