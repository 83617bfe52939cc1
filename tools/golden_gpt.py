#!/usr/bin/python3
"""Golden numbers for Loom's GPT, computed by PyTorch (Debian's python3-torch).

Builds a tiny GPT-2 (the same architecture and Hugging Face parameter names and layouts as
Loom: Conv1D weights (in, out), tied output embedding, tanh GELU, LayerNorm eps 1e-5),
draws its initial weights in float32 from a fixed seed, then in float64:
  - runs one fixed batch: logits, mean cross-entropy loss, every parameter's gradient;
  - takes 5 AdamW steps on that batch (lr warmup 2 steps then cosine to min_lr, weight
    decay on matmul weights only, global-norm clipping at 0.5, which engages),
    recording each step's loss and the final weights.
Writes tests/fixtures/golden_gpt.safetensors (safetensors, written by the small writer
below, since Debian 12 packages no Python safetensors). Rerun: ./tools/golden_gpt.py
"""
import json
import math
import os
import struct

import torch
import torch.nn.functional as F

CFG = dict(n_layer=2, n_head=2, d_model=16, seq_len=8, vocab_size=32)
B, T = 2, 8
OPT = dict(lr=1e-2, min_lr=1e-3, warmup_steps=2, steps=5, weight_decay=0.1, beta1=0.9,
           beta2=0.95, eps=1e-8, grad_clip=0.5)
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures",
                   "golden_gpt.safetensors")


def param_specs():
    c, v, t = CFG["d_model"], CFG["vocab_size"], CFG["seq_len"]
    specs = [("transformer.wte.weight", (v, c)), ("transformer.wpe.weight", (t, c))]
    for l in range(CFG["n_layer"]):
        p = f"transformer.h.{l}."
        specs += [(p + "ln_1.weight", (c,)), (p + "ln_1.bias", (c,)),
                  (p + "attn.c_attn.weight", (c, 3 * c)), (p + "attn.c_attn.bias", (3 * c,)),
                  (p + "attn.c_proj.weight", (c, c)), (p + "attn.c_proj.bias", (c,)),
                  (p + "ln_2.weight", (c,)), (p + "ln_2.bias", (c,)),
                  (p + "mlp.c_fc.weight", (c, 4 * c)), (p + "mlp.c_fc.bias", (4 * c,)),
                  (p + "mlp.c_proj.weight", (4 * c, c)), (p + "mlp.c_proj.bias", (c,))]
    specs += [("transformer.ln_f.weight", (c,)), ("transformer.ln_f.bias", (c,))]
    return specs


def forward(P, idx, targets):
    c, nh = CFG["d_model"], CFG["n_head"]
    b, t = idx.shape
    x = P["transformer.wte.weight"][idx] + P["transformer.wpe.weight"][torch.arange(t)]
    mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
    for l in range(CFG["n_layer"]):
        p = f"transformer.h.{l}."
        h = F.layer_norm(x, (c,), P[p + "ln_1.weight"], P[p + "ln_1.bias"], eps=1e-5)
        qkv = h @ P[p + "attn.c_attn.weight"] + P[p + "attn.c_attn.bias"]
        q, k, v = qkv.split(c, dim=2)
        q, k, v = (z.view(b, t, nh, c // nh).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(c // nh)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        x = x + y @ P[p + "attn.c_proj.weight"] + P[p + "attn.c_proj.bias"]
        h = F.layer_norm(x, (c,), P[p + "ln_2.weight"], P[p + "ln_2.bias"], eps=1e-5)
        h = F.gelu(h @ P[p + "mlp.c_fc.weight"] + P[p + "mlp.c_fc.bias"], approximate="tanh")
        x = x + h @ P[p + "mlp.c_proj.weight"] + P[p + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (c,), P["transformer.ln_f.weight"], P["transformer.ln_f.bias"], eps=1e-5)
    logits = x @ P["transformer.wte.weight"].T
    return logits, F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def lr_at(step):
    o = OPT
    if step < o["warmup_steps"]:
        return o["lr"] * (step + 1) / o["warmup_steps"]
    progress = min(1.0, (step - o["warmup_steps"]) / max(1, o["steps"] - 1 - o["warmup_steps"]))
    return o["min_lr"] + 0.5 * (o["lr"] - o["min_lr"]) * (1 + math.cos(math.pi * progress))


def write_safetensors(path, tensors, metadata):
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    dtypes = {torch.float32: "F32", torch.float64: "F64", torch.int32: "I32"}
    for name, t in tensors.items():
        data = t.contiguous().numpy().tobytes()
        header[name] = {"dtype": dtypes[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    os.replace(path + ".tmp", path)


def main():
    torch.manual_seed(20240520)
    init = {}
    for name, shape in param_specs():
        if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
            init[name] = 1.0 + 0.1 * torch.randn(shape, dtype=torch.float32)
        else:  # biases non-zero too, so their gradients and updates are exercised
            init[name] = 0.1 * torch.randn(shape, dtype=torch.float32)
    g = torch.Generator().manual_seed(7)
    seq = torch.randint(0, CFG["vocab_size"], (B, T + 1), generator=g, dtype=torch.int64)
    idx, targets = seq[:, :-1], seq[:, 1:]

    P = {n: t.double().clone().requires_grad_(True) for n, t in init.items()}
    logits, loss = forward(P, idx, targets)
    loss.backward()
    out = {"tokens": idx.int(), "targets": targets.int(), "logits": logits.detach(),
           "loss": loss.detach().reshape(1)}
    for n, t in init.items():
        out["init." + n] = t
        out["grad." + n] = P[n].grad.detach().clone()

    decay = [P[n] for n, _ in param_specs() if n.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight"))]
    no_decay = [P[n] for n, _ in param_specs() if not n.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight"))]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": OPT["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=OPT["lr"], betas=(OPT["beta1"], OPT["beta2"]), eps=OPT["eps"])
    losses, norms = [], []
    for step in range(OPT["steps"]):
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        opt.zero_grad(set_to_none=True)
        _, loss = forward(P, idx, targets)
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(list(P.values()), OPT["grad_clip"])))
        opt.step()
        losses.append(float(loss))
    out["losses"] = torch.tensor(losses, dtype=torch.float64)
    out["grad_norms"] = torch.tensor(norms, dtype=torch.float64)
    for n in init:
        out["final." + n] = P[n].detach().clone()
    meta = {"config": json.dumps(CFG), "optimizer": json.dumps(OPT), "torch": torch.__version__,
            "generator": "tools/golden_gpt.py"}
    write_safetensors(os.path.normpath(OUT), out, meta)
    print(f"wrote {os.path.normpath(OUT)}: loss {losses[0]:.6f} -> {losses[-1]:.6f}, "
          f"grad norms {norms[0]:.4f} .. {norms[-1]:.4f} (clip {OPT['grad_clip']})")


if __name__ == "__main__":
    main()
