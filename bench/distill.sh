#!/usr/bin/env bash
# Distillation (issue 15, item 7): a gpt-nano student (n_layer 2, d_model 64, seq 64) trained
# STEPS steps on fortunes alone, and distilled from gpt-mini as the main job trains it
# (configs/gpt-mini.toml, 400 steps on 2 ranks; or TEACHER) with several alpha and
# temperatures; the same data order, batch and learning rate. Prints each student's
# validation loss (nats per byte, the whole validation file) and its change against alone.
# Usage: bench/distill.sh [STEPS [TEACHER]]
set -euo pipefail
cd "$(dirname "$0")/.."
student_steps=${1:-300}
teacher=${2:-}
source bench/common.sh
if [ -z "$teacher" ]; then
  $loom launch -n 2 -- $loom train configs/gpt-mini.toml --quiet --job.run_dir="$work" --job.name=teacher \
    --job.threads=1 --training.eval_every=0 > "$work/teacher.out" 2>&1
  teacher="$work/teacher"
fi
val() { $loom eval --checkpoint "$1" --data data/fortunes_val.bin --batch 16 | python3 -c "import json,sys; print(json.load(sys.stdin)['loss'])"; }
echo "# gpt-nano student, $student_steps steps; teacher: $(val "$teacher") validation loss"
printf "%-28s %10s %8s\n" student val_loss change
alone=
for run in "alone" "0.5 1" "0.9 1" "0.5 2" "0.9 2"; do
  set -- $run
  flags=$([ "$1" = alone ] && true || echo "--training.teacher=$teacher --training.distill_alpha=$1 --training.distill_temperature=$2")
  name=$(echo "$run" | tr ' ' _)
  $loom train configs/gpt-nano.toml --quiet --job.run_dir="$work" --job.name="s$name" --job.threads=2 \
    --training.steps="$student_steps" --training.eval_every=0 --checkpoint.every=0 $flags > /dev/null
  loss=$(val "$work/s$name")
  alone=${alone:-$loss}
  label=$([ "$1" = alone ] && echo "alone" || echo "distilled, alpha $1, T $2")
  printf "%-28s %10.4f %7.1f%%\n" "$label" "$loss" "$(python3 -c "print(100 * ($loss - $alone) / $alone)")"
done
