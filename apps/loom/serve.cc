// `loom serve`: an OpenAI-style completions server (docs/serving.md; the server is
// loom/serve/completion_server.h). This checks the flags and reads the config.
#include <cstdlib>

#include "commands.h"
#include "config.h"
#include "infer.h"
#include "loom/core/error.h"
#include "loom/serve/completion_server.h"

namespace loom::app {

bool loopback(const std::string& host) { return host == "127.0.0.1" || host == "localhost" || host == "::1"; }

int run_serve(const ServeArgs& a) {
  if (a.models.empty()) throw InputError("serve: expected at least one --model NAME=PATH");
  if (a.port < 0 || a.port > 65535) throw InputError(cat("--port ", a.port, ": expected 0 (any free port) to 65535"));
  check_flag_range("--max-tokens", a.max_tokens, 1, int64_t{1} << 30);
  check_flag_range("--max-batch", a.max_batch, 1, 4096);
  check_flag_range("--token-budget", a.token_budget, 1, int64_t{1} << 24);
  check_flag_range("--kv-cache-mb", a.kv_cache_mb, 1, int64_t{1} << 24);
  check_flag_range("--queue", a.queue, 0, int64_t{1} << 20);
  check_flag_range("--max-body-kb", a.max_body_kb, 1, 1 << 16);
  check_flag_range("--max-connections", a.max_connections, 1, 1 << 16);
  if (!(a.prefix_cache_mb >= 0 && a.prefix_cache_mb <= (1 << 20)))
    throw InputError(cat("--prefix-cache-mb ", a.prefix_cache_mb, ": expected 0 (none kept) to 1048576"));
  if (a.lanes < 0 || a.lanes > 256) throw InputError(cat("--lanes ", a.lanes, ": expected 0 ([job] threads) to 256"));
  if (a.events_nice < 0 || a.events_nice > 19) throw InputError(cat("--events-nice ", a.events_nice, ": expected 0 to 19"));
  kv_cache_dtype_named(a.kv_cache_dtype);  // refused at start, not at a model's first load
  std::string key = a.api_key;
  if (key.empty() && std::getenv("LOOM_API_KEY") != nullptr) key = std::getenv("LOOM_API_KEY");
  if (!loopback(a.host) && key.empty())
    throw InputError(cat("--host ", printable(a.host), ": a server reachable from other hosts needs an API key "
                         "(--api-key KEY or LOOM_API_KEY)"));
  // SIGINT and SIGTERM stop the server from a thread that waits for them (a handler may not
  // call into the server); blocked before any thread starts, so that every thread inherits it.
  const sigset_t stop_signals = serve::block_stop_signals();
  if (!(a.memory_mb >= 0 && a.memory_mb < 1e12)) throw InputError(cat("--memory-mb ", a.memory_mb, ": expected MiB >= 0 (0: no limit)"));
  const Config c = inference_config(a.config, a.overrides);
  serve::ServerOptions options = a;
  options.api_key = key;
  return serve::run_completion_server(options, c.i("model.n_head"), c.threads(/*local_ranks=*/1), stop_signals);
}

}  // namespace loom::app
