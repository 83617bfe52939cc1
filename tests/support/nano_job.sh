# Sourced by the shell tests that run small deterministic jobs under a scheduler
# (slurm_test.sh, k8s_test.sh): a byte-level corpus and a gpt-nano config around it.

# nano_corpus DIR LOOM: DIR/train.bin and DIR/train_val.bin from 400 numbered lines.
nano_corpus() {
  for i in $(seq 1 400); do echo "The quick brown fox $i jumps over the lazy dog."; done >"$1/text.txt"
  "$2" data prepare "text:$1/text.txt" --out "$1/train.bin" >/dev/null
}

# nano_config FILE DIR JOB_LINES TRAINING_LINES [MORE_TOML]: gpt-nano on DIR's corpus, one
# compute thread a rank, global batch 4 of micro-batches of 1, no evaluation or periodic
# checkpoint, deterministic; the [job] and [training] lines given go in their tables.
nano_config() {
  cat >"$1" <<TOML
[job]
threads = 1
$3
[model]
preset = "gpt-nano"
[data]
train = "$2/train.bin"
val = "$2/train_val.bin"
[training]
global_batch = 4
micro_batch = 1
eval_every = 0
$4
[checkpoint]
every = 0
[parallel]
deterministic = true
${5:-}
TOML
}
