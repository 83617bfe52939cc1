#!/usr/bin/env bash
# `loom serve` under load: gpt-mini (n_layer 4, d_model 256, seq 256; weights of one training
# step: speed does not depend on them) behind continuous batching, f32 and int8 weights
# (--quantize int8), THREADS compute threads (the server's default: as many decoding lanes of
# one thread each), 1, 4, 16 and 64 concurrent streaming clients (`loom bench serve`: C++
# threads, so that the clients take little of the cores the server runs on), each asking for
# TOKENS tokens from a short prompt over one kept-alive connection (as pooling clients such as
# OpenAI's SDK and vLLM's benchmark client do; KEEP_ALIVE=0 opens a connection per request),
# REQUESTS requests per client. Prints aggregate tokens/s, its ratio to 1 client, and p50/p99
# time to first token and per token (client side, from the server-sent events). Then the model
# alone at the same batch sizes (`loom bench decode`: one batch on all threads, then in lanes
# as the server runs it, f32 and int8), for what the server adds.
# Usage: bench/serve_throughput.sh [TOKENS [REQUESTS [THREADS]]]
set -euo pipefail
cd "$(dirname "$0")/.."
tokens=${1:-64}
requests=${2:-4}
threads=${3:-2}
keep_alive=$([ "${KEEP_ALIVE:-1}" = 0 ] || echo --keep-alive)
steps=1
source bench/common.sh
gpt_mini_run mini 1 --training.micro_batch=16 --checkpoint.every=1
server=
trap '[ -n "$server" ] && kill $server 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
echo "# gpt-mini, $tokens tokens per request, $requests requests per client, $threads compute threads, $(nproc) cores, ${keep_alive:-a connection per request}"
for quant in none int8; do
  $loom serve --model mini="$work/mini/checkpoints/step_1" --port 0 --job.threads="$threads" --quantize $quant \
    > "$work/serve.out" 2>&1 &
  server=$!
  for _ in $(seq 100); do grep -q listening "$work/serve.out" && break; sleep 0.1; done
  port=$(grep -o '127.0.0.1:[0-9]*' "$work/serve.out" | cut -d: -f2)
  echo "## weights: $([ $quant = none ] && echo f32 || echo int8)"
  $loom bench serve --port "$port" --model mini --tokens "$tokens" --requests "$requests" --clients 1 4 16 64 $keep_alive | tail -n +2
  kill $server; wait $server 2>/dev/null || true; server=
done
echo "## the model alone (Gpt::decode_batch), f32"
$loom bench decode --threads "$threads" --batch 1 4 16 --from 10 --to $((10 + tokens)) --steps 2000 | tail -n +2
echo "## the model alone as the server runs it: $threads lanes side by side, each its share of the sequences, f32"
$loom bench decode --threads "$threads" --batch 1 4 16 --from 10 --to $((10 + tokens)) --steps 2000 --lanes "$threads" | tail -n +3
echo "## the same, int8"
$loom bench decode --threads "$threads" --batch 1 4 16 --from 10 --to $((10 + tokens)) --steps 2000 --lanes "$threads" --quantize int8 | tail -n +3
