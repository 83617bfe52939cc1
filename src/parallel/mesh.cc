#include "loom/parallel/mesh.h"

#include <algorithm>
#include <functional>
#include <iterator>
#include <memory>

#include "loom/core/error.h"

namespace loom::parallel {

Mesh Mesh::at(const MeshShape& shape, int rank) {
  Mesh m;
  m.dp_size = shape.dp;
  m.pp = shape.pp;
  m.v = shape.v;
  m.tp = shape.tp;
  m.tp_index = rank % m.tp;
  m.dp_index = rank / m.tp % m.dp_size;
  m.stage = rank / m.tp / m.dp_size;
  if (m.tp > 1) m.seam = std::make_unique<TensorParallelSeam>();
  return m;
}

nn::Shard Mesh::shard(bool sequence_parallel) const {
  if (tp == 1) return {};
  return {.index = tp_index, .parts = tp, .seam = seam.get(), .sequence = sequence_parallel};
}

nn::GptPart mesh_part(int64_t n_layer, const Mesh& m) {
  if (m.pp == 1) return {};
  return stage_part(n_layer, m.pp, m.v, m.stage);
}

std::string Mesh::where() const {
  std::string s;
  if (pp > 1) s += cat("stage ", stage, " of ", pp, ", ");
  if (tp > 1) s += cat("tp ", tp_index, " of ", tp, ", ");
  return s + cat("replica ", dp_index);
}

std::vector<std::string> all_gather_strings(comm::Communicator& world, const std::string& mine) {
  const auto n = static_cast<size_t>(world.size());
  int64_t size = static_cast<int64_t>(mine.size());
  std::vector<int64_t> sizes(n);
  comm::all_gather(world, {.input = &size, .output = sizes.data(), .count = 1, .dtype = DType::kI64});
  const auto width = static_cast<size_t>(*std::max_element(sizes.begin(), sizes.end()));
  std::string padded = mine;
  padded.resize(width);
  std::string all(width * n, '\0');
  if (width > 0) comm::all_gather(world, {.input = padded.data(), .output = all.data(), .count = width, .dtype = DType::kU8});
  std::vector<std::string> out;
  for (size_t r = 0; r < n; ++r) out.push_back(all.substr(r * width, static_cast<size_t>(sizes[r])));
  return out;
}

void split_mesh(comm::Communicator& world, Mesh& m) {
  LOOM_CHECK(m.split());
  m.dp = world.split(m.stage * m.tp + m.tp_index, m.dp_index);
  m.pipe = world.split(m.dp_index * m.tp + m.tp_index, m.stage);
  m.tied = m.pipe->split(m.first() || m.last() ? 0 : -1, m.stage);
  if (m.tp > 1) {
    m.tpc = world.split(m.stage * m.dp_size + m.dp_index, m.tp_index);
    if (!m.seam) m.seam = std::make_unique<TensorParallelSeam>();
    m.seam->attach(*m.tpc);
  }
  if (m.tp > 1 && m.pp > 1) m.mp = world.split(m.dp_index, m.stage * m.tp + m.tp_index);
}

std::vector<std::pair<int64_t, int64_t>> copied_ranges(const Mesh& m, const ParamSet& params) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const ParamInfo& p : params.infos()) {
    const bool tied_copy = m.pp > 1 && m.last() && p.name == "transformer.wte.weight";  // counted on the first stage
    const bool replicated = m.tp_index > 0 && p.split.dim < 0;                         // counted on the first piece
    if (!tied_copy && !replicated) continue;
    if (!out.empty() && out.back().second >= p.offset) out.back().second = std::max(out.back().second, p.offset + p.numel);
    else out.emplace_back(p.offset, p.offset + p.numel);
  }
  return out;
}

StageGroups stage_groups(const Mesh& m, const ParamSet& params) {
  // The norm sums over every stage and piece of this replica.
  StageGroups g{.stages = m.mp ? m.mp.get() : m.pp > 1 ? m.pipe.get() : m.tpc.get(),
                          .tied = m.pp > 1 ? m.tied.get() : nullptr};
  g.skip = copied_ranges(m, params);
  const int wte = params.find("transformer.wte.weight");
  LOOM_CHECK(m.pp == 1 || wte >= 0 || !(m.first() || m.last()));
  if (m.pp > 1 && wte >= 0) {
    const ParamInfo& info = params.infos()[wte];
    g.tied_begin = info.offset;
    g.tied_end = info.offset + info.numel;
  }
  return g;
}

