// Tensor parallelism's seam (DESIGN.md section 3, docs/parallelism.md "Tensor
// parallelism"): a layer split across `parts` processes computes a piece, and the pieces
// meet where the layer says. nn/ declares the seam; parallel/ implements it over the
// tensor-parallel communicator, so nn/ never includes comm/. parts == 1 is the serial
// layer and never calls the seam.
#pragma once

#include <memory>

#include "loom/core/tensor.h"

namespace loom::nn {

class Seam {
 public:
  virtual ~Seam() = default;
  // Every part's t summed, in place, in an order fixed by the number of parts.
  virtual void sum(const Tensor& t) = 0;
  // The elementwise largest of every part's t, in place (exact: the same bits on every part).
  virtual void max(const Tensor& t) = 0;
  // Sequence parallelism: every part's `local` (m rows) into `whole` (parts x m rows, part i's
  // at rows [i m, (i + 1) m)); and the other way, the parts' `whole` summed, part i keeping
  // rows [i m, (i + 1) m) in `local`. Rows are the leading dimension, flattened.
  virtual void all_gather(const Tensor& local, const Tensor& whole) = 0;
  virtual void reduce_scatter(const Tensor& whole, const Tensor& local) = 0;

  // Sequence parallelism's full-size temporaries (a gathered input, a partial output before
  // its reduce-scatter): a layer resets it when it starts and is done with what it took
  // before it returns. One thread drives the model, one layer at a time.
  Arena& staging() { return staging_; }

  // A sum in flight: t may be read only after wait().
  class Pending {
   public:
    virtual ~Pending() = default;
    virtual void wait() = 0;
  };
  // Starts sum(t) and returns, so that the caller computes what does not need t while it
  // travels (backward: the weight gradients while the input gradient is summed). The
  // default sums at once.
  virtual std::unique_ptr<Pending> start_sum(const Tensor& t) {
    struct Done : Pending {
      void wait() override {}
    };
    sum(t);
    return std::make_unique<Done>();
  }

 private:
  Arena staging_;
};

struct Shard {
  int index = 0;
  int parts = 1;
  Seam* seam = nullptr;  // REQUIRES: set when parts > 1
  // Sequence parallelism (docs/parallelism.md): between the split layers each part holds
  // only its rows (tokens) of the activations: LayerNorms and residuals run on 1 / parts of
  // the rows, a column-parallel layer all-gathers its input and a row-parallel layer
  // reduce-scatters its output in place of the all-reduces.
  bool sequence = false;
  bool split() const { return parts > 1; }
  bool sequence_split() const { return parts > 1 && sequence; }
};

}  // namespace loom::nn
