#include "stages.h"

#include "loom/error.h"

namespace loom::app {

Mesh mesh_coordinates(const Config& c, int rank) {
  return Mesh::at({.dp = static_cast<int>(c.i("parallel.dp")), .pp = static_cast<int>(c.i("parallel.pp")),
                   .v = static_cast<int>(c.i("parallel.virtual_stages")), .tp = static_cast<int>(c.i("parallel.tp"))},
                  rank);
}

std::string layout_string(const Config& c) {
  return cat("dp=", c.i("parallel.dp"), " tp=", c.i("parallel.tp"), " pp=", c.i("parallel.pp"), " virtual_stages=",
                         c.i("parallel.virtual_stages"), " pp_schedule=", c.s("parallel.pp_schedule"), " zero=",
                         c.i("parallel.zero"), " sequence_parallel=", c.b("parallel.sequence_parallel"), " deterministic=", c.b("parallel.deterministic"),
                         " ps_servers=", c.i("parallel.ps_servers"), " ps_mode=", c.s("parallel.ps_mode"),
                         " ps_staleness=", c.i("parallel.ps_staleness"),
                         " ps_hierarchical=", c.s("parallel.ps_hierarchical"), " global_batch=",
                         c.i("training.global_batch"), " micro_batch=", c.i("training.micro_batch"), " n_layer=",
                         c.i("model.n_layer"), " d_model=", c.i("model.d_model"));
}

void check_same_layout(comm::Communicator& world, const Config& c) {
  const std::vector<std::string> layout = all_gather_strings(world, layout_string(c));
  for (size_t r = 1; r < layout.size(); ++r)
    if (layout[r] != layout[0])
      throw InputError(cat("rank ", r, " was started with the layout \"", layout[r], "\" but rank 0 with \"", layout[0],
                           "\"; every rank must be given the same [parallel], [training] batch and [model] settings"));
}

nn::GptPart mesh_part(const Config& c, const Mesh& m) { return parallel::mesh_part(c.i("model.n_layer"), m); }

}  // namespace loom::app