std::vector<double> pipeline_step(const Mesh& mesh, Pipeline& pipe, DataParallel& dp,
                                  const Pipeline::Batch& batch, int64_t b, int64_t t, double scale) {
  std::vector<double> losses =
      pipe.run(batch, b, t, scale,
               {.begin = [&](const Pipeline::Piece& p) { dp.begin_micro_step(p.final); },
                .end = [&](const Pipeline::Piece& p) { dp.end_micro_step(static_cast<int>(p.from_block)); }});
  losses.resize(static_cast<size_t>(pipe.schedule().microbatches));  // the last stage's, to every stage
  comm::broadcast(*mesh.pipe, {.buffer = losses.data(), .count = losses.size(), .dtype = DType::kF64, .root = mesh.pp - 1});
  dp.sum_tied_gradients();
  dp.begin_micro_step(true);  // every gradient is final: the sums over replicas start
  dp.end_micro_step();
  return losses;
}

PipelineBubble pipeline_bubble(const Mesh& mesh, const Pipeline& pipe) {
  const PipelineStats& ps = pipe.stats();
  constexpr size_t kN = 9;
  double mine[kN] = {ps.busy_ms, ps.step_ms, ps.costs.forward_ms, ps.costs.backward_ms, ps.costs.backward_input_ms,
                     ps.costs.backward_weight_ms, ps.costs.transfer_ms, ps.costs.overhead_ms, ps.start_ms};
  std::vector<double> all(kN * static_cast<size_t>(mesh.pp));
  comm::all_gather(*mesh.pipe, {.input = mine, .output = all.data(), .count = kN, .dtype = DType::kF64});
  double busy = 0, longest = 0;
  std::vector<PipeCosts> costs;
  for (int s = 0; s < mesh.pp; ++s) {
    const double* x = all.data() + kN * s;
    busy += x[0];
    longest = std::max(longest, x[1]);
    costs.push_back({.forward_ms = x[2], .backward_ms = x[3], .backward_input_ms = x[4], .backward_weight_ms = x[5],
                     .transfer_ms = x[6], .overhead_ms = x[7]});
  }
  // Each stage's actions' times, padded to the longest list: compute, overhead, and on the
  // steady clock when each began and (receives) when its message landed.
  const Schedule& s = pipe.schedule();
  size_t longest_list = 0;
  for (const auto& list : s.actions) longest_list = std::max(longest_list, list.size());
  const std::vector<double>* rows[] = {&ps.action_compute_ms, &ps.action_overhead_ms, &ps.action_begin_ms,
                                       &ps.action_landed_ms};
  constexpr size_t kRows = std::size(rows);
  std::vector<double> times(kRows * longest_list, 0.0), all_times(times.size() * static_cast<size_t>(mesh.pp));
  for (size_t r = 0; r < kRows; ++r)
    std::copy(rows[r]->begin(), rows[r]->end(), times.begin() + static_cast<std::ptrdiff_t>(r * longest_list));
  comm::all_gather(*mesh.pipe, {.input = times.data(), .output = all_times.data(), .count = times.size(), .dtype = DType::kF64});
  // Row r of stage st, trimmed to its list.
  auto row = [&](int st, size_t r) {
    const auto at = all_times.begin() + static_cast<std::ptrdiff_t>(times.size() * st + r * longest_list);
    return std::vector<double>(at, at + static_cast<std::ptrdiff_t>(s.actions[st].size()));
  };
  PipeActionTimes replay;
  std::vector<std::vector<double>> begin_ms, landed_ms;
  for (int st = 0; st < mesh.pp; ++st) {
    replay.compute_ms.push_back(row(st, 0));
    replay.overhead_ms.push_back(row(st, 1));
    begin_ms.push_back(row(st, 2));
    landed_ms.push_back(row(st, 3));
  }
  // Times on different stages compare only on one host (one steady clock).
  if (mesh.pipe->local_ranks().size() == static_cast<size_t>(mesh.pp)) {
    double first = all[kN - 1];
    for (int st = 1; st < mesh.pp; ++st) first = std::min(first, all[kN * st + kN - 1]);
    for (int st = 0; st < mesh.pp; ++st) replay.start_ms.push_back(all[kN * st + kN - 1] - first);
    replay.transfer_ms = in_step_transfers(s, begin_ms, landed_ms);
  }
  return {.measured = longest > 0 ? 1.0 - busy / (mesh.pp * longest) : 0.0,
          .predicted = simulate_stages(s, costs).bubble,
          .replayed = simulate_stages(s, costs, &replay).bubble};
}

}  // namespace loom::parallel
