#!/usr/bin/env bash
# Model state per rank under pipeline or tensor parallelism, against the formula: a GPT of
# gpt2-124m's width (n_layer 12, d_model 768, n_head 12, vocab 50257; seq 256 to keep it
# quick) at pp (or tp) = 1, 2 and 4 (`loom launch -n N -- loom train --parallel.pp=N`, or
# --parallel.tp=N with --tp, one step). Each rank's parameter count and resident parameters,
# gradients and AdamW moments (mincore, as loom train logs them) beside the formula of
# docs/parallelism.md:
#   pp: per block 12C^2 + 13C; stage 0 adds wte V x C and wpe T x C; the last stage adds
#       ln_f 2C and, when pp > 1, its copy of the tied wte V x C;
#   tp: per block (12C^2 + 7C) / tp + 6C on every piece, plus the whole wte, wpe and ln_f;
#   model state = 16 bytes per parameter.
# Usage: bench/pp_memory.sh [--tp] [N...]
set -euo pipefail
cd "$(dirname "$0")/.."
axis=pp
if [ "${1:-}" = --tp ]; then axis=tp; shift; fi
pps=("${@:-}")
[ -n "${pps[0]}" ] || pps=(1 2 4)
source bench/common.sh

echo "# GPT n_layer 12, d_model 768, vocab 50257, seq 256; model state per rank (MiB); formula: 16 bytes per parameter"
printf "%3s %5s %12s %12s %10s %10s %10s %10s %10s\n" $axis rank parameters formula params grads optimizer state formula
for pp in "${pps[@]}"; do
  $loom launch -n "$pp" -- $loom train configs/gpt-mini.toml --job.run_dir="$work" --job.name="pp$pp" --job.threads=1 \
    --model.preset=gpt --model.n_layer=12 --model.d_model=768 --model.n_head=12 --model.vocab_size=50257 \
    --model.seq_len=256 --training.steps=1 --training.global_batch=4 --training.micro_batch=1 --training.eval_every=0 \
    --checkpoint.every=0 --parallel.$axis="$pp" > "$work/pp$pp.out" 2>&1
  /usr/bin/env python3 - "$work/pp$pp.out" "$pp" "$work/pp$pp/metrics.jsonl" "$axis" <<'PY'
import re, sys
text, pp, axis = open(sys.argv[1]).read(), int(sys.argv[2]), sys.argv[4]
L, C, V, T = 12, 768, 50257, 256
def formula(stage):
    if axis == "tp":
        return L * ((12 * C * C + 7 * C) // pp + 6 * C) + V * C + T * C + 2 * C
    n = (L // pp) * (12 * C * C + 13 * C)
    if stage == 0: n += V * C + T * C
    if stage == pp - 1: n += 2 * C + (V * C if pp > 1 else 0)
    return n
rows = re.findall(r"model state of rank (\d+) \((?:stage|tp) (\d+).*?\): (\d+) parameters; parameters ([\d.]+) MiB, gradients ([\d.]+) MiB, optimizer ([\d.]+) MiB", text)
if not rows:  # one process: its metrics line after the step
    import json
    n = re.search(r"\((\d+) parameters\)", text).group(1)
    m = json.loads(open(sys.argv[3]).readline())
    rows = [("0", "0", n, m["mem_params_mb"], m["mem_grads_mb"], m["mem_optimizer_mb"])]
for rank, stage, n, p, g, o in rows:
    f = formula(int(stage))
    state = float(p) + float(g) + float(o)
    print(f"{pp:3d} {int(rank):5d} {int(n):12d} {f:12d} {float(p):10.1f} {float(g):10.1f} {float(o):10.1f} {state:10.1f} {16 * f / 2**20:10.1f}")
PY
done
