#!/usr/bin/env bash
# Exposed data time of the main job (docs/data.md, "Prefetch"): gpt-mini on the fortunes
# through the BPE of run.sh, from a sharded dataset (manifest + shards of 100k tokens), on 2
# data-parallel ranks, with data.prefetch = 0 (batches made in the step) and 4 (made ahead),
# each warm (shards in the page cache) and cold (shards evicted with
# posix_fadvise(POSIX_FADV_DONTNEED) just before the run). Prints the mean data_wait_ms per
# step and its share of the step (rank 0's metrics, steps 2 onwards).
# Usage: bench/data_wait.sh [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-60}
source bench/common.sh
text=/usr/share/games/fortunes
[ -f data/fortunes-bpe/encoder.json ] || $loom tokenizer train text:$text --vocab-size 4096 --out data/fortunes-bpe >/dev/null
$loom data prepare text:$text --tokenizer data/fortunes-bpe --out "$work/ds" --shard-tokens 100000 >/dev/null
evict() {
  python3 -S - "$work"/ds/*.bin <<'PY'
import os, sys
for f in sys.argv[1:]:
    fd = os.open(f, os.O_RDONLY)
    os.fdatasync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
PY
}
echo "# gpt-mini-bpe, 2 ranks, $steps steps, dataset of $(ls "$work"/ds/train-*.bin | wc -l) shards"
printf "| %-6s | %-8s | %12s | %10s | %10s |\n" cache prefetch data_wait_ms step_ms share
for cache in warm cold; do
  for k in 0 4; do
    [ $cache = cold ] && evict
    name="$cache-$k"
    $loom launch -n 2 -- $loom train configs/gpt-mini-bpe.toml --quiet --job.run_dir="$work" --job.name="$name" \
      --data.train="$work/ds/train.json" --data.val= --data.tokenizer=data/fortunes-bpe --training.steps="$steps" \
      --training.eval_every=0 --checkpoint.every=0 --data.prefetch=$k >"$work/$name.out"
    python3 -S - "$work/$name/metrics.jsonl" "$cache" "$k" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()][1:]
wait = sum(r["data_wait_ms"] for r in rows) / len(rows)
step = sum(r["step_ms"] for r in rows) / len(rows)
print(f"| {sys.argv[2]:<6} | {sys.argv[3]:<8} | {wait:12.3f} | {step:10.1f} | {100 * wait / step:9.3f}% |")
PY
  done
done
