# PyTorch peer for one gpt2-124m training step (micro-batch 1, seq 1024, fp32 AdamW, random
# tokens): the model and loop of ../shared/peers/torch_gpt.py, run in this process with GPT-2
# small's shape (vocab 50257, seq 1024, 12 layers, 12 heads, d_model 768).
# Usage: /usr/bin/python3 bench/torch_gpt2_step.py PEERS_DIR THREADS STEPS WARMUP
import queue
import sys

sys.path.insert(0, sys.argv[1])
import torch_gpt  # noqa: E402

torch_gpt.CFG = dict(vocab=50257, T=1024, L=12, H=12, d=768)
torch_gpt.B = 1
threads, steps, warmup = (int(a) for a in sys.argv[2:5])
q = queue.Queue()
torch_gpt.train(0, 1, threads, steps, warmup, "", q)
_, median_s, best_s, rss_mb, *_ = q.get()
print(f"threads={threads} tokens_per_s={1024 / median_s:.0f} median_s={median_s:.2f} best_s={best_s:.2f} rss_mb={rss_mb:.0f}")
