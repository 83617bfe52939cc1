#!/usr/bin/env bash
# Mixed precision against fp32 on the main job's model: gpt-mini (configs/gpt-mini.toml)
# trained STEPS steps on Debian's fortunes in fp32, bf16 and fp16 (same seed, same data,
# one rank, 2 threads). Prints, per 20-step window, the mean |loss - fp32's| relative to
# fp32's and the largest one step's, then each run's final validation loss, median step
# time and peak resident memory (docs/numerics.md "Mixed precision", docs/perf.md).
# Usage: bench/precision_curves.sh [STEPS]   (default 200)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-200}
loom=build/release/loom
[ -x $loom ] || { cmake --preset release >/dev/null && cmake --build --preset release --target loom; }
[ -f data/fortunes.bin ] || $loom data prepare text:/usr/share/games/fortunes --out data/fortunes.bin
out=$(mktemp -d /tmp/loom_precision.XXXXXX)
for p in fp32 bf16 fp16; do
  $loom train configs/gpt-mini.toml --quiet --job.threads=2 --job.run_dir="$out" --job.name=$p \
    --training.precision=$p --training.steps="$steps" --training.eval_every=0 --checkpoint.every=0
done
/usr/bin/python3 - "$out" <<'PY'
import json, statistics, sys
out = sys.argv[1]
runs = {p: [json.loads(l) for l in open(f"{out}/{p}/metrics.jsonl")] for p in ("fp32", "bf16", "fp16")}
loss = {p: [r["loss"] for r in rs if "loss" in r] for p, rs in runs.items()}
n = len(loss["fp32"])
print(f"# {n} steps of gpt-mini; |loss - fp32| / fp32 per 20-step window: mean and largest step")
print(f"{'steps':>9} {'bf16 mean':>10} {'bf16 max':>9} {'fp16 mean':>10} {'fp16 max':>9}")
for w in range(0, n, 20):
    row = []
    for p in ("bf16", "fp16"):
        d = [abs(a - b) / b for a, b in zip(loss[p][w:w + 20], loss["fp32"][w:w + 20])]
        row += [100 * sum(d) / len(d), 100 * max(d)]
    print(f"{w + 1:>4}-{min(w + 20, n):<4} {row[0]:>9.2f}% {row[1]:>8.2f}% {row[2]:>9.2f}% {row[3]:>8.2f}%")
print(f"{'':>6} {'final val_loss':>15} {'step_ms (median)':>17} {'peak MiB':>9} {'skipped':>8}")
for p, rs in runs.items():
    val = [r["val_loss"] for r in rs if "val_loss" in r]
    ms = statistics.median(r["step_ms"] for r in rs[1:] if "step_ms" in r)
    peak = max(r.get("mem_peak_mb", 0) for r in rs)
    skipped = sum(r.get("skipped", 0) for r in rs)
    print(f"{p:>6} {val[-1] if val else float('nan'):>15.4f} {ms:>17.1f} {peak:>9.1f} {skipped:>8}")
PY
rm -rf "$out"
