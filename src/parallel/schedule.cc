// Pipeline schedule generators and the checker (loom/parallel/schedule.h).
#include "loom/parallel/schedule.h"

#include <algorithm>
#include <array>
#include <deque>
#include <map>
#include <tuple>

#include "loom/core/error.h"

namespace loom::parallel {

const char* pipe_op_name(PipeOp op) {
  switch (op) {
    case PipeOp::kRecvActivation: return "recv activation";
    case PipeOp::kForward: return "forward";
    case PipeOp::kSendActivation: return "send activation";
    case PipeOp::kRecvGrad: return "recv gradient";
    case PipeOp::kBackward: return "backward";
    case PipeOp::kBackwardInput: return "backward input";
    case PipeOp::kBackwardWeight: return "backward weight";
    case PipeOp::kSendGrad: return "send gradient";
  }
  return "?";
}

bool pipe_op_computes(PipeOp op) {
  return op == PipeOp::kForward || op == PipeOp::kBackward || op == PipeOp::kBackwardInput ||
         op == PipeOp::kBackwardWeight;
}

namespace {
constexpr std::pair<ScheduleKind, const char*> kNames[] = {{ScheduleKind::kGpipe, "gpipe"},
                                                           {ScheduleKind::kOneFOneB, "1f1b"},
                                                           {ScheduleKind::kInterleaved, "interleaved"},
                                                           {ScheduleKind::kZeroBubble, "zb-h1"}};
}  // namespace

ScheduleKind schedule_kind_named(const std::string& name) {
  for (const auto& [kind, n] : kNames)
    if (name == n) return kind;
  throw InputError(cat("pipeline schedule \"", name, "\": expected gpipe, 1f1b, interleaved or zb-h1"));
}

const char* schedule_kind_name(ScheduleKind kind) {
  for (const auto& [k, n] : kNames)
    if (k == kind) return n;
  return "?";
}

MicrobatchRule microbatch_rule(ScheduleKind kind, int stages, int virtual_stages) {
  (void)virtual_stages;
  // Interleaving walks micro-batches in groups of p per chunk (Megatron's order).
  if (kind == ScheduleKind::kInterleaved) return {.minimum = stages, .multiple_of = stages};
  return {};
}

namespace {

// Compute actions in order -> the full list, with each receive just before the compute
// that needs it and each send right after the compute that produced it.
std::vector<PipeAction> with_transfers(const Schedule& s, int stage, const std::vector<PipeAction>& compute) {
  std::vector<PipeAction> out;
  for (const PipeAction& a : compute) {
    const bool first = s.first_virtual(stage, a.chunk), last = s.last_virtual(stage, a.chunk);
    switch (a.op) {
      case PipeOp::kForward:
        if (!first) out.push_back({PipeOp::kRecvActivation, a.microbatch, a.chunk});
        out.push_back(a);
        if (!last) out.push_back({PipeOp::kSendActivation, a.microbatch, a.chunk});
        break;
      case PipeOp::kBackward:
      case PipeOp::kBackwardInput:
        if (!last) out.push_back({PipeOp::kRecvGrad, a.microbatch, a.chunk});
        out.push_back(a);
        if (!first) out.push_back({PipeOp::kSendGrad, a.microbatch, a.chunk});
        break;
      default:
        out.push_back(a);
    }
  }
  return out;
}

std::vector<PipeAction> gpipe(int m) {
  std::vector<PipeAction> a;
  for (int i = 0; i < m; ++i) a.push_back({PipeOp::kForward, i, 0});
  for (int i = 0; i < m; ++i) a.push_back({PipeOp::kBackward, i, 0});
  return a;
}

// Warm-up forwards, then one forward and one backward at a time, then the remaining
// backwards; zero-bubble splits each backward and holds back the weight passes.
std::vector<PipeAction> one_f_one_b(int p, int s, int m, bool zero_bubble) {
  std::vector<PipeAction> a;
  const int warmup = std::min(p - 1 - s, m);
  for (int i = 0; i < warmup; ++i) a.push_back({PipeOp::kForward, i, 0});
  std::deque<int> pending_w;
  for (int i = 0; i < m; ++i) {
    if (warmup + i < m) a.push_back({PipeOp::kForward, warmup + i, 0});
    if (!zero_bubble) {
      a.push_back({PipeOp::kBackward, i, 0});
      continue;
    }
    a.push_back({PipeOp::kBackwardInput, i, 0});
    // ZB-H1: stage s defers up to s weight passes, so the input gradients (the critical
    // path) reach earlier stages sooner, and still holds at most p micro-batches.
    pending_w.push_back(i);
    while (static_cast<int>(pending_w.size()) > s) {
      a.push_back({PipeOp::kBackwardWeight, pending_w.front(), 0});
      pending_w.pop_front();
    }
  }
  for (int i : pending_w) a.push_back({PipeOp::kBackwardWeight, i, 0});
  return a;
}

// Megatron's interleaved 1F1B: virtual micro-batch k is micro-batch (k / pv) p + k % p of
// chunk (k % pv) / p going forward, of chunk v - 1 - (k % pv) / p going backward.
std::vector<PipeAction> interleaved(int p, int s, int m, int v) {
  const int total = m * v;
  auto mb = [&](int k) { return k / (p * v) * p + k % p; };
  auto fwd = [&](int k) { return PipeAction{PipeOp::kForward, mb(k), k % (p * v) / p}; };
  auto bwd = [&](int k) { return PipeAction{PipeOp::kBackward, mb(k), v - 1 - k % (p * v) / p}; };
  const int warmup = std::min(total, (p - s - 1) * 2 + (v - 1) * p);
  std::vector<PipeAction> a;
  for (int k = 0; k < warmup; ++k) a.push_back(fwd(k));
  for (int k = 0; k < total - warmup; ++k) {
    a.push_back(fwd(warmup + k));
    a.push_back(bwd(k));
  }
  for (int k = total - warmup; k < total; ++k) a.push_back(bwd(k));
  return a;
}

}  // namespace

Schedule make_schedule(ScheduleKind kind, int stages, int microbatches, int virtual_stages) {
  const std::string name = schedule_kind_name(kind);
  if (stages < 1) throw InputError(cat("pipeline stages = ", stages, ": expected >= 1"));
  if (microbatches < 1) throw InputError(cat("micro-batches = ", microbatches, ": expected >= 1"));
  if (virtual_stages < 1) throw InputError(cat("virtual stages = ", virtual_stages, ": expected >= 1"));
  if (virtual_stages > 1 && kind != ScheduleKind::kInterleaved)
    throw InputError(cat("virtual stages = ", virtual_stages, " with the ", name,
                         " schedule: only \"interleaved\" runs several chunks per stage; expected 1"));
  const MicrobatchRule rule = microbatch_rule(kind, stages, virtual_stages);
  if (microbatches < rule.minimum || microbatches % rule.multiple_of != 0)
    throw InputError(cat("micro-batches = ", microbatches, ": the ", name, " schedule over ", stages,
                         " stages needs at least ", rule.minimum, rule.multiple_of > 1 ? cat(" and a multiple of ", rule.multiple_of) : "",
                         " micro-batches"));
  Schedule s{.kind = kind, .stages = stages, .microbatches = microbatches, .virtual_stages = virtual_stages};
  for (int st = 0; st < stages; ++st) {
    std::vector<PipeAction> compute;
    switch (kind) {
      case ScheduleKind::kGpipe: compute = gpipe(microbatches); break;
      case ScheduleKind::kOneFOneB: compute = one_f_one_b(stages, st, microbatches, false); break;
      case ScheduleKind::kZeroBubble: compute = one_f_one_b(stages, st, microbatches, true); break;
      case ScheduleKind::kInterleaved: compute = interleaved(stages, st, microbatches, virtual_stages); break;
    }
    s.actions.push_back(with_transfers(s, st, compute));
  }
  LOOM_CHECK_EQ(check_schedule(s), "");
  return s;
}

std::string check_schedule(const Schedule& s) {
  const int p = s.stages, m = s.microbatches, v = s.virtual_stages;
  if (p < 1 || m < 1 || v < 1 || static_cast<int>(s.actions.size()) != p)
    return cat("a schedule needs stages, micro-batches and virtual stages >= 1 and one list per stage (", p, ", ", m,
               ", ", v, ", ", s.actions.size(), " lists)");
  // Where each op of (micro-batch, chunk) sits in its stage's list; -1: absent.
  constexpr int kOps = 8;
  for (int st = 0; st < p; ++st) {
    std::vector<std::array<int, kOps>> at(static_cast<size_t>(m * v));
    for (auto& x : at) x.fill(-1);
    const auto& list = s.actions[st];
    for (size_t i = 0; i < list.size(); ++i) {
      const PipeAction& a = list[i];
      if (a.microbatch < 0 || a.microbatch >= m || a.chunk < 0 || a.chunk >= v)
        return cat("stage ", st, " action ", i, ": micro-batch ", a.microbatch, " chunk ", a.chunk, " out of range");
      int& slot = at[a.microbatch * v + a.chunk][static_cast<int>(a.op)];
      if (slot >= 0)
        return cat("stage ", st, ": ", pipe_op_name(a.op), " of micro-batch ", a.microbatch, " chunk ", a.chunk, " twice");
      slot = static_cast<int>(i);
    }
    for (int mb = 0; mb < m; ++mb)
      for (int c = 0; c < v; ++c) {
        const auto& x = at[mb * v + c];
        auto has = [&](PipeOp op) { return x[static_cast<int>(op)] >= 0; };
        auto pos = [&](PipeOp op) { return x[static_cast<int>(op)]; };
        const std::string what = cat("stage ", st, ", micro-batch ", mb, ", chunk ", c, ": ");
        if (!has(PipeOp::kForward)) return what + "no forward";
        const bool split = has(PipeOp::kBackwardInput) || has(PipeOp::kBackwardWeight);
        if (split ? (has(PipeOp::kBackward) || !has(PipeOp::kBackwardInput) || !has(PipeOp::kBackwardWeight))
                  : !has(PipeOp::kBackward))
          return what + "expected one backward, or one backward input and one backward weight";
        const PipeOp back = split ? PipeOp::kBackwardInput : PipeOp::kBackward;
        if (pos(back) < pos(PipeOp::kForward)) return what + "backward before forward";
        if (split && pos(PipeOp::kBackwardWeight) < pos(back)) return what + "weight gradients before input gradients";
        const bool first = s.first_virtual(st, c), last = s.last_virtual(st, c);
        if (has(PipeOp::kRecvActivation) == first || has(PipeOp::kSendActivation) == last ||
            has(PipeOp::kRecvGrad) == last || has(PipeOp::kSendGrad) == first)
          return what + "sends and receives do not match its place in the pipeline";
        if ((!first && pos(PipeOp::kRecvActivation) > pos(PipeOp::kForward)) ||
            (!last && pos(PipeOp::kSendActivation) < pos(PipeOp::kForward)) ||
            (!last && pos(PipeOp::kRecvGrad) > pos(back)) || (!first && pos(PipeOp::kSendGrad) < pos(back)))
          return what + "a receive after its use or a send before its data exists";
      }
  }
  // Each link (sender rank, receiver rank, activation or gradient) delivers in order, so
  // the sender's sends must come in the receiver's order of receives.
  using Key = std::tuple<int, int, bool>;
  std::map<Key, std::vector<std::pair<int, int>>> sent, received;  // (micro-batch, receiver's virtual stage)
  for (int st = 0; st < p; ++st)
    for (const PipeAction& a : s.actions[st]) {
      const int vs = s.virtual_stage(st, a.chunk);
      if (a.op == PipeOp::kSendActivation) sent[{st, (vs + 1) % p, true}].push_back({a.microbatch, vs + 1});
      if (a.op == PipeOp::kSendGrad) sent[{st, (vs - 1) % p, false}].push_back({a.microbatch, vs - 1});
      if (a.op == PipeOp::kRecvActivation) received[{(vs - 1) % p, st, true}].push_back({a.microbatch, vs});
      if (a.op == PipeOp::kRecvGrad) received[{(vs + 1) % p, st, false}].push_back({a.microbatch, vs});
    }
  if (sent != received) {
    for (const auto& [key, list] : sent)
      if (received[key] != list)
        return cat(std::get<2>(key) ? "activations" : "gradients", " from stage ", std::get<0>(key), " to stage ",
                   std::get<1>(key), " are sent in an order the receiver does not receive them in");
    return "a receive has no matching send";
  }
  return "";
}

double closed_form_bubble(ScheduleKind kind, int stages, int microbatches, int virtual_stages) {
  const double p = stages, m = microbatches, v = virtual_stages;
  switch (kind) {
    case ScheduleKind::kInterleaved: return (p - 1) / (v * m + p - 1);
    case ScheduleKind::kZeroBubble: return (p - 1) / (3 * m + p - 1);
    default: return (p - 1) / (m + p - 1);
  }
}

}  // namespace loom::parallel
