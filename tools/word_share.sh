#!/usr/bin/env bash
# The share of SAMPLE's whitespace-separated words that occur as whitespace-separated
# words in the training text (FILE or directory of text files): what issue 43 asks of the
# main job's samples (>= 70%). Only pieces holding a letter count as words (a fortune
# file's "%" separators and the sample's punctuation do not pad the share). Prints
# "P% of N words"; exit 1 when P < MIN (default 0).
# Usage: tools/word_share.sh SAMPLE TEXT [MIN]
set -euo pipefail
sample=$1 text=$2 min=${3:-0}
files=$( [ -d "$text" ] && find "$text" -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | sort || echo "$text")
# shellcheck disable=SC2086
LC_ALL=C awk -v min="$min" '
  FNR == NR { for (i = 1; i <= NF; ++i) seen[$i] = 1; next }
  { for (i = 1; i <= NF; ++i) if ($i ~ /[A-Za-z]/) { n++; if ($i in seen) found++ } }
  END {
    share = n ? 100 * found / n : 0
    printf "%.1f%% of %d words\n", share, n
    exit share + 1e-9 < min ? 1 : 0
  }' <(cat $files) "$sample"
