#include "stages.h"

#include <algorithm>

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
                         c.i("parallel.zero"), " deterministic=", c.b("parallel.deterministic"), " global_batch=",
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

parallel::StageGroups stage_groups(const Mesh& m, const ParamSet& params) {
  // The norm sums over every stage and piece of this replica.
  parallel::StageGroups g{.stages = m.mp ? m.mp.get() : m.pp > 1 ? m.pipe.get() : m.tpc.get(),
                          .tied = m.pp > 1 ? m.tied.get() : nullptr};
  auto skip = [&](int64_t begin, int64_t end) {  // ranges come in ascending order
    if (!g.skip.empty() && g.skip.back().second >= begin) g.skip.back().second = std::max(g.skip.back().second, end);
    else g.skip.emplace_back(begin, end);
  };
  const int wte = params.find("transformer.wte.weight");
  LOOM_CHECK(m.pp == 1 || wte >= 0 || !(m.first() || m.last()));
  for (const ParamInfo& p : params.infos()) {
    const bool tied_copy = m.pp > 1 && m.last() && p.name == "transformer.wte.weight";  // counted on the first stage
    const bool replicated = m.tp_index > 0 && p.split.dim < 0;                         // counted on the first piece
    if (tied_copy || replicated) skip(p.offset, p.offset + p.numel);
  }
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

// Copies [info.offset, +numel) of `from` into `to` at the same name's place in `whole`.
void copy_by_name(const ParamSet& layout, const Tensor& from, const ParamSet& whole, const Tensor& to) {
  for (const ParamInfo& p : layout.infos()) {
    const int w = whole.find(p.name);
    LOOM_CHECK(w >= 0);
    const ParamInfo& q = whole.infos()[w];
    LOOM_CHECK_EQ(p.numel, q.numel);
    std::copy_n(from.data<float>() + p.offset, p.numel, to.data<float>() + q.offset);
  }
}

}  // namespace

namespace {

// The seam of a model built only for its parameters' layout: it never computes.
class LayoutOnly : public nn::Seam {
 public:
  void sum(const Tensor&) override { LOOM_CHECK(false); }
};

}  // namespace

void gather_pieces(const Mesh& m, const nn::GptConfig& model, const nn::GptPart& part, const ParamSet& mine,
                   const optim::FlatState* state, ParamSet* whole, optim::FlatState* whole_state) {
  LOOM_CHECK(m.tp > 1);
  comm::Communicator& tp = *m.tpc;
  auto move = [&](const Tensor& t, int peer, bool sending) {
    const auto n = static_cast<size_t>(t.numel());
    if (sending) comm::send(tp, {.buffer = t.raw(), .count = n, .dtype = DType::kF32, .peer = peer});
    else comm::recv(tp, {.buffer = t.raw(), .count = n, .dtype = DType::kF32, .peer = peer});
  };
  try {
    if (m.tp_index != 0) {
      move(mine.values(), 0, true);
      if (state)
        for (const auto& [name, t] : state->buffers) move(t, 0, true);
      return;
    }
    LOOM_CHECK(whole != nullptr && (state == nullptr) == (whole_state == nullptr));
    // Piece i's layout: the model split the same way, its parameters allocated here only
    // while they are put in place.
    auto put = [&](const ParamSet& layout, const Tensor& from, const Tensor& to) {
      for (const ParamInfo& p : layout.infos()) {
        const int w = whole->find(p.name);
        LOOM_CHECK(w >= 0);
        float* dst = to.data<float>() + whole->infos()[w].offset;
        if (p.split.dim < 0) std::copy_n(from.data<float>() + p.offset, p.numel, dst);
        else put_piece(p, from.data<float>() + p.offset, dst);
      }
    };
    auto take = [&](const ParamSet& layout, const Tensor& values, const optim::FlatState& st) {
      put(layout, values, whole->values());
      if (!state) return;
      for (size_t k = 0; k < st.buffers.size(); ++k) put(layout, st.buffers[k].second, whole_state->buffers[k].second);
    };
    take(mine, mine.values(), state ? *state : optim::FlatState{});
    for (int i = 1; i < m.tp; ++i) {
      LayoutOnly seam;
      nn::Gpt theirs(model, DType::kF32, part, {.index = i, .parts = m.tp, .seam = &seam});
      const ParamSet& layout = theirs.params();
      move(layout.values(), i, false);
      optim::FlatState st;
      if (state)
        for (const auto& [name, t] : state->buffers) {
          st.buffers.emplace_back(name, Tensor::zeros({layout.numel()}, DType::kF32));
          move(st.buffers.back().second, i, false);
        }
      take(layout, layout.values(), st);
    }
    if (whole_state) whole_state->steps = state->steps;
  } catch (const comm::CommError& e) {
    throw RuntimeError(cat("gathering the tensor-parallel pieces' weights onto tp index 0: ", e.what()));
  }
}

namespace {
void gather_stages_impl(const Mesh& m, const nn::GptConfig& model, const ParamSet& mine, const optim::FlatState* state,
                        ParamSet* whole, optim::FlatState* whole_state);
}  // namespace

void gather_stages(const Mesh& m, const nn::GptConfig& model, const ParamSet& mine, const optim::FlatState* state,
                   ParamSet* whole, optim::FlatState* whole_state) {
  try {
    gather_stages_impl(m, model, mine, state, whole, whole_state);
  } catch (const comm::CommError& e) {
    throw RuntimeError(cat("gathering the pipeline stages' weights onto stage 0: ", e.what()));
  }
}

namespace {
void gather_stages_impl(const Mesh& m, const nn::GptConfig& model, const ParamSet& mine, const optim::FlatState* state,
                        ParamSet* whole, optim::FlatState* whole_state) {
  comm::Communicator& pipe = *m.pipe;
  auto send = [&](const Tensor& t) {
    comm::send(pipe, {.buffer = t.raw(), .count = static_cast<size_t>(t.numel()), .dtype = DType::kF32, .peer = 0});
  };
  if (!m.first()) {
    send(mine.values());
    if (state)
      for (const auto& [name, t] : state->buffers) send(t);
    return;
  }
  LOOM_CHECK(whole != nullptr && (state == nullptr) == (whole_state == nullptr));
  auto take = [&](const ParamSet& layout, const Tensor& values, const optim::FlatState* st) {
    copy_by_name(layout, values, *whole, whole->values());
    if (!st) return;
    LOOM_CHECK_EQ(st->buffers.size(), whole_state->buffers.size());
    for (size_t k = 0; k < st->buffers.size(); ++k) copy_by_name(layout, st->buffers[k].second, *whole, whole_state->buffers[k].second);
  };
  take(mine, mine.values(), state);
  for (int s = 1; s < m.pp; ++s) {
    // Stage s's layout: the part it holds (its parameters are allocated here only while
    // they are copied).
    nn::Gpt theirs(model, DType::kF32, parallel::stage_part(model.n_layer, m.pp, m.v, s));
    const ParamSet& layout = theirs.params();
    auto recv = [&](const Tensor& t) {
      comm::recv(pipe, {.buffer = t.raw(), .count = static_cast<size_t>(t.numel()), .dtype = DType::kF32, .peer = s});
    };
    recv(layout.values());
    optim::FlatState st;
    if (state) {
      st.steps = state->steps;
      for (const auto& [name, t] : state->buffers) {
        st.buffers.emplace_back(name, Tensor::zeros({layout.numel()}, DType::kF32));
        recv(st.buffers.back().second);
      }
    }
    take(layout, layout.values(), state ? &st : nullptr);
  }
  if (whole_state) whole_state->steps = state->steps;
}
}  // namespace

}  // namespace loom::app
