#!/usr/bin/env bash
# Cold vs warm start from remote shards (docs/data.md, "Remote shards"): the fortunes
# through run.sh's BPE, prepared into shards of 100k tokens, served by nginx on loopback
# (this script starts it on a free port and stops it). Times `loom data fetch` into an
# empty cache (cold) and again (warm), and 20 steps of gpt-mini-bpe on one process reading
# the shards through an empty cache (prefetch fetches them as batches need them) and a
# warm one.
# Usage: bench/remote_start.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh
text=/usr/share/games/fortunes
[ -f data/fortunes-bpe/encoder.json ] || $loom tokenizer train text:$text --vocab-size 4096 --out data/fortunes-bpe >/dev/null
$loom data prepare text:$text --tokenizer data/fortunes-bpe --out "$work/srv/ds" --shard-tokens 100000 >/dev/null
port=$(python3 -S -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
mkdir -p "$work/nginx"
cat >"$work/nginx/nginx.conf" <<CONF
daemon off; master_process off; worker_processes 1; pid $work/nginx/pid; error_log $work/nginx/error.log;
events { worker_connections 64; }
http { access_log off; client_body_temp_path $work/nginx; proxy_temp_path $work/nginx; fastcgi_temp_path $work/nginx;
  uwsgi_temp_path $work/nginx; scgi_temp_path $work/nginx;
  server { listen 127.0.0.1:$port; root $work/srv; } }
CONF
/usr/sbin/nginx -e "$work/nginx/error.log" -p "$work/nginx" -c "$work/nginx/nginx.conf" &
nginx=$!
trap 'kill $nginx 2>/dev/null; rm -rf "$work"' EXIT
python3 -S - "$work/srv/ds/train.json" "$work/remote.json" "http://127.0.0.1:$port/ds/" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
for s in m["shards"]:
    s["url"] = sys.argv[3] + s.pop("path")
json.dump(m, open(sys.argv[2], "w"))
PY
sleep 0.5
bytes=$(du -cb "$work"/srv/ds/train-*.bin | tail -1 | cut -f1)
secs() { local t0=$(date +%s.%N); "$@" >/dev/null; echo "$(date +%s.%N) - $t0" | bc; }
echo "# $(ls "$work"/srv/ds/train-*.bin | wc -l) shards, $bytes bytes, nginx on loopback"
echo "data fetch, cold: $(secs $loom data fetch "$work/remote.json" --cache-dir "$work/c1") s"
echo "data fetch, warm: $(secs $loom data fetch "$work/remote.json" --cache-dir "$work/c1") s"
train() {
  $loom train configs/gpt-mini-bpe.toml --quiet --job.run_dir="$work" --job.name="$1" --data.train="$work/remote.json" \
    --data.val= --data.tokenizer=data/fortunes-bpe --data.cache_dir="$2" --training.steps=20 --training.eval_every=0 \
    --checkpoint.every=0
}
echo "20 steps, cold cache: $(secs train cold "$work/c2") s"
echo "20 steps, warm cache: $(secs train warm "$work/c2") s"
python3 -S - "$work/cold/metrics.jsonl" "$work/warm/metrics.jsonl" <<'PY'
import json, sys
for name, f in zip(["cold", "warm"], sys.argv[1:]):
    rows = [json.loads(l) for l in open(f) if l.strip()]
    print(f"{name}: data_wait_ms step 1 {rows[0]['data_wait_ms']:.1f}, steps 2-20 mean {sum(r['data_wait_ms'] for r in rows[1:]) / (len(rows) - 1):.3f}")
PY
