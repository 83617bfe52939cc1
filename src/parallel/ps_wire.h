// The parameter-server protocol on one link (docs/parallelism.md, "Parameter servers"):
// what a worker's request and a server's reply carry, and their tags. Both ends are the
// same binary, so the headers travel as their bytes; every message is also checked by the
// communicator's fingerprint (tag, dtype, count).
#pragma once

#include <cstdint>

namespace loom::parallel::ps {

enum Tag : uint32_t { kRequest = 1, kLosses = 2, kGradients = 3, kReply = 4, kParams = 5 };

enum class Kind : int64_t { kHello = 1, kPush = 2, kGoodbye = 3 };

// Worker -> server. A push is followed by `losses` f64 (kLosses) and the gradients of the
// server's range (kGradients: f32, or kLimbs int64 per element in deterministic sync mode).
struct Request {
  Kind kind = Kind::kPush;
  int64_t step = 0;        // push: the worker's step
  int64_t losses = 0;      // hello: micro-batch losses per push
  int64_t unsummable = 0;  // push, deterministic: a gradient the exact sums cannot hold
  double grad_norm = 0;    // push, async and ssp: the norm the worker clipped by
  double push_ms = 0, pull_ms = 0;  // the worker's previous exchange, for the metrics
  int64_t bytes = 0;        // ... the payload bytes it moved to and from every server
  int64_t local_bytes = 0;  // ... and those its host's workers summed in their all-reduce
};

// Server -> worker, answering hello and push; followed by the range's parameters (kParams).
struct Reply {
  int64_t step = 0;        // steps done
  int64_t stop = 0;        // the run has reached its end (2: failed; the server's log says why)
  int64_t applied = 0;     // the push was applied (async, ssp) or its round completed (sync)
  int64_t staleness = 0;   // updates applied between the worker's last pull and this push
  double loss = 0, lr = 0, grad_norm = 0;  // sync: the step's
  double held_ms = 0;      // ssp: how long the reply waited for the slowest worker
};

}  // namespace loom::parallel::ps
