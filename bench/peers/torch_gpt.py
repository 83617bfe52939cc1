# The PyTorch peer of Loom's GPT training benchmarks (bench/train_vs_pytorch.sh,
# bench/dp_vs_ddp.sh): the same model as Loom's presets (GPT-2 blocks, pre-LayerNorm,
# tanh GELU, the head tied to wte, GPT-2's init), AdamW (lr 3e-4, weight decay 0.1),
# random tokens, timed per step (forward, backward, optimizer). Runs on Debian's torch 1.13
# and on current 2.x: the attention is written out (masked softmax), as 1.13 lacks
# scaled_dot_product_attention; --sdpa uses it where it exists.
#
#   /usr/bin/python3 bench/peers/torch_gpt.py [--preset gpt-mini|gpt2-124m] [--micro-batch B]
#       [--threads N] [--precision fp32|bf16] [--steps S] [--warmup W] [--ddp P] [--sdpa]
#       [--device cpu|cuda] [--compile] [--vocab V]
#
# --precision bf16 runs forward under torch.autocast(device, dtype=torch.bfloat16): PyTorch's
# mixed precision (bf16 products where oneDNN or cuBLAS has them, f32 master weights).
# --ddp P: P processes of one thread each, DistributedDataParallel over gloo on loopback.
# --device cuda: on the GPU, with fused AdamW, TF32 allowed for f32 products, each step timed
# to torch.cuda.synchronize(); --compile wraps the model in torch.compile (2.x); --vocab pads
# the vocabulary (50304 for GPT-2, as nanoGPT). Peak memory is then the GPU's
# (torch.cuda.max_memory_allocated).
# Prints one line: tokens_per_s, the median and best step, peak RSS, first and last loss.
import argparse
import math
import os
import resource
import statistics
import sys
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

PRESETS = {
    "gpt-mini": dict(vocab=256, seq=256, layers=4, heads=4, width=256),
    "gpt2-124m": dict(vocab=50257, seq=1024, layers=12, heads=12, width=768),
}


class Block(nn.Module):
    def __init__(self, width, heads, seq, sdpa):
        super().__init__()
        self.heads, self.sdpa = heads, sdpa
        self.ln_1, self.ln_2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.c_attn = nn.Linear(width, 3 * width)
        self.attn_proj = nn.Linear(width, width)
        self.c_fc = nn.Linear(width, 4 * width)
        self.mlp_proj = nn.Linear(4 * width, width)
        # A plain tensor (not a buffer): DDP would broadcast buffers, and gloo in 1.13 has no bool.
        self.causal = torch.ones(seq, seq, dtype=torch.bool).tril()

    def attention(self, x):
        b, t, c = x.shape
        hs = c // self.heads
        q, k, v = (z.view(b, t, self.heads, hs).transpose(1, 2) for z in self.c_attn(x).split(c, dim=2))
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
            scores = scores.masked_fill(~self.causal[:t, :t].to(scores.device), float("-inf"))
            y = scores.softmax(dim=-1) @ v
        return self.attn_proj(y.transpose(1, 2).reshape(b, t, c))

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, vocab, seq, layers, heads, width, sdpa=False):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, width), nn.Embedding(seq, width)
        self.blocks = nn.ModuleList(Block(width, heads, seq, sdpa) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, tokens, targets):
        t = tokens.shape[1]
        x = self.wte(tokens) + self.wpe(torch.arange(t, device=tokens.device))
        for block in self.blocks:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # the head tied to wte
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def run(rank, args, store, results):
    torch.set_num_threads(1 if args.ddp > 1 else args.threads)
    torch.manual_seed(0)
    shape = dict(PRESETS[args.preset])
    if args.vocab:
        shape["vocab"] = args.vocab
    cuda = args.device == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    model = Gpt(**shape, sdpa=args.sdpa).to(args.device)
    if args.ddp > 1:
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=args.ddp)
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, **({"fused": True} if cuda else {}))
    step_model = torch.compile(model) if args.compile else model
    gen = torch.Generator().manual_seed(1000 + rank)
    times, losses = [], []
    for step in range(args.warmup + args.steps):
        batch = torch.randint(0, PRESETS[args.preset]["vocab"], (args.micro_batch, shape["seq"] + 1), generator=gen)
        batch = batch.to(args.device)
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss = step_model(batch[:, :-1], batch[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if cuda:
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
        if step >= args.warmup:
            times.append(elapsed)
        losses.append(loss.item())
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if cuda:
        rss_mib = torch.cuda.max_memory_allocated() / 2**20
    results.put((rank, statistics.median(times), min(times), rss_mib, losses[0], losses[-1]))
    if args.ddp > 1:
        torch.distributed.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description="PyTorch peer of Loom's GPT training benchmarks")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="gpt-mini")
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--ddp", type=int, default=1)
    ap.add_argument("--sdpa", action="store_true", help="F.scaled_dot_product_attention (torch 2.x)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (2.x)")
    ap.add_argument("--vocab", type=int, default=0, help="pad the vocabulary to this size (0: the preset's)")
    args = ap.parse_args()
    if args.device == "cuda" and args.ddp > 1:
        sys.exit("--device cuda runs one process (--ddp 1)")
    if args.sdpa and not hasattr(F, "scaled_dot_product_attention"):
        sys.exit(f"--sdpa: torch {torch.__version__} has no scaled_dot_product_attention")
    if args.ddp == 1:
        import queue

        results = queue.Queue()
        run(0, args, "", results)
        res = [results.get()]
    else:
        import torch.multiprocessing as mp

        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        ctx = mp.get_context("spawn")
        results = ctx.Queue()
        fd, store = tempfile.mkstemp(prefix="loom_torch_gpt_")
        os.close(fd)
        os.unlink(store)
        procs = [ctx.Process(target=run, args=(r, args, store, results)) for r in range(args.ddp)]
        for p in procs:
            p.start()
        res = []
        while len(res) < args.ddp:
            try:
                res.append(results.get(timeout=1.0))
            except Exception:
                if any(p.exitcode not in (None, 0) for p in procs):
                    for p in procs:
                        p.kill()
                    sys.exit("torch_gpt.py: a DDP process failed")
        for p in procs:
            p.join()
        if os.path.exists(store):
            os.unlink(store)
    step = max(r[1] for r in res)  # the slowest rank sets the pace
    best = max(r[2] for r in res)
    tokens = args.ddp * args.micro_batch * PRESETS[args.preset]["seq"]
    mode = f"ddp{args.ddp}x1" if args.ddp > 1 else f"threads={args.threads}"
    if args.device == "cuda":
        mode = f"cuda({torch.cuda.get_device_name()}){' compiled' if args.compile else ' eager'}"
    print(
        f"torch {torch.__version__} {args.preset} {mode} precision={args.precision} tokens_per_s={tokens / step:.0f} "
        f"step_ms_median={step * 1e3:.1f} step_ms_best={best * 1e3:.1f} "
        f"{'peak_gpu_mib' if args.device == 'cuda' else 'peak_rss_mib'}={'/'.join(f'{r[3]:.0f}' for r in res)} loss={res[0][4]:.4f}->{res[0][5]:.4f}",
        flush=True,
    )


if __name__ == "__main__":
    main()
