# The PyTorch peer of `loom sample`: a GPT-2 generation loop on the same weights (a
# safetensors file with Hugging Face names, as `loom ckpt export` writes it), one sequence,
# TOKENS tokens from a one-byte prompt, sampling with temperature 0.8 and top-k 40; with its
# key/value cache (past keys and values per layer, one position a step) and without (the
# last window's forward every token). Prints one line per mode: tokens/s of the loop alone.
# Usage: /usr/bin/python3 bench/torch_generate.py MODEL.safetensors N_HEAD TOKENS THREADS
import json
import math
import struct
import sys
import time

import torch
import torch.nn.functional as F


def load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        assert e["dtype"] == "F32", (name, e["dtype"])
        lo, hi = e["data_offsets"]
        out[name.removeprefix("transformer.")] = torch.frombuffer(bytearray(data[lo:hi]), dtype=torch.float32).view(e["shape"])
    return out


class Gpt:
    def __init__(self, w, n_head):
        self.w, self.h = w, n_head
        self.n_layer = len({k.split(".")[1] for k in w if k.startswith("h.")})
        self.window = w["wpe.weight"].shape[0]

    def forward(self, ids, pos0, cache):
        # ids (T,) at positions pos0..; cache: per layer [k, v] (H, past, hs) or None (no cache)
        w, T = self.w, ids.shape[0]
        C = w["wte.weight"].shape[1]
        x = w["wte.weight"][ids] + w["wpe.weight"][pos0:pos0 + T]
        for l in range(self.n_layer):
            p = f"h.{l}."
            a = F.layer_norm(x, (C,), w[p + "ln_1.weight"], w[p + "ln_1.bias"], 1e-5)
            q, k, v = (a @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]).split(C, dim=1)
            q, k, v = (t.view(T, self.h, C // self.h).transpose(0, 1) for t in (q, k, v))
            if cache is not None:
                if cache[l] is not None:
                    k = torch.cat([cache[l][0], k], dim=1)
                    v = torch.cat([cache[l][1], v], dim=1)
                cache[l] = (k, v)
            S = k.shape[1]
            att = (q @ k.transpose(1, 2)) / math.sqrt(C // self.h)
            mask = torch.ones(T, S, dtype=torch.bool).tril(S - T)
            att = att.masked_fill(~mask, float("-inf")).softmax(-1)
            y = (att @ v).transpose(0, 1).reshape(T, C)
            x = x + y @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
            m = F.layer_norm(x, (C,), w[p + "ln_2.weight"], w[p + "ln_2.bias"], 1e-5)
            m = F.gelu(m @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"], approximate="tanh")
            x = x + m @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
        x = F.layer_norm(x[-1:], (C,), w["ln_f.weight"], w["ln_f.bias"], 1e-5)
        return (x @ w["wte.weight"].T)[0]


def pick(logits, g):
    top, idx = torch.topk(logits / 0.8, 40)
    return idx[torch.multinomial(top.softmax(-1), 1, generator=g)].item()


@torch.no_grad()
def generate(model, tokens, use_cache):
    g = torch.Generator().manual_seed(1)
    seq = [ord("x")]
    cache, start = [None] * model.n_layer, 0  # start: the cache's first position's token
    t0 = time.perf_counter()
    for _ in range(tokens):
        if not use_cache:
            ctx = seq[-model.window:]
            logits = model.forward(torch.tensor(ctx), 0, None)
        else:
            past = 0 if cache[0] is None else cache[0][0].shape[1]
            if past == model.window:  # full: start again from the last half window, as Loom does
                cache, past = [None] * model.n_layer, 0
            new = seq[-(model.window // 2):] if past == 0 and len(seq) > 1 else seq[len(seq) - 1:] if past else seq
            logits = model.forward(torch.tensor(new), past, cache)
        seq.append(pick(logits, g))
    return tokens / (time.perf_counter() - t0)


def main():
    path, n_head, tokens, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    torch.set_num_threads(threads)
    model = Gpt(load(path), n_head)
    for use_cache in (False, True):
        print(f"pytorch {'kv-cache' if use_cache else 'no-kv-cache'} {generate(model, tokens, use_cache):.0f} tokens/s")


main()
