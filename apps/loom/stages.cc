#include "stages.h"

#include <algorithm>
#include <functional>
#include <memory>

#include "loom/error.h"
#include "loom/pipeline.h"

namespace loom::app {

Mesh mesh_coordinates(const Config& c, int rank) {
  Mesh m;
  m.dp_size = static_cast<int>(c.i("parallel.dp"));
  m.pp = static_cast<int>(c.i("parallel.pp"));
  m.v = static_cast<int>(c.i("parallel.virtual_stages"));
  m.tp = static_cast<int>(c.i("parallel.tp"));
  m.tp_index = rank % m.tp;
  m.dp_index = rank / m.tp % m.dp_size;
  m.stage = rank / m.tp / m.dp_size;
  return m;
}

std::string Mesh::where() const {
  std::string s;
  if (pp > 1) s += cat("stage ", stage, " of ", pp, ", ");
  if (tp > 1) s += cat("tp ", tp_index, " of ", tp, ", ");
  return s + cat("replica ", dp_index);
}

void check_same_layout(comm::Communicator& world, const Config& c) {
  std::string mine = cat("dp=", c.i("parallel.dp"), " tp=", c.i("parallel.tp"), " pp=", c.i("parallel.pp"), " virtual_stages=",
                         c.i("parallel.virtual_stages"), " pp_schedule=", c.s("parallel.pp_schedule"), " zero=",
                         c.i("parallel.zero"), " sequence_parallel=", c.b("parallel.sequence_parallel"), " deterministic=", c.b("parallel.deterministic"), " global_batch=",
                         c.i("training.global_batch"), " micro_batch=", c.i("training.micro_batch"), " n_layer=",
                         c.i("model.n_layer"), " d_model=", c.i("model.d_model"));
  constexpr size_t kWidth = 256;
  mine.resize(kWidth, ' ');
  std::string all(kWidth * static_cast<size_t>(world.size()), ' ');
  comm::all_gather(world, {.input = mine.data(), .output = all.data(), .count = kWidth, .dtype = DType::kU8});
  auto layout = [&](int r) {
    std::string s = all.substr(static_cast<size_t>(r) * kWidth, kWidth);
    return s.substr(0, s.find_last_not_of(' ') + 1);
  };
  for (int r = 1; r < world.size(); ++r)
    if (layout(r) != layout(0))
      throw InputError(cat("rank ", r, " was started with the layout \"", layout(r), "\" but rank 0 with \"", layout(0),
                           "\"; every rank must be given the same [parallel], [training] batch and [model] settings"));
}

void split_mesh(comm::Communicator& world, Mesh& m) {
  LOOM_CHECK(m.split());
  m.dp = world.split(m.stage * m.tp + m.tp_index, m.dp_index);
  m.pipe = world.split(m.dp_index * m.tp + m.tp_index, m.stage);
  m.tied = m.pipe->split(m.first() || m.last() ? 0 : -1, m.stage);
  if (m.tp > 1) m.tpc = world.split(m.stage * m.dp_size + m.dp_index, m.tp_index);
  if (m.tp > 1 && m.pp > 1) m.mp = world.split(m.dp_index, m.stage * m.tp + m.tp_index);
}

nn::GptPart mesh_part(const Config& c, const Mesh& m) {
  if (m.pp == 1) return {};
  return parallel::stage_part(c.i("model.n_layer"), m.pp, m.v, m.stage);
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

parallel::StageGroups stage_groups(const Mesh& m, const ParamSet& params) {
  // The norm sums over every stage and piece of this replica.
  parallel::StageGroups g{.stages = m.mp ? m.mp.get() : m.pp > 1 ? m.pipe.get() : m.tpc.get(),
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

std::vector<double> pipeline_step(const Mesh& mesh, parallel::Pipeline& pipe, parallel::DataParallel& dp,
                                  const parallel::Pipeline::Batch& batch, int64_t b, int64_t t, double scale) {
  std::vector<double> losses = pipe.run(batch, b, t, scale, dp);
  losses.resize(static_cast<size_t>(pipe.schedule().microbatches));  // the last stage's, to every stage
  comm::broadcast(*mesh.pipe, {.buffer = losses.data(), .count = losses.size(), .dtype = DType::kF64, .root = mesh.pp - 1});
  dp.sum_tied_gradients();
  dp.begin_micro_step(true);  // every gradient is final: the sums over replicas start
  dp.end_micro_step();
  return losses;
}

PipelineBubble pipeline_bubble(const Mesh& mesh, const parallel::Pipeline& pipe) {
  const parallel::PipelineStats& ps = pipe.stats();
  constexpr size_t kN = 7;
  double mine[kN] = {ps.busy_ms, ps.step_ms, ps.costs.forward_ms, ps.costs.backward_ms, ps.costs.backward_input_ms,
                     ps.costs.backward_weight_ms, ps.costs.transfer_ms};
  std::vector<double> all(kN * static_cast<size_t>(mesh.pp));
  comm::all_gather(*mesh.pipe, {.input = mine, .output = all.data(), .count = kN, .dtype = DType::kF64});
  double busy = 0, longest = 0;
  std::vector<parallel::PipeCosts> costs;
  for (int s = 0; s < mesh.pp; ++s) {
    const double* x = all.data() + kN * s;
    busy += x[0];
    longest = std::max(longest, x[1]);
    costs.push_back({.forward_ms = x[2], .backward_ms = x[3], .backward_input_ms = x[4], .backward_weight_ms = x[5],
                     .transfer_ms = x[6]});
  }
  return {.measured = longest > 0 ? 1.0 - busy / (mesh.pp * longest) : 0.0,
          .predicted = parallel::simulate_stages(pipe.schedule(), costs).bubble};
}

namespace {

// Copies [info.offset, +numel) of `from` into `to` at the same name's place in `whole`: the
// whole tensor, or a tensor-parallel piece into its place in the logical tensor.
void copy_by_name(const ParamSet& layout, const Tensor& from, const ParamSet& whole, const Tensor& to) {
  for (const ParamInfo& p : layout.infos()) {
    const int w = whole.find(p.name);
    LOOM_CHECK(w >= 0);
    const ParamInfo& q = whole.infos()[w];
    float* dst = to.data<float>() + q.offset;
    if (p.split.dim >= 0) {
      put_piece(p, from.data<float>() + p.offset, dst);
      continue;
    }
    LOOM_CHECK_EQ(p.numel, q.numel);
    std::copy_n(from.data<float>() + p.offset, p.numel, dst);
  }
}

// The seam of a model built only for its parameters' layout: it never computes.
class LayoutOnly : public nn::Seam {
 public:
  void sum(const Tensor&) override { LOOM_CHECK(false); }
  void max(const Tensor&) override { LOOM_CHECK(false); }
  void all_gather(const Tensor&, const Tensor&) override { LOOM_CHECK(false); }
  void reduce_scatter(const Tensor&, const Tensor&) override { LOOM_CHECK(false); }
};

// Collective over `c`: rank 0 copies its parameters (and, with `state`, optimizer buffers)
// and every other rank's by name into `whole`; rank r's layout is `layout_of(r)`'s (built
// only while its parameters are copied). The other ranks only send. CommError names `what`.
void gather_parts(comm::Communicator& c, const std::function<std::unique_ptr<nn::Gpt>(int)>& layout_of,
                  const ParamSet& mine, const optim::FlatState* state, ParamSet* whole, optim::FlatState* whole_state,
                  const char* what) {
  auto move = [&](const Tensor& t, int peer, bool sending) {
    const auto n = static_cast<size_t>(t.numel());
    if (sending) comm::send(c, {.buffer = t.raw(), .count = n, .dtype = DType::kF32, .peer = peer});
    else comm::recv(c, {.buffer = t.raw(), .count = n, .dtype = DType::kF32, .peer = peer});
  };
  try {
    if (c.rank() != 0) {
      move(mine.values(), 0, true);
      if (state)
        for (const auto& [name, t] : state->buffers) move(t, 0, true);
      return;
    }
    LOOM_CHECK(whole != nullptr && (state == nullptr) == (whole_state == nullptr));
    auto take = [&](const ParamSet& layout, const Tensor& values, const optim::FlatState* st) {
      copy_by_name(layout, values, *whole, whole->values());
      if (!st) return;
      LOOM_CHECK_EQ(st->buffers.size(), whole_state->buffers.size());
      for (size_t k = 0; k < st->buffers.size(); ++k)
        copy_by_name(layout, st->buffers[k].second, *whole, whole_state->buffers[k].second);
    };
    take(mine, mine.values(), state);
    for (int r = 1; r < c.size(); ++r) {
      const std::unique_ptr<nn::Gpt> theirs = layout_of(r);
      const ParamSet& layout = theirs->params();
      move(layout.values(), r, false);
      optim::FlatState st;
      if (state)
        for (const auto& [name, t] : state->buffers) {
          st.buffers.emplace_back(name, Tensor::zeros({layout.numel()}, DType::kF32));
          move(st.buffers.back().second, r, false);
        }
      take(layout, layout.values(), state ? &st : nullptr);
    }
    if (whole_state) whole_state->steps = state->steps;
  } catch (const comm::CommError& e) {
    throw RuntimeError(cat(what, ": ", e.what()));
  }
}

}  // namespace

void gather_pieces(const Mesh& m, const nn::GptConfig& model, const nn::GptPart& part, const ParamSet& mine,
                   const optim::FlatState* state, ParamSet* whole, optim::FlatState* whole_state) {
  LOOM_CHECK(m.tp > 1);
  LayoutOnly seam;
  gather_parts(
      *m.tpc,
      [&](int i) {
        return std::make_unique<nn::Gpt>(model, DType::kF32, part, nn::Shard{.index = i, .parts = m.tp, .seam = &seam});
      },
      mine, state, whole, whole_state, "gathering the tensor-parallel pieces' weights onto tp index 0");
}

void gather_stages(const Mesh& m, const nn::GptConfig& model, const ParamSet& mine, const optim::FlatState* state,
                   ParamSet* whole, optim::FlatState* whole_state) {
  gather_parts(
      *m.pipe,
      [&](int s) { return std::make_unique<nn::Gpt>(model, DType::kF32, parallel::stage_part(model.n_layer, m.pp, m.v, s)); },
      mine, state, whole, whole_state, "gathering the pipeline stages' weights onto stage 0");
}

}  // namespace loom::app
