#!/usr/bin/env bash
# `loom serve` under load: gpt-mini (n_layer 4, d_model 256, seq 256; weights of one training
# step: speed does not depend on them) behind continuous batching, f32 and int8 weights
# (--quantize int8), 1, 4, 16 and 64 concurrent streaming clients, each asking for TOKENS
# tokens from a short prompt, REQUESTS requests per client. Prints aggregate tokens/s, its
# ratio to 1 client, and p50/p99 time to first token and per token (client side, from the
# server-sent events).
# Usage: bench/serve_throughput.sh [TOKENS [REQUESTS]]
set -euo pipefail
cd "$(dirname "$0")/.."
tokens=${1:-64}
requests=${2:-4}
steps=1
source bench/common.sh
gpt_mini_run mini 1 --training.micro_batch=16 --checkpoint.every=1
serve() {
  $loom serve --model mini="$work/mini/checkpoints/step_1" --port 0 --job.threads=2 --quantize "$1" > "$work/serve.out" 2>&1 &
  server=$!
  for _ in $(seq 100); do grep -q listening "$work/serve.out" && break; sleep 0.1; done
  port=$(grep -o '127.0.0.1:[0-9]*' "$work/serve.out" | cut -d: -f2)
}
server=
trap '[ -n "$server" ] && kill $server 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
echo "# gpt-mini, $tokens tokens per request, $requests requests per client, $(nproc) cores"
for quant in none int8; do
serve $quant
echo "## weights: $([ $quant = none ] && echo f32 || echo int8)"
/usr/bin/env python3 - "$port" "$tokens" "$requests" <<'PY'
import http.client, json, statistics, sys, threading, time
port, tokens, requests = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])

def one(seed, first, gaps):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    body = json.dumps({"model": "mini", "prompt": "Q: what is", "max_tokens": tokens, "seed": seed,
                       "temperature": 0.8, "stream": True})
    start = time.perf_counter()
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    last, n = start, 0
    for line in r:
        if not line.startswith(b"data: {"):
            continue
        now = time.perf_counter()
        if n == 0: first.append(now - start)
        else: gaps.append(now - last)
        last, n = now, n + 1
    c.close()

def pct(xs, p): return sorted(xs)[min(len(xs) - 1, int(p * len(xs)))] * 1e3

print(f"{'clients':>8} {'tokens/s':>10} {'vs 1':>6} {'ttft p50 ms':>12} {'ttft p99 ms':>12} {'token p50 ms':>13} {'token p99 ms':>13}")
base = None
for clients in (1, 4, 16, 64):
    first, gaps = [], []
    def client(i):
        for k in range(requests): one(1000 * i + k, first, gaps)
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads: t.start()
    for t in threads: t.join()
    rate = clients * requests * tokens / (time.perf_counter() - t0)
    base = base or rate
    print(f"{clients:>8} {rate:>10.0f} {rate / base:>5.1f}x {pct(first, .5):>12.1f} {pct(first, .99):>12.1f} "
          f"{pct(gaps, .5):>13.2f} {pct(gaps, .99):>13.2f}")
PY
kill $server; wait $server 2>/dev/null || true; server=
done
