// The command line's side of the mesh (loom/mesh.h): the layout a config asks for, and the
// check that every rank of a job was started with the same one.
#pragma once

#include <string>

#include "config.h"
#include "loom/comm.h"
#include "loom/mesh.h"

namespace loom::app {

using parallel::all_gather_strings;
using parallel::copied_ranges;
using parallel::Mesh;
using parallel::pipeline_bubble;
using parallel::pipeline_step;
using parallel::PipelineBubble;
using parallel::split_mesh;
using parallel::stage_groups;

// The config's layout for this rank. REQUIRES: c resolved against `rank`'s world.
Mesh mesh_coordinates(const Config& c, int rank);
// The settings every rank of a job must share, as one line ("dp=2 tp=1 ... d_model=64").
std::string layout_string(const Config& c);
// Refuses (InputError naming both ranks and layouts) ranks started with different layouts
// or model shapes. Collective over world.
void check_same_layout(comm::Communicator& world, const Config& c);
// What of the GPT this rank holds.
nn::GptPart mesh_part(const Config& c, const Mesh& mesh);

}  // namespace loom::app
