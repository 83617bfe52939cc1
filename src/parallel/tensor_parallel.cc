#include "loom/parallel/tensor_parallel.h"

#include <chrono>
#include <functional>

namespace loom::parallel {
namespace {
using Clock = std::chrono::steady_clock;
double ms_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }

// A blocking collective: the training thread waits for all of it.
CommSpan blocking(const char* what, int64_t bytes, const std::function<void()>& run) {
  const auto begin = Clock::now();
  run();
  const auto end = Clock::now();
  return {.what = what, .bytes = bytes, .begin = begin, .end = end, .wait_begin = begin, .wait_end = end};
}
}  // namespace

void TensorParallelSeam::record(const CommSpan& span, Clock::time_point issued) {
  stats_.ms += ms_between(issued, span.wait_end);
  stats_.exposed_ms += ms_between(span.wait_begin, span.wait_end);
  stats_.bytes += span.bytes;
  ++stats_.calls;
  if (observer_) observer_(span);
}

void TensorParallelSeam::reduce(const Tensor& t, comm::ReduceOp op, const char* what) {
  LOOM_CHECK(tp_ != nullptr && (t.dtype() == DType::kF32 || t.dtype() == DType::kF64));
  const CommSpan span = blocking(what, static_cast<int64_t>(t.nbytes()), [&] {
    comm::all_reduce(*tp_, {.output = t.raw(), .count = static_cast<size_t>(t.numel()), .dtype = t.dtype(), .op = op});
  });
  record(span, span.begin);
}

void TensorParallelSeam::all_gather(const Tensor& local, const Tensor& whole) {
  LOOM_CHECK(tp_ != nullptr && local.dtype() == whole.dtype() && whole.numel() == local.numel() * tp_->size());
  const CommSpan span = blocking("tp all-gather", static_cast<int64_t>(whole.nbytes()), [&] {
    comm::all_gather(*tp_, {.input = local.raw(), .output = whole.raw(), .count = static_cast<size_t>(local.numel()),
                            .dtype = local.dtype()});
  });
  record(span, span.begin);
}

void TensorParallelSeam::reduce_scatter(const Tensor& whole, const Tensor& local) {
  LOOM_CHECK(tp_ != nullptr && local.dtype() == whole.dtype() && whole.numel() == local.numel() * tp_->size());
  const CommSpan span = blocking("tp reduce-scatter", static_cast<int64_t>(whole.nbytes()), [&] {
    comm::reduce_scatter(*tp_, {.input = whole.raw(), .output = local.raw(), .count = static_cast<size_t>(local.numel()),
                                .dtype = local.dtype()});
  });
  record(span, span.begin);
}

class TensorParallelSeam::Async : public nn::Seam::Pending {
 public:
  Async(TensorParallelSeam& seam, comm::Work work, int64_t bytes, Clock::time_point issued)
      : seam_(seam), work_(std::move(work)), bytes_(bytes), issued_(issued) {}
  void wait() override {
    if (waited_) return;
    waited_ = true;
    const auto wait_begin = Clock::now();
    work_.wait();
    const auto wait_end = Clock::now();
    const auto [begin, end] = work_.span();
    seam_.record({.what = "tp all-reduce", .bytes = bytes_, .begin = begin, .end = end, .wait_begin = wait_begin,
                  .wait_end = wait_end},
                 issued_);
  }

 private:
  TensorParallelSeam& seam_;
  comm::Work work_;  // waits on destruction, should a caller (unwinding) not have
  int64_t bytes_;
  Clock::time_point issued_;
  bool waited_ = false;
};

std::unique_ptr<nn::Seam::Pending> TensorParallelSeam::start_sum(const Tensor& t) {
  LOOM_CHECK(tp_ != nullptr && (t.dtype() == DType::kF32 || t.dtype() == DType::kF64));
  const auto issued = Clock::now();
  comm::Work work =
      comm::all_reduce_async(*tp_, {.output = t.raw(), .count = static_cast<size_t>(t.numel()), .dtype = t.dtype()});
  return std::make_unique<Async>(*this, std::move(work), static_cast<int64_t>(t.nbytes()), issued);
}

}  // namespace loom::parallel
