# Sourced by the training benchmarks after they cd to the project root: the release loom
# (built if missing; LOOM=path: that binary instead), the fortunes token file (prepared if
# missing, from TEXT: Debian's fortunes unless given; the GPU machine has none and passes
# the repository's docs), and a scratch directory $work removed on exit.
loom=${LOOM:-build/release/loom}
if [ ! -x "$loom" ]; then
  [ -z "${LOOM:-}" ] || { echo "LOOM=$LOOM: not an executable" >&2; exit 1; }
  cmake --preset release >/dev/null && cmake --build --preset release --target loom
fi
[ -f data/fortunes.bin ] || $loom data prepare "text:${TEXT:-/usr/share/games/fortunes}" --out data/fortunes.bin
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# gpt_mini_run NAME RANKS FLAGS...: `loom launch -n RANKS -- loom train configs/gpt-mini.toml`
# with one compute thread per rank, global batch 16, no evaluation or checkpoints, $steps
# steps (set by the caller), into $work/NAME (its output in $work/NAME.out).
gpt_mini_run() {
  local name=$1 np=$2
  shift 2
  $loom launch -n "$np" -- $loom train configs/gpt-mini.toml --quiet --job.run_dir="$work" --job.name="$name" \
    --job.threads=1 --training.steps="$steps" --training.global_batch=16 --training.eval_every=0 \
    --checkpoint.every=0 "$@" > "$work/$name.out"
}

