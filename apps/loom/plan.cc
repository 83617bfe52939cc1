// `loom plan`: evaluates pipeline schedules with the simulator (loom/parallel/schedule.h) and
// prints the predicted step time, bubble and activation memory per stage, with a timeline.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <tuple>

#include "commands.h"
#include "config.h"
#include "loom/core/error.h"
#include "loom/core/fileio.h"
#include "loom/parallel/pipeline.h"
#include "loom/parallel/schedule.h"
#include "loom/parallel/stage_costs.h"
#include "loom/checkpoint/outputs.h"
#include "config_train.h"

namespace loom::app {

namespace {

// What `loom plan` takes (docs/security.md, "Limits").
constexpr int kMaxStages = 1024, kMaxMicrobatches = 1 << 14, kMaxVirtualStages = 64, kMaxWidth = 1000;
constexpr int64_t kMaxActions = int64_t{1} << 20;
constexpr double kMaxCost = 1e9;

void check_costs(const PlanArgs& a) {
  const std::pair<const char*, double> costs[] = {
      {"--forward-ms", a.forward_ms},       {"--backward-ms", a.backward_ms},
      {"--backward-input-ms", a.backward_input_ms}, {"--backward-weight-ms", a.backward_weight_ms},
      {"--transfer-ms", a.transfer_ms},     {"--activation-mb", a.activation_mb},
      {"--overhead-ms", a.overhead_ms}};
  for (const auto& [flag, v] : costs)
    if (!(v >= 0 && v <= kMaxCost)) throw InputError(cat(flag, " = ", v, ": expected a number in [0, ", kMaxCost, "]"));
  if (!(a.forward_ms + a.backward_ms > 0)) throw InputError("--forward-ms and --backward-ms: expected a positive step");
  // Bounds before anything is built: a schedule holds pp x microbatches x virtual_stages
  // actions of each kind and the timeline `width` columns per stage (docs/security.md).
  const std::tuple<const char*, int, int> counts[] = {{"--pp", a.pp, kMaxStages},
                                                      {"--microbatches", a.microbatches, kMaxMicrobatches},
                                                      {"--virtual-stages", a.virtual_stages, kMaxVirtualStages},
                                                      {"--width", a.width, kMaxWidth}};
  for (const auto& [flag, v, most] : counts)
    if (v < (flag == std::string("--width") ? 10 : 1) || v > most)
      throw InputError(cat(flag, " = ", v, ": expected an integer in [", flag == std::string("--width") ? 10 : 1, ", ",
                           most, "]"));
  if (int64_t{a.pp} * a.microbatches * a.virtual_stages > kMaxActions)
    throw InputError(cat("--pp ", a.pp, " x --microbatches ", a.microbatches, " x --virtual-stages ", a.virtual_stages,
                         " = ", int64_t{a.pp} * a.microbatches * a.virtual_stages, " forward passes to schedule: expected at most ",
                         kMaxActions));
  if (!a.svg.empty()) checkpoint::check_output_file("--svg", a.svg, {a.config});
}

// Each stage's costs for a config's model (parallel::measure_stage_costs), printed.
std::vector<parallel::PipeCosts> measure_stages(const PlanArgs& a, int v) {
  Config c;
  c.merge_file(a.config);
  if (c.s("data.train").empty()) c.set("data.train", std::string("-"));
  c.resolve(layout_ranks(c, 1));
  apply_compute_settings(c);
  const nn::GptConfig cfg = gpt_config(c);
  if (model_kind(c) != "gpt") throw InputError(cat(a.config, ": loom plan measures GPT stages; model.preset = \"", c.s("model.preset"), "\""));
  if (cfg.n_layer % (a.pp * v) != 0)
    throw InputError(cat(a.config, ": model.n_layer = ", cfg.n_layer, " blocks are not divisible among --pp x virtual stages = ",
                         a.pp * v));
  const int64_t b = c.i("training.micro_batch");
  std::vector<parallel::PipeCosts> costs = parallel::measure_stage_costs(cfg, a.pp, v, b);
  for (int s = 0; s < a.pp; ++s) {
    parallel::PipeCosts& k = costs[static_cast<size_t>(s)];
    k.transfer_ms = a.transfer_ms;
    k.overhead_ms = a.overhead_ms;
    std::printf("stage %d measured%s: forward %.3g ms, backward %.3g ms (input %.3g + weight %.3g), activations %.3g MiB per "
                "micro-batch of %lld x %lld tokens\n",
                s, v > 1 ? cat(" as ", v, " chunks").c_str() : "", k.forward_ms, k.backward_ms, k.backward_input_ms,
                k.backward_weight_ms, k.activation_mb, static_cast<long long>(b), static_cast<long long>(cfg.seq_len));
  }
  return costs;
}

// The costs to simulate with: measured per stage for --config, else the given ones.
std::vector<parallel::PipeCosts> stage_costs(const PlanArgs& a, const parallel::PipeCosts& given, int v) {
  if (!a.config.empty()) return measure_stages(a, v);
  return std::vector<parallel::PipeCosts>(static_cast<size_t>(a.pp), given);
}

// One line per schedule: the numbers to pick a schedule by.
int compare_all(const PlanArgs& a, const parallel::PipeCosts& given) {
  if (a.config.empty())
    std::printf("%d stages, %d micro-batches; per stage: forward %g ms, backward %g ms, transfer %g ms\n", a.pp,
                a.microbatches, a.forward_ms, a.backward_ms, a.transfer_ms);
  else
    std::printf("%d stages, %d micro-batches; the stages of %s measured (once per chunk count); transfer %g ms\n", a.pp,
                a.microbatches, a.config.c_str(), a.transfer_ms);
  std::fflush(stdout);  // measuring prints each stage's costs
  const std::string table = parallel::compare_schedules(a.pp, a.microbatches, a.virtual_stages,
                                                        [&](int v) { return stage_costs(a, given, v); });
  std::printf("%s", table.c_str());
  return 0;
}

}  // namespace

// The memory of the config's own layout, as `loom train --dry-run` prints it. Measuring
// builds the model, so a config that cannot fit stops here.
void print_memory_plan(const std::string& path) {
  Config c;
  c.merge_file(path);
  if (c.s("data.train").empty()) c.set("data.train", std::string("-"));
  const int ranks = layout_ranks(c, 1);
  c.resolve(ranks);
  std::vector<int> all(static_cast<size_t>(ranks));
  std::iota(all.begin(), all.end(), 0);
  const MemoryPlan mem = plan_memory(train_config(c), ranks, all);
  std::printf("%s", describe(mem).c_str());
  check_fits(mem);
}

int run_plan(const PlanArgs& a) {
  check_costs(a);
  if (!a.config.empty()) print_memory_plan(a.config);
  const parallel::PipeCosts costs{.forward_ms = a.forward_ms, .backward_ms = a.backward_ms,
                                  .backward_input_ms = a.backward_input_ms, .backward_weight_ms = a.backward_weight_ms,
                                  .transfer_ms = a.transfer_ms, .activation_mb = a.activation_mb,
                                  .overhead_ms = a.overhead_ms};
  if (a.schedule == "all") {
    if (!a.svg.empty()) throw InputError("--svg draws one schedule; pick it with --schedule");
    return compare_all(a, costs);
  }
  const parallel::ScheduleKind kind = parallel::schedule_kind_named(a.schedule);
  const parallel::Schedule s = parallel::make_schedule(kind, a.pp, a.microbatches, a.virtual_stages);
  const parallel::Simulation sim = parallel::simulate_stages(s, stage_costs(a, costs, a.virtual_stages));
  if (a.config.empty())
    std::printf("schedule %s: %d stage(s) x %d chunk(s), %d micro-batches; per stage: forward %g ms, backward %g ms, "
                "transfer %g ms\n",
                a.schedule.c_str(), a.pp, a.virtual_stages, a.microbatches, a.forward_ms, a.backward_ms, a.transfer_ms);
  else
    std::printf("schedule %s: %d stage(s) x %d chunk(s), %d micro-batches; stage costs measured above, transfer %g ms\n",
                a.schedule.c_str(), a.pp, a.virtual_stages, a.microbatches, a.transfer_ms);
  std::printf("%s", parallel::describe_simulation(kind, s, sim, a.width).c_str());
  if (!a.svg.empty()) {
    const std::string title = cat(a.schedule, ": ", a.pp, " stages, ", a.microbatches, " micro-batches",
                                  a.virtual_stages > 1 ? cat(", ", a.virtual_stages, " chunks per stage") : std::string());
    write_file_atomic(a.svg, parallel::draw_svg(s, sim, title));
    std::printf("picture: %s\n", printable(a.svg).c_str());
  }
  return 0;
}

}  // namespace loom::app
