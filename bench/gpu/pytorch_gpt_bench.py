#!/usr/bin/env python3
"""Plain PyTorch training of the same GPT as tandem's (runtime/torch/gpt.h), as users run it.

Modes (--modes, comma separated):
  eager-fp32   float32, the explicit attention (softmax of QK^T), torch.optim.AdamW (foreach)
  eager-bf16   bf16 autocast, scaled_dot_product_attention, fused AdamW
  compile-bf16 the eager-bf16 model under torch.compile (where available)

The model: token + position embeddings; pre-LN blocks with a fused q/k/v projection without
bias, an output projection, a 4x GELU MLP; final LayerNorm and an untied LM head without bias;
cross-entropy of the next token. Data: random tokens. Prints one JSON object per mode with
tokens_per_second, mfu (training FLOPs per token as PaLM counts them, over the device's peak),
peak_memory_bytes (torch.cuda.max_memory_allocated) and the mean iteration time.
"""
import argparse
import json
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# Dense peaks (FLOP/s) by device name, as tandem's table (runtime/torch/precision.cc).
PEAKS = [("H200", 989e12, 67e12), ("H100 PCIe", 756e12, 51e12), ("H100", 989e12, 67e12),
         ("GH200", 989e12, 67e12), ("B200", 2250e12, 80e12), ("A100", 312e12, 19.5e12),
         ("A10G", 70e12, 31.2e12), ("L40S", 362e12, 91.6e12), ("L4", 121e12, 30.3e12),
         ("V100", 125e12, 15.7e12)]


def peak_flops(device, bf16, override_tflops):
    if override_tflops > 0:
        return override_tflops * 1e12
    if device.type != "cuda":
        return 0.0
    name = torch.cuda.get_device_name(device)
    for key, bf, fp in PEAKS:
        if key in name:
            return bf if bf16 else fp
    return 0.0


def flops_per_token(layers, hidden, seq_len, vocab):
    matmul_parameters = layers * 12 * hidden * hidden + hidden * vocab
    return 6 * matmul_parameters + 12 * layers * hidden * seq_len


class Block(nn.Module):
    def __init__(self, hidden, heads, fused_attention):
        super().__init__()
        self.heads = heads
        self.fused = fused_attention
        self.attention_norm = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.attention_out = nn.Linear(hidden, hidden)
        self.mlp_norm = nn.LayerNorm(hidden)
        self.mlp_in = nn.Linear(hidden, 4 * hidden)
        self.mlp_out = nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        b, s, h = x.shape
        hd = h // self.heads
        q, k, v = self.qkv(self.attention_norm(x)).view(b, s, 3, self.heads, hd).permute(
            2, 0, 3, 1, 4)
        if self.fused:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = q @ k.transpose(-2, -1) / math.sqrt(hd)
            mask = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
            a = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v
        x = x + self.attention_out(a.transpose(1, 2).reshape(b, s, h))
        return x + self.mlp_out(F.gelu(self.mlp_in(self.mlp_norm(x))))


class Gpt(nn.Module):
    def __init__(self, layers, hidden, heads, seq_len, vocab, fused_attention):
        super().__init__()
        self.token = nn.Embedding(vocab, hidden)
        self.position = nn.Embedding(seq_len, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads, fused_attention) for _ in range(layers))
        self.norm = nn.LayerNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.token(tokens) + self.position(positions)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.norm(x))


def run(mode, args, device):
    torch.manual_seed(0)
    bf16 = mode != "eager-fp32"
    model = Gpt(args.layers, args.hidden, args.heads, args.seq_len, args.vocab,
                fused_attention=bf16).to(device)
    fused = bf16 and device.type == "cuda"
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused or None)
    step_model = model
    if mode == "compile-bf16":
        if not hasattr(torch, "compile"):
            return {"mode": mode, "skipped": "torch.compile is not available"}
        step_model = torch.compile(model)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq_len + 1), device=device)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = step_model(inputs)
        loss = F.cross_entropy(logits.float().reshape(-1, args.vocab), targets.reshape(-1))
        loss.backward()
        optimizer.step()
        return loss

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(args.warmup):
        step()
    sync()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    sync()
    seconds = (time.perf_counter() - start) / args.steps
    if args.trace:
        # One more step under the profiler, as tandem train --torch-trace records its last.
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as profiler:
            step()
            sync()
        profiler.export_chrome_trace(f"{args.trace}.{mode}.json")
    tokens_per_second = args.batch * args.seq_len / seconds
    peak = peak_flops(device, bf16, args.peak_tflops)
    result = {
        "mode": mode,
        "tokens_per_second": tokens_per_second,
        "iteration_ms": seconds * 1e3,
        "loss": float(loss.detach()),
        "peak_memory_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda"
        else None,
    }
    if peak > 0:
        result["mfu"] = tokens_per_second * flops_per_token(
            args.layers, args.hidden, args.seq_len, args.vocab) / peak
    return result


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--modes", default="eager-fp32,eager-bf16,compile-bf16")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--peak-tflops", type=float, default=0)
    p.add_argument("--trace", default="",
                   help="write a profiler trace (Chrome JSON) of one more step per mode to "
                        "TRACE.MODE.json")
    args = p.parse_args()
    if args.hidden % args.heads != 0:
        sys.exit("--hidden must be divisible by --heads")
    device = torch.device(args.device)
    for mode in args.modes.split(","):
        if mode not in ("eager-fp32", "eager-bf16", "compile-bf16"):
            sys.exit(f"unknown mode '{mode}' (eager-fp32, eager-bf16, compile-bf16)")
        try:
            result = run(mode, args, device)
        except Exception as e:  # one mode failing (e.g. no compiler) leaves the others
            result = {"mode": mode, "error": f"{type(e).__name__}: {e}"}
        result.update({"layers": args.layers, "hidden": args.hidden, "seq_len": args.seq_len,
                       "batch": args.batch, "device": str(device), "torch": torch.__version__})
        print(json.dumps(result), flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
