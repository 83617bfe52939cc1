#!/usr/bin/env bash
# Checkpoint save and load against the disk's own bandwidth, and the training stall of a
# synchronous save against an asynchronous one (issue 14, items 3 and 9), in one run:
#   1. the disk: dd writes 1 GiB with fdatasync, then (page cache dropped) reads it back;
#   2. NP data-parallel ranks (ZeRO 1) train a 25.4M-parameter GPT (gpt-mini with n_layer 8,
#      d_model 512: a 305 MB checkpoint of weights and AdamW moments) for 20 steps of 4 x NP
#      sequences, saving every 4 (so that an async save is done before the next is asked
#      for), once with synchronous saves and once with [checkpoint] async;
#   3. a resume from the last checkpoint, the page cache dropped first (when allowed);
#   4. dd filling one fresh 192 MiB buffer: the rate this machine writes memory a process
#      never touched, which bounds a resume (it fills its share into such memory).
# Reports each rank's save and load GB/s (rank 0's share of the tensors over the time of
# its write or read, hashing included) against the disk, and the median ckpt_stall_ms (the
# time a save stopped training, reported on the next step's line) of each mode.
# Usage: bench/checkpoint_save.sh [NP]
set -euo pipefail
cd "$(dirname "$0")/.."
np=${1:-2}
steps=20
source bench/common.sh

drop_caches() { sync; echo 1 > /proc/sys/vm/drop_caches 2>/dev/null && echo dropped || echo kept; }

dd if=/dev/zero of="$work/dd" bs=4M count=256 conv=fdatasync 2> "$work/dd_write.txt"
# What filling fresh memory costs (a resume writes a rank's share into memory it never
# touched): dd with one 192 MiB buffer, written once (allocation and first touch).
dd if=/dev/zero of=/dev/null bs=192M count=1 2> "$work/dd_touch.txt"
cache=$(drop_caches)
dd if="$work/dd" of=/dev/null bs=4M 2> "$work/dd_read.txt"
rm -f "$work/dd"

model="--model.n_layer=8 --model.d_model=512 --model.n_head=8 --model.seq_len=64 --training.micro_batch=1"
for mode in sync async; do
  $loom launch -n "$np" -- $loom train configs/gpt-mini.toml --job.run_dir="$work" --job.name="$mode" \
    --job.threads=1 $model --training.steps=$steps --training.global_batch=$((4 * np)) --training.eval_every=0 \
    --parallel.zero=1 --checkpoint.every=4 --checkpoint.keep=0 --checkpoint.async=$([ $mode = async ] && echo true || echo false) \
    > "$work/$mode.out" 2>&1
done
load_cache=$(drop_caches)
$loom launch -n "$np" -- $loom train configs/gpt-mini.toml --job.run_dir="$work" --job.name=sync \
  --job.threads=1 $model --training.steps=$((steps + 1)) --training.global_batch=$((4 * np)) --training.eval_every=0 \
  --parallel.zero=1 --checkpoint.every=0 --resume > "$work/resume.out" 2>&1

python3 - "$work" "$np" "$cache" "$load_cache" <<'PY'
import json, re, statistics, sys
work, np, cache, load_cache = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]

def dd_gbs(path):  # dd's last line: "... bytes (...) copied, 1.2 s, 850 MB/s"
    m = re.search(r"(\d+) bytes.*copied, ([\d.]+) s", open(path).read())
    return int(m.group(1)) / float(m.group(2)) / 1e9

def figures(path, pattern):
    return [float(x) for x in re.findall(pattern, open(path).read())]

disk_w, disk_r = dd_gbs(f"{work}/dd_write.txt"), dd_gbs(f"{work}/dd_read.txt")
touch = dd_gbs(f"{work}/dd_touch.txt")
print(f"disk: write {disk_w:.2f} GB/s (1 GiB, fdatasync), read {disk_r:.2f} GB/s (page cache {cache}); "
      f"fresh memory first written at {touch:.2f} GB/s (dd, one 192 MiB buffer)")
stall = {}
for mode in ("sync", "async"):
    rows = [json.loads(l) for l in open(f"{work}/{mode}/metrics.jsonl")]
    stalls = [r["ckpt_stall_ms"] for r in rows if "ckpt_stall_ms" in r]
    step = [r["step_ms"] for r in rows if "ckpt_stall_ms" not in r][1:]
    stall[mode] = statistics.median(stalls)
    gbs = figures(f"{work}/{mode}.out", r"wrote [\d.]+ MiB of tensors in [\d.]+ ms \(([\d.e+-]+) GB/s\)")
    mib = figures(f"{work}/{mode}.out", r"wrote ([\d.]+) MiB of tensors")
    print(f"{mode:5s} save: rank 0 wrote {mib[-1]:.1f} MiB per save at {sum(gbs)/len(gbs):.2f} GB/s "
          f"({sum(gbs)/len(gbs)/disk_w:.0%} of the disk's write); training stalled {stall[mode]:.1f} ms per save "
          f"(median of {len(stalls)}: {', '.join(f'{x:.0f}' for x in stalls)}; a step without one: "
          f"{sum(step)/max(1,len(step)):.1f} ms)")
print(f"async stall / sync stall: {stall['async'] / stall['sync']:.1%} (goal <= 10%)")
load = figures(f"{work}/resume.out", r"read [\d.]+ MiB of shards in [\d.]+ ms \(([\d.e+-]+) GB/s\)")
mib = figures(f"{work}/resume.out", r"read ([\d.]+) MiB of shards")
print(f"load: rank 0 read {mib[0]:.1f} MiB at {load[0]:.2f} GB/s ({load[0]/disk_r:.0%} of the disk's read, "
      f"{load[0]/touch:.0%} of the fresh-memory rate; page cache {load_cache}; goal >= 80% of the disk's)")
PY
