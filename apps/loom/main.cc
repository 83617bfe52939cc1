// loom: the command-line interface (DESIGN.md section 4). The only place that parses
// flags; every loom::Error is caught here and printed as one line
// ("loom: error: ..."), exiting 2 for bad input and 1 for runtime failures.
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "commands.h"
#include "config.h"
#include "loom/checkpoint/outputs.h"
#include "loom/comm/rendezvous.h"
#include "loom/data/data.h"
#include "loom/core/error.h"
#include "loom/core/host.h"

namespace {

// CLI11 leaves unknown "--section.key=value" flags in remaining(); anything else is an error.
std::vector<std::string> overrides_of(const CLI::App& app) {
  std::vector<std::string> out;
  for (const std::string& s : app.remaining()) {
    if (!s.starts_with("--") || s.find('=') == std::string::npos || s.find('.') == std::string::npos)
      throw loom::InputError(loom::cat("unexpected argument ", s, " (overrides are --section.key=value)"));
    out.push_back(s);
  }
  return out;
}

// LOOM_HOST_MEMORY=SIZE (bytes, or with K, M, G or T): the memory every check takes this
// host to have free, in place of what it measures (docs/errors.md, "Limits that follow the
// machine"). Ranks inherit it from the launcher.
void apply_host_memory_budget() {
  const char* v = std::getenv("LOOM_HOST_MEMORY");
  if (v == nullptr || *v == '\0') return;
  char* end = nullptr;
  double bytes = std::strtod(v, &end);
  const std::string unit(end);
  const std::string units = "KMGT";
  if (unit.size() == 1 && units.find(unit[0]) != std::string::npos) bytes *= std::pow(1024.0, 1 + units.find(unit[0]));
  if (end == v || (unit.size() > 0 && (unit.size() != 1 || units.find(unit[0]) == std::string::npos)) ||
      !std::isfinite(bytes) || bytes < 1)
    throw loom::InputError(loom::cat("LOOM_HOST_MEMORY = \"", loom::printable(v),
                                     "\": expected a size in bytes, or with K, M, G or T (e.g. 16G)"));
  loom::set_memory_budget(bytes);
}

int run(int argc, char** argv) {
  apply_host_memory_budget();
  CLI::App app{"Loom: distributed deep-learning training in C++.\n"
               "Config precedence: built-in defaults < CONFIG.toml < --section.key=value."};
  app.require_subcommand(1);
  app.set_version_flag("--version", "loom 0.1.0");

  loom::app::TrainArgs train;
  auto* t = app.add_subcommand("train", "Train a model in this process (see configs/ for presets)");
  t->add_option("config", train.config, "TOML config file")->required();
  t->add_flag("--resume", train.resume, "Continue the run in the run directory from its latest checkpoint");
  t->add_flag("--resume-if-saved", train.resume_if_saved,
              "Resume when the run has a checkpoint, else start it (in place when its directory exists): for a scheduler "
              "that restarts the same command (Kubernetes)");
  t->add_flag("--restart", train.restart,
              "Start afresh under an existing job name: the old run directory is kept aside as NAME.old-TIME");
  t->add_flag("--quiet", train.quiet, "No progress output");
  t->add_flag("--allow-nonfinite", train.allow_nonfinite,
              "Resume even from a checkpoint whose weights or optimizer state hold NaN or Inf");
  t->add_option("--init-from", train.init_from,
                "Start from these weights (a checkpoint, run directory or .safetensors, any layout): step 0, a fresh "
                "optimizer");
  t->add_option("--ps-join", train.ps_join,
                "Join the running parameter-server job (async or ssp) whose store is at HOST:PORT as one more worker "
                "(LOOM_SECRET_FILE and LOOM_JOB_ID as the job's)");
  t->add_flag("--dry-run", train.dry_run,
              "Check the config and print the memory each rank and this host will need; load and write nothing");
  t->allow_extras();
  t->footer("Any config key may be overridden: --training.steps=50 --job.name=try2");

  loom::app::SampleArgs sample;
  auto* s = app.add_subcommand("sample", "Generate text from a GPT checkpoint or safetensors file");
  s->add_option("--checkpoint", sample.checkpoint, "Step directory, checkpoint root, run directory or .safetensors")->required();
  s->add_option("--config", sample.config, "Config for the model shape of a bare safetensors file (n_head)");
  s->add_option("--prompt", sample.prompt,
                "Text to continue (empty: a newline; token ids separated by spaces for a model without a tokenizer)");
  s->add_option("--tokenizer", sample.tokenizer,
                "Tokenizer for the prompt and output (gpt2:DIR, hf:tokenizer.json, DIR, bytes); default: the checkpoint's");
  s->add_option("--tokens", sample.tokens, "Tokens to generate")->capture_default_str();
  s->add_option("--lines", sample.lines, "Stop after this many generated lines (0: no limit)")->capture_default_str();
  s->add_option("--temperature", sample.temperature, "Softmax temperature")->capture_default_str();
  s->add_option("--top-k", sample.top_k, "Sample among the k likeliest tokens (0: all)")->capture_default_str();
  s->add_option("--top-p", sample.top_p, "Then among the fewest likeliest tokens holding this share of the probability")
      ->capture_default_str();
  s->add_option("--seed", sample.seed, "Sampling seed")->capture_default_str();
  s->add_option("--quantize", sample.quantize, "none, or int8: compute with int8 weights quantized at load")
      ->capture_default_str();
  s->add_flag("!--no-kv-cache", sample.kv_cache,
              "Recompute the whole window for every token instead of decoding with the key/value cache");
  s->allow_extras();

  loom::app::ServeArgs serve;
  auto* v = app.add_subcommand("serve", "OpenAI-style completions server for GPT checkpoints (docs/serving.md)");
  v->add_option("--model", serve.models, "NAME=PATH: a step directory, checkpoint root, run directory or .safetensors; "
                                         "repeat for more models")->required();
  v->add_option("--tokenizer", serve.tokenizers,
                "NAME=SPEC: the tokenizer of model NAME (gpt2:DIR, hf:tokenizer.json, DIR, bytes) in place of its "
                "checkpoint's; repeat for more models");
  v->add_option("--host", serve.host, "Address to listen on (other than loopback: needs an API key)")->capture_default_str();
  v->add_option("--port", serve.port, "Port (0: any free port, printed)")->capture_default_str();
  v->add_option("--api-key", serve.api_key, "Require 'Authorization: Bearer KEY' (or set LOOM_API_KEY)");
  v->add_option("--max-tokens", serve.max_tokens, "Largest max_tokens a request may ask for")->capture_default_str();
  v->add_option("--max-body-kb", serve.max_body_kb,
                "Largest request body in KiB (1-65536): a larger one is answered 413 and never kept (read and dropped "
                "up to 4 MiB past the limit, so the client gets the answer)")
      ->capture_default_str();
  v->add_option("--max-connections", serve.max_connections,
                "Connections open at once (1-65536): one past it is closed as it is accepted; an idle or slow one "
                "is dropped 10 s into a request's head (408)")
      ->capture_default_str();
  v->add_option("--max-batch", serve.max_batch, "Most requests decoded together in one step")->capture_default_str();
  v->add_option("--events-nice", serve.events_nice,
                 "Added to the niceness of the thread that writes the tokens between a stream's first and last event "
                 "(0-19): with every core busy the model comes first and a write carries every token made meanwhile")
      ->capture_default_str();
  v->add_option("--lanes", serve.lanes,
                 "Decoding threads per model, each stepping its own share of the batch with [job] threads / lanes "
                 "compute threads (0: [job] threads, one compute thread each)")
      ->capture_default_str();
  v->add_option("--token-budget", serve.token_budget, "Most tokens (rows) one step runs; a prompt's prefill counts each")
      ->capture_default_str();
  v->add_option("--queue", serve.queue, "Requests that may wait for a place; beyond it: 429")->capture_default_str();
  v->add_option("--kv-cache-mb", serve.kv_cache_mb, "Key/value cache memory per model (pages of 16 positions; one window to a full batch of windows)")
      ->capture_default_str();
  v->add_option("--prefix-cache-mb", serve.prefix_cache_mb,
                "Memory per model for prompts' keys and values, kept so that later prompts that begin the same way "
                "(a shared system prompt) compute only the rest (0: none kept)")
      ->capture_default_str();
  v->add_option("--kv-cache-dtype", serve.kv_cache_dtype,
                "f32, or bf16: keep the keys and values in bf16 (half the memory a position takes, and half the "
                "bytes each decoding step reads; logits a few parts in ten thousand from f32's)")
      ->capture_default_str();
  v->add_option("--config", serve.config, "Config for the model shape of a bare safetensors file (n_head)");
  v->add_option("--quantize", serve.quantize, "none, or int8: compute f32 models with int8 weights quantized at load")
      ->capture_default_str();
  v->add_option("--memory-mb", serve.memory_mb,
                "Memory for the models' weights: models load at start while they fit, the rest on their first request, "
                "evicting the least recently used idle ones (0: no limit)")
      ->capture_default_str();
  v->add_option("--route", serve.routes,
                "NAME=A:W,B:W: requests for NAME go to models A, B by weight (a canary: new=A:90,B:10)");
  v->allow_extras();

  loom::app::EvalArgs eval;
  auto* e = app.add_subcommand("eval", "Mean next-token loss of a GPT over every full window of a token file");
  e->add_option("--checkpoint", eval.checkpoint, "Step directory, checkpoint root or .safetensors")->required();
  e->add_option("--data", eval.data, "Token file (llm.c format), or text:PATH read through the model's tokenizer")->required();
  e->add_option("--tokenizer", eval.tokenizer, "Tokenizer for text:PATH (default: the checkpoint's)");
  e->add_option("--config", eval.config, "Config for the model shape of a bare safetensors file (n_head)");
  e->add_option("--batch", eval.batch, "Windows per forward pass")->capture_default_str();
  e->add_option("--quantize", eval.quantize, "none, or int8: compute with int8 weights quantized at load")
      ->capture_default_str();
  e->allow_extras();

  loom::app::PruneArgs prune;
  auto* pr = app.add_subcommand("prune", "Remove a GPT's smallest weights (by magnitude) into a new checkpoint");
  pr->add_option("--checkpoint", prune.checkpoint, "Step directory, checkpoint root, run directory or .safetensors")->required();
  pr->add_option("--out", prune.out, "Checkpoint root to write (step_0)")->required();
  pr->add_option("--sparsity", prune.sparsity, "Share of each linear layer's weights (or rows, or heads) to remove")
      ->capture_default_str();
  pr->add_option("--structured", prune.structured,
                 "none: single weights; rows: whole output channels; heads: whole attention heads")->capture_default_str();
  pr->add_option("--config", prune.config, "Config for the model shape of a bare safetensors file (n_head)");
  pr->allow_extras();

  loom::app::QuantizeArgs quantize;
  auto* qu = app.add_subcommand("quantize", "Write a GPT with int8 weights (per output channel) as a new checkpoint");
  qu->add_option("--checkpoint", quantize.checkpoint, "Step directory, checkpoint root, run directory or .safetensors")
      ->required();
  qu->add_option("--out", quantize.out, "Checkpoint root to write (step_0)")->required();
  qu->add_option("--config", quantize.config, "Config for the model shape of a bare safetensors file (n_head)");
  qu->allow_extras();

  loom::app::CkptArgs ckpt;
  auto* ck = app.add_subcommand("ckpt", "Check, describe or export a checkpoint (any layout)");
  ck->require_subcommand(1);
  auto* ckv = ck->add_subcommand("verify", "Read every file of a checkpoint and check its size, hash and the index");
  auto* cki = ck->add_subcommand("inspect", "Print a checkpoint's step, layout, files and tensors");
  auto* cke = ck->add_subcommand("export", "Write a checkpoint's weights as one safetensors file (Hugging Face names)");
  for (auto* sub : {ckv, cki, cke})
    sub->add_option("checkpoint", ckpt.path, "Step directory, checkpoint root, run directory or .safetensors")->required();
  cke->add_option("--out", ckpt.out, "The file to write (.safetensors, or .onnx with --format onnx)")->required();
  cke->add_option("--format", ckpt.format, "safetensors (the weights), or onnx (the GPT as an ONNX graph, opset 17)")
      ->capture_default_str();
  cke->allow_extras();

  auto* d = app.add_subcommand("data", "Prepare datasets");
  d->require_subcommand(1);
  loom::app::DataPrepareArgs prepare;
  auto* dp = d->add_subcommand("prepare", "Tokenize text into llm.c token files (OUT.bin and OUT_val.bin) or a sharded dataset (docs/data.md)");
  dp->add_option("sources", prepare.sources,
                 "text:PATH (a file, a directory of text files, a glob) or jsonl:PATH[:FIELD], one or more")->required();
  dp->add_option("--out", prepare.out,
                 "A token file (the validation file gets _val before .bin), or with --shard-tokens (or a directory: an "
                 "existing one, or a path ending in /) a directory of shards with train.json and val.json manifests")
      ->required();
  dp->add_option("--shard-tokens", prepare.shard_tokens, "Write a sharded dataset into --out, this many tokens per shard")
      ->capture_default_str();
  dp->add_option("--threads", prepare.threads, "Encoding threads (0: the cores available)")->capture_default_str();
  dp->add_option("--val-fraction", prepare.val_fraction, "Share of each file held out for validation")->capture_default_str();
  dp->add_option("--tokenizer", prepare.tokenizer,
                 "bytes, gpt2:DIR, hf:tokenizer.json, or a directory from loom tokenizer train")
      ->capture_default_str();

  loom::app::DataFetchArgs fetch;
  auto* df = d->add_subcommand("fetch", "Check a dataset's shards against its manifest, downloading remote ones into the cache");
  df->add_option("manifest", fetch.manifest, "A dataset manifest (.json)")->required();
  df->add_option("--cache-dir", fetch.cache_dir, "Cache directory (default: $LOOM_CACHE_DIR or ~/.cache/loom/shards)");
  df->add_option("--cache-mb", fetch.cache_mb, "The cache's size bound in MiB")->capture_default_str();
  df->add_option("--retries", fetch.retries, "Attempts after a failed one, each after twice the pause (0.5 s first)")
      ->capture_default_str();

  loom::app::ReportArgs report;
  auto* rp = app.add_subcommand("report", "Write one HTML page about runs: losses, throughput, MFU, time split, memory, "
                                          "restarts, checkpoints, cost, scaling (docs/observability.md)");
  rp->add_option("runs", report.runs, "Run directories (runs/NAME), one or more")->required();
  rp->add_option("--out", report.out, "The HTML file (default: RUN/report.html for one run, report.html for several)");
  rp->add_option("--price-per-hour", report.price_per_hour, "Price of one rank (a GPU, a socket) per hour: cost per step and per 1M tokens");
  rp->add_option("--peak-gflops", report.peak_gflops, "Peak GFLOP/s of one rank (loom bench gemm measures it): MFU");

  loom::app::TokenizerArgs tok;
  auto* tk = app.add_subcommand("tokenizer", "Train a byte-level BPE tokenizer, or encode and decode text (docs/data.md)");
  tk->require_subcommand(1);
  auto* tkt = tk->add_subcommand("train", "Train a byte-level BPE (GPT-2's kind) on text; writes OUT/encoder.json and OUT/vocab.bpe");
  tkt->add_option("sources", tok.sources, "text:PATH (a file or a directory of text files), one or more")->required();
  tkt->add_option("--vocab-size", tok.vocab_size, "Ids in all: 256 bytes, the merges and <|endoftext|>")->capture_default_str();
  tkt->add_option("--min-frequency", tok.min_frequency, "A pair seen fewer times is never merged")->capture_default_str();
  tkt->add_option("--out", tok.out, "Directory to write the tokenizer into (new, or without a tokenizer)")->required();
  auto* tke = tk->add_subcommand("encode", "Print the ids of FILE's text, separated by spaces");
  auto* tkd = tk->add_subcommand("decode", "Print the text of the ids in FILE (separated by whitespace)");
  for (auto* sub : {tke, tkd}) {
    sub->add_option("--tokenizer", tok.tokenizer, "bytes, gpt2:DIR, hf:tokenizer.json, or a directory from loom tokenizer train")
        ->required();
    sub->add_option("file", tok.file, "Input file (-: standard input)")->capture_default_str();
  }
  tke->add_flag("--stats", tok.stats, "Print bytes, ids, seconds and MB/s as JSON on stderr instead of the ids");
  tke->add_option("--repeat", tok.repeat, "Encode this many times, each with an empty cache; --stats gives the fastest")
      ->capture_default_str();

  auto* b = app.add_subcommand("bench", "Benchmarks (see bench/ and docs/perf.md)");
  b->require_subcommand(1);
  loom::app::BenchTrainArgs bench_train;
  auto* bt = b->add_subcommand("train", "GPT training tokens/s and MFU against the measured sgemm peak");
  bt->add_option("--preset", bench_train.preset, "Model preset")->capture_default_str();
  bt->add_option("--threads", bench_train.threads, "Thread counts to run")->capture_default_str();
  bt->add_option("--micro-batch", bench_train.micro_batch, "Sequences per step")->capture_default_str();
  bt->add_option("--steps", bench_train.steps, "Timed steps (median reported)")->capture_default_str();
  bt->add_option("--warmup", bench_train.warmup, "Untimed steps first")->capture_default_str();
  bt->add_option("--peak-gflops", bench_train.peak_gflops, "Use this sgemm peak instead of measuring it");
  bt->add_option("--recompute", bench_train.recompute, "Activation recompute modes: none selective full")
      ->capture_default_str()->check(CLI::IsMember({"none", "selective", "full"}));
  bt->add_option("--gemm-path", bench_train.gemm_path, "Loom's micro-kernels (as job.gemm_path): auto, amx, avx512_bf16, avx512, avx2, generic")
      ->check(CLI::IsMember({"auto", "amx", "avx512_bf16", "avx512", "avx2", "generic"}))->capture_default_str();
  bt->add_option("--shared-pack", bench_train.shared_pack,
                 "Products whose threads each take a band of rows (columns): op(B) (op(A)) packed once for all of them "
                 "(on), by each (off), or once from 4 threads on (auto); the same bits")
      ->check(CLI::IsMember({"auto", "on", "off"}))->capture_default_str();
  bt->add_flag("--breakdown", bench_train.breakdown,
               "Also where the step goes: ms a step in the linear layers, attention, LayerNorms, GELU, embedding/head/loss "
               "and optimizer, forward and backward, each part's speed-up over the first thread count, and how busy "
               "it kept the threads (CPU over wall x threads; run with OMP_WAIT_POLICY=passive to see waits)");
  bt->add_option("--precision", bench_train.precision, "Precisions: fp32 bf16 fp16 (mixed precision)")
      ->capture_default_str()->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  loom::gpu::BenchGpuArgs bench_gpu{.preset = "gpt2-124m"};
  auto* bgpu = b->add_subcommand("gpu", "GPT training on a CUDA GPU (bf16): tokens/s, MFU against the measured cuBLAS bf16 peak, memory");
  bgpu->add_option("--preset", bench_gpu.preset, "Model preset")->capture_default_str();
  bgpu->add_option("--micro-batch", bench_gpu.micro_batch, "Sequences per step")->capture_default_str();
  bgpu->add_option("--steps", bench_gpu.steps, "Timed steps (median reported)")->capture_default_str();
  bgpu->add_option("--warmup", bench_gpu.warmup, "Untimed steps first")->capture_default_str();
  bgpu->add_option("--device", bench_gpu.device, "CUDA device")->capture_default_str();
  bgpu->add_option("--peak-tflops", bench_gpu.peak_tflops, "Use this bf16 peak instead of measuring it");
  bgpu->add_flag("--profile", bench_gpu.profile, "Also the device time of each phase of the step (CUDA events)");
  std::string gpu_attention = "mma";
  bgpu->add_option("--attention", gpu_attention,
                   "The attention's kernels: mma (scores in registers), mma-x4 (mma's bits, its fragments by ldmatrix.x4) or wmma")
      ->check(CLI::IsMember({"mma", "mma-x4", "wmma"}))->capture_default_str();
  std::string gpu_epilogues = "cublaslt";
  bgpu->add_option("--epilogues", gpu_epilogues, "The products' epilogues: cublaslt (fused) or kernels (Loom's, after each)")
      ->check(CLI::IsMember({"cublaslt", "kernels"}))->capture_default_str();
  std::vector<int64_t> gemm_threads = {1, 2};
  auto* bg = b->add_subcommand("gemm", "Loom's GEMM beside OpenBLAS: square 2048 and every GEMM shape of gpt-mini and gpt2-124m, with the FMA peak");
  bg->add_option("--threads", gemm_threads, "Thread counts to run")->capture_default_str();
  std::string gemm_path = "auto";
  bg->add_option("--path", gemm_path, "Loom's micro-kernels: auto, amx, avx512_bf16, avx512, avx2, generic")
      ->check(CLI::IsMember({"auto", "amx", "avx512_bf16", "avx512", "avx2", "generic"}))->capture_default_str();
  std::string gemm_shared_pack = "auto";
  bg->add_option("--shared-pack", gemm_shared_pack, "As loom bench train's: on, off or auto")
      ->check(CLI::IsMember({"auto", "on", "off"}))->capture_default_str();

  loom::app::BenchDecodeArgs bench_decode;
  auto* bd = b->add_subcommand("decode", "Batched decoding (Gpt::decode_batch, as loom serve runs it): tokens/s per batch size");
  bd->add_option("--preset", bench_decode.preset, "Model preset")->capture_default_str();
  bd->add_option("--batch", bench_decode.batch, "Sequences per step to run")->capture_default_str();
  bd->add_option("--threads", bench_decode.threads, "Thread counts to run")->capture_default_str();
  bd->add_option("--from", bench_decode.from, "Prompt tokens of each sequence; it decodes from there")->capture_default_str();
  bd->add_option("--to", bench_decode.to, "Position where a sequence ends and starts again")->capture_default_str();
  bd->add_option("--steps", bench_decode.steps, "Timed steps")->capture_default_str();
  bd->add_option("--warmup", bench_decode.warmup, "Untimed steps first")->capture_default_str();
  bd->add_option("--quantize", bench_decode.quantize, "none, or int8 weights")->capture_default_str();
  bd->add_flag("--grouped", bench_decode.grouped, "Each compute thread decodes a group of the sequences whole (Gpt::decode_grouped)");
  bd->add_option("--lanes", bench_decode.lanes,
                 "Decoding threads side by side, each stepping batch / lanes sequences with threads / lanes compute "
                 "threads (loom serve --lanes)")
      ->capture_default_str();
  bd->add_flag("--plain", bench_decode.plain,
               "f32 weights read in place, not laid out in panels as loom serve and loom sample have them");
  bd->add_option("--kv-cache-dtype", bench_decode.kv_cache_dtype, "f32, or bf16 keys and values (loom serve --kv-cache-dtype)")
      ->capture_default_str();

  loom::app::BenchServeArgs bench_serve;
  auto* bs = b->add_subcommand("serve", "Streaming clients against a running loom serve: tokens/s and latencies");
  bs->add_option("--host", bench_serve.host, "Address of the server")->capture_default_str();
  bs->add_option("--port", bench_serve.port, "Port of the server")->required();
  bs->add_option("--model", bench_serve.model, "Model name to ask for")->capture_default_str();
  bs->add_option("--clients", bench_serve.clients, "Concurrent clients, one run each")->capture_default_str();
  bs->add_option("--requests", bench_serve.requests, "Completions each client asks for, one after another")->capture_default_str();
  bs->add_option("--tokens", bench_serve.tokens, "max_tokens of each completion")->capture_default_str();
  bs->add_option("--prompt", bench_serve.prompt, "Prompt of each completion")->capture_default_str();
  bs->add_option("--temperature", bench_serve.temperature, "Sampling temperature")->capture_default_str();
  bs->add_flag("--keep-alive", bench_serve.keep_alive,
               "Each client keeps one connection for all its requests (TCP_NODELAY), as pooling HTTP clients do; "
               "without it, a new connection per request");

  loom::app::BenchCommArgs bench_comm;
  auto* bc = b->add_subcommand("comm", "Collective busbw/latency, nccl-tests style; run under `loom launch -n N`");
  bc->add_option("--op", bench_comm.ops, "Collectives: all_reduce all_gather reduce_scatter broadcast reduce all_to_all")
      ->capture_default_str()->delimiter(',');
  bc->add_option("--sizes", bench_comm.sizes, "Sizes in bytes: MIN:MAX (times --factor) or a list 8,4K,4M")->capture_default_str();
  bc->add_option("--factor", bench_comm.factor, "Step between sizes for MIN:MAX (nccl-tests -f)")->capture_default_str();
  bc->add_option("--iters", bench_comm.iters, "Calls per rep; 0 calibrates to ~0.1 s (nccl-tests -n)")->capture_default_str();
  bc->add_option("--min-iters", bench_comm.min_iters, "Calibrated calls per rep never fewer")->capture_default_str();
  bc->add_option("--warmup", bench_comm.warmup, "Untimed calls first; 20 at least for <= 1 MiB (nccl-tests -w)")->capture_default_str();
  bc->add_option("--reps", bench_comm.reps, "Timed reps; the median is reported")->capture_default_str();
  bc->add_option("--dtype", bench_comm.dtype, "f32 f64 bf16 f16 i32 i64 u8")->capture_default_str();
  bc->add_option("--transport", bench_comm.transport, "auto shm tcp")->capture_default_str();
  bc->add_option("--algorithm", bench_comm.algorithm, "auto ring tree shm-direct")->capture_default_str();
  bc->add_option("--shm-slot", bench_comm.shm_slot_bytes, "Shared-memory staging bytes per rank per slot")
      ->capture_default_str();
  bc->add_flag("!--no-check", bench_comm.check, "Skip the correctness check of each size");
  bc->add_flag("!--no-fingerprints", bench_comm.fingerprints,
               "Turn off the mismatched-collective check (to measure what it costs)");
  bc->add_flag("--dirty-inputs", bench_comm.dirty_inputs,
               "Before each call, write every 64-byte line of its input (as a backward pass writes a gradient)");
  bc->add_flag("--shared-inputs", bench_comm.shared_inputs,
               "Put inputs in shared memory (alloc_shared): same-host peers read them in place");
  bc->add_flag("--ab-shared", bench_comm.ab_shared,
               "Alternate each size's reps between an ordinary input and a shared one; print both and the ratio");

  loom::app::PlanArgs plan;
  auto* pl = app.add_subcommand("plan", "Simulate a pipeline schedule: step time, bubble, activation memory per stage, a timeline");
  pl->add_option("--pp", plan.pp, "Pipeline stages")->capture_default_str();
  pl->add_option("--microbatches", plan.microbatches, "Micro-batches per optimizer step")->capture_default_str();
  pl->add_option("--schedule", plan.schedule, "gpipe, 1f1b, interleaved, zb-h1, or all (a comparison)")->capture_default_str();
  pl->add_option("--virtual-stages", plan.virtual_stages, "Model chunks per stage (interleaved)")->capture_default_str();
  pl->add_option("--forward-ms", plan.forward_ms, "One micro-batch's forward through one stage")->capture_default_str();
  pl->add_option("--backward-ms", plan.backward_ms, "... its backward (input and weight gradients)")->capture_default_str();
  pl->add_option("--backward-input-ms", plan.backward_input_ms, "zb-h1: input gradients (0: half of backward)")->capture_default_str();
  pl->add_option("--backward-weight-ms", plan.backward_weight_ms, "zb-h1: weight gradients (0: half of backward)")->capture_default_str();
  pl->add_option("--transfer-ms", plan.transfer_ms, "One activation or gradient between neighbouring stages")->capture_default_str();
  pl->add_option("--overhead-ms", plan.overhead_ms,
                 "Per action, the executor's time outside compute and waits (posting transfers, bookkeeping)")
      ->capture_default_str();
  pl->add_option("--activation-mb", plan.activation_mb, "Saved activations of one micro-batch in one stage")->capture_default_str();
  pl->add_option("--width", plan.width, "Columns of the text timeline")->capture_default_str();
  pl->add_option("--svg", plan.svg, "Also draw the timeline into this SVG file (opens in any browser)");
  pl->add_option("--config", plan.config,
                 "Measure each stage's forward and backward times and activations for this training config's model and "
                 "micro-batch on this machine, instead of --forward-ms/--backward-ms/--activation-mb");

  loom::app::LaunchArgs launch;
  auto* l = app.add_subcommand("launch", "Run N local ranks of a command (torchrun-style environment)");
  l->add_option("-n,--nproc", launch.nproc,
                "Ranks on this node; MIN:MAX starts an elastic job of MIN to MAX ranks (docs/launch.md)")
      ->capture_default_str();
  l->add_option("--max-restarts", launch.max_restarts,
                "Elastic: restarts after a rank fails (from the latest checkpoint, on the ranks left) before the job fails");
  l->add_option("--local", launch.local, "Elastic: ranks this launcher runs (default MAX; 1 with --join)");
  l->add_flag("--join", launch.join, "Elastic: add this launcher's --local ranks to the job coordinated at --master");
  l->add_option("--nnodes", launch.nnodes, "Nodes in the job")->capture_default_str();
  l->add_option("--node-rank", launch.node_rank, "This node's index")->capture_default_str();
  l->add_option("--master", launch.master, "HOST:PORT of the store (node 0 serves it; port 0 picks one)")
      ->capture_default_str();
  l->add_option("--grace", launch.grace_s,
                "Seconds the ranks get after a forwarded SIGTERM (they finish the step, save and exit) before SIGKILL")
      ->capture_default_str();
  l->add_option("--bind", launch.bind,
                 "cores: each local rank's CPU affinity set to its own share of this launcher's cores (SMT siblings "
                 "together), so that no two ranks' threads share a core; none: the scheduler places them")
      ->check(CLI::IsMember({"none", "cores"}))
      ->capture_default_str();
  l->add_option("command", launch.command, "-- CMD ARGS...")->required();
  l->positionals_at_end();

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& help) {
    return app.exit(help);
  } catch (const CLI::CallForAllHelp& help) {
    return app.exit(help);
  } catch (const CLI::ParseError& err) {  // one line, as every other error (DESIGN.md section 5)
    std::fprintf(stderr, "loom: error: %s (see loom --help, or loom COMMAND --help)\n", loom::printable(err.what()).c_str());
    return 2;
  }
  if (t->parsed()) {
    train.overrides = overrides_of(*t);
    return loom::app::run_train(train);
  }
  if (s->parsed()) {
    sample.overrides = overrides_of(*s);
    return loom::app::run_sample(sample);
  }
  if (v->parsed()) {
    serve.overrides = overrides_of(*v);
    return loom::app::run_serve(serve);
  }
  if (qu->parsed()) {
    quantize.overrides = overrides_of(*qu);
    return loom::app::run_quantize(quantize);
  }
  if (pr->parsed()) {
    prune.overrides = overrides_of(*pr);
    return loom::app::run_prune(prune);
  }
  if (e->parsed()) {
    eval.overrides = overrides_of(*e);
    return loom::app::run_eval(eval);
  }
  if (dp->parsed()) {
    prepare.sharded = dp->count("--shard-tokens") > 0;
    return loom::app::run_data_prepare(prepare);
  }
  if (df->parsed()) return loom::app::run_data_fetch(fetch);
  if (rp->parsed()) return loom::app::run_report(report);
  for (auto* sub : {tkt, tke, tkd})
    if (sub->parsed()) {
      tok.action = sub->get_name();
      return loom::app::run_tokenizer(tok);
    }
  for (auto* sub : {ckv, cki, cke})
    if (sub->parsed()) {
      ckpt.action = sub->get_name();
      if (sub == cke) ckpt.overrides = overrides_of(*cke);
      return loom::app::run_ckpt(ckpt);
    }
  if (bt->parsed()) return loom::app::run_bench_train(bench_train);
  if (bg->parsed()) return loom::app::run_bench_gemm(gemm_threads, gemm_path, gemm_shared_pack);
  if (bgpu->parsed()) {
    for (const auto a : {loom::gpu::GpuAttention::kMma, loom::gpu::GpuAttention::kMmaX4, loom::gpu::GpuAttention::kWmma})
      if (gpu_attention == loom::gpu::gpu_attention_name(a)) bench_gpu.attention = a;
    bench_gpu.fused_epilogues = gpu_epilogues == "cublaslt";
    return loom::app::run_bench_gpu(bench_gpu);
  }
  if (bd->parsed()) return loom::app::run_bench_decode(bench_decode);
  if (bs->parsed()) return loom::app::run_bench_serve(bench_serve);
  if (bc->parsed()) return loom::app::run_bench_comm(bench_comm);
  if (l->parsed()) {
    // Their defaults mean "not given"; given, each must be a count.
    if (l->count("--max-restarts") > 0) loom::check_flag_range("--max-restarts", launch.max_restarts, 0, 1 << 20);
    if (l->count("--local") > 0) loom::check_flag_range("--local", launch.local, 1, 1 << 20);
    launch.secret = loom::comm::launch_env_from_environment().secret;
    if (const char* id = std::getenv("LOOM_JOB_ID")) launch.job_id = id;
    return loom::app::run_launch(launch);
  }
  if (pl->parsed()) return loom::app::run_plan(plan);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const loom::Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "loom: error: %s\n", loom::printable(e.what()).c_str());
    return e.exit_code();
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "loom: error: out of memory\n");
    return 1;
  } catch (const std::filesystem::filesystem_error& e) {
    std::fprintf(stderr, "loom: error: %s\n", loom::printable(e.what()).c_str());
    return 1;
  } catch (const std::exception& e) {
    // Every reader turns bad input into a loom::Error; reaching here is a bug in Loom, said
    // as such (the hostile-input test fails on this line) rather than an abort.
    std::fflush(stdout);
    std::fprintf(stderr, "loom: error: internal error (a bug; please report it): %s\n", loom::printable(e.what()).c_str());
    return 1;
  }
}
