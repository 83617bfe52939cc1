// `loom serve` (docs/serving.md): an OpenAI-style completions server over one or more
// models, with continuous batching (Batcher), a model cache under a memory budget, routes
// that split a name's traffic between models, and Prometheus metrics at /metrics.
#pragma once

#include <signal.h>

#include <cstdint>
#include <string>
#include <vector>

namespace loom::serve {

// The server's flags (each documented by `loom serve --help`), checked by the caller.
struct ServerOptions {
  std::vector<std::string> models;  // NAME=PATH
  std::vector<std::string> tokenizers;  // NAME=SPEC: a model's tokenizer, in place of its checkpoint's
  std::string host = "127.0.0.1", api_key;
  int64_t port = 8000, max_tokens = 4096;
  int64_t max_body_kb = 1024;  // the largest request body kept; a larger one is answered 413
  int64_t max_connections = 1024;  // open at once; one past it is closed as it is accepted
  int64_t max_batch = 16, token_budget = 2048, queue = 64, kv_cache_mb = 1024;  // continuous batching
  int64_t lanes = 0;  // decoding threads per model, each with its own batch; 0: [job] threads
  int64_t events_nice = 10;  // added to the niceness of the thread that writes the tokens between a stream's ends
  double memory_mb = 0;  // the models' weights in memory; 0: no limit (every model loads at start)
  double prefix_cache_mb = 64;  // per model: prompts' keys and values kept for reuse; 0: none
  std::vector<std::string> routes;  // NAME=A:W,B:W
  std::string quantize = "none";  // none | int8: f32 models computed with int8 weights
  std::string kv_cache_dtype = "f32";  // f32 | bf16: how the key/value caches keep their values
};

// Blocks SIGINT and SIGTERM in this thread (before any other starts, so that every thread
// inherits it) and returns them for run_completion_server to wait on.
sigset_t block_stop_signals();

// Loads the models (--model NAME=PATH; n_head: what a bare safetensors file cannot say;
// threads: [job] threads) and serves until one of `stop_signals` comes. Prints the address
// it listens on. InputError naming the flag for a bad --model or --route.
int run_completion_server(const ServerOptions& options, int64_t n_head, int threads, const sigset_t& stop_signals);

}  // namespace loom::serve
