// Pictures of a simulated (or measured) pipeline step (loom/parallel/schedule.h): a text timeline
// for terminals and logs, and an SVG for people.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "loom/core/error.h"
#include "loom/parallel/schedule.h"

namespace loom::parallel {

namespace {

char op_letter(PipeOp op) {
  switch (op) {
    case PipeOp::kForward: return 'F';
    case PipeOp::kBackward: return 'B';
    case PipeOp::kBackwardInput: return 'b';
    case PipeOp::kBackwardWeight: return 'w';
    default: return '?';
  }
}

std::string label(const Schedule& s, const PipeAction& a) {
  return cat(op_letter(a.op), a.microbatch, s.virtual_stages > 1 ? cat("/", a.chunk) : std::string());
}

const char* op_color(PipeOp op) {
  switch (op) {
    case PipeOp::kForward: return "#4c78a8";
    case PipeOp::kBackward: return "#59a14f";
    case PipeOp::kBackwardInput: return "#f28e2b";
    case PipeOp::kBackwardWeight: return "#b07aa1";
    default: return "#999999";
  }
}

std::string fmt(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  return buf;
}

// A round tick step giving about `ticks` ticks over [0, span].
double tick_step(double span, int ticks) {
  const double raw = span / ticks, mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double f : {1.0, 2.0, 5.0, 10.0})
    if (f * mag >= raw) return f * mag;
  return 10 * mag;
}

}  // namespace

std::string draw_text(const Schedule& s, const Simulation& sim, int width) {
  LOOM_CHECK_LT(0, width);
  const double scale = sim.step_ms > 0 ? width / sim.step_ms : 0;
  std::string out;
  for (int st = 0; st < s.stages; ++st) {
    std::string row(static_cast<size_t>(width), '.');
    for (const SimulatedAction& x : sim.timeline) {
      if (x.stage != st || !pipe_op_computes(x.action.op)) continue;
      const int b = std::clamp(static_cast<int>(std::lround(x.begin_ms * scale)), 0, width - 1);
      const int e = std::clamp(static_cast<int>(std::lround(x.end_ms * scale)), b + 1, width);
      const std::string l = label(s, x.action);
      for (int c = b; c < e; ++c) row[c] = c - b < static_cast<int>(l.size()) ? l[c - b] : ' ';
    }
    out += cat("stage ", st, " |", row, "|\n");
  }
  return out;
}

std::string draw_svg(const Schedule& s, const Simulation& sim, const std::string& title) {
  const double left = 80, top = 48, row_h = 30, plot_w = 960, right = 24;
  const double scale = sim.step_ms > 0 ? plot_w / sim.step_ms : 0;
  const double axis_y = top + s.stages * row_h + 6, legend_y = axis_y + 40;
  const double h = legend_y + 30, w = left + plot_w + right;
  std::string o = cat("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"", fmt(w), "\" height=\"", fmt(h),
                      "\" viewBox=\"0 0 ", fmt(w), " ", fmt(h), "\" font-family=\"sans-serif\" font-size=\"12\">\n");
  o += cat("<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n");
  o += cat("<text x=\"", fmt(left), "\" y=\"22\" font-size=\"15\" font-weight=\"bold\" fill=\"#222\">", title, "</text>\n");
  char summary[160];
  std::snprintf(summary, sizeof summary, "step %.3g ms, bubble %.1f%%", sim.step_ms, 100 * sim.bubble);
  o += cat("<text x=\"", fmt(left), "\" y=\"38\" fill=\"#555\">", summary, "</text>\n");
  for (int st = 0; st < s.stages; ++st) {
    const double y = top + st * row_h;
    o += cat("<rect x=\"", fmt(left), "\" y=\"", fmt(y), "\" width=\"", fmt(plot_w), "\" height=\"", fmt(row_h - 4),
             "\" fill=\"#f2f2f2\"/>\n");
    o += cat("<text x=\"", fmt(left - 8), "\" y=\"", fmt(y + row_h / 2 + 2), "\" text-anchor=\"end\" fill=\"#222\">stage ", st,
             "</text>\n");
  }
  for (const SimulatedAction& x : sim.timeline) {
    if (!pipe_op_computes(x.action.op)) continue;
    const double y = top + x.stage * row_h, bx = left + x.begin_ms * scale;
    const double bw = std::max(1.0, (x.end_ms - x.begin_ms) * scale);
    // Later chunks of interleaved stages are drawn lighter.
    const double opacity = 1.0 - 0.35 * x.action.chunk / std::max(1, s.virtual_stages - 1);
    o += cat("<rect x=\"", fmt(bx), "\" y=\"", fmt(y), "\" width=\"", fmt(bw), "\" height=\"", fmt(row_h - 4), "\" fill=\"",
             op_color(x.action.op), "\" fill-opacity=\"", fmt(opacity), "\" stroke=\"#ffffff\" stroke-width=\"1\">");
    o += cat("<title>stage ", x.stage, ": ", pipe_op_name(x.action.op), " of micro-batch ", x.action.microbatch, ", chunk ",
             x.action.chunk, ", ", fmt(x.begin_ms), " to ", fmt(x.end_ms), " ms</title></rect>\n");
    std::string l = label(s, x.action);
    if (bw < 7.5 * static_cast<double>(l.size())) l = std::to_string(x.action.microbatch);  // narrow: the micro-batch only
    if (bw >= 7.5 * static_cast<double>(l.size()))
      o += cat("<text x=\"", fmt(bx + bw / 2), "\" y=\"", fmt(y + row_h / 2 + 2), "\" text-anchor=\"middle\" fill=\"#ffffff\">", l,
               "</text>\n");
  }
  // Time axis.
  o += cat("<line x1=\"", fmt(left), "\" y1=\"", fmt(axis_y), "\" x2=\"", fmt(left + plot_w), "\" y2=\"", fmt(axis_y),
           "\" stroke=\"#444\"/>\n");
  if (sim.step_ms > 0) {
    const double step = tick_step(sim.step_ms, 8);
    for (double t = 0; t <= sim.step_ms * (1 + 1e-9); t += step) {
      const double x = left + t * scale;
      o += cat("<line x1=\"", fmt(x), "\" y1=\"", fmt(axis_y), "\" x2=\"", fmt(x), "\" y2=\"", fmt(axis_y + 5),
               "\" stroke=\"#444\"/>\n");
      o += cat("<text x=\"", fmt(x), "\" y=\"", fmt(axis_y + 18), "\" text-anchor=\"middle\" fill=\"#444\">", fmt(t),
               "</text>\n");
    }
    o += cat("<text x=\"", fmt(left + plot_w), "\" y=\"", fmt(axis_y + 32), "\" text-anchor=\"end\" fill=\"#444\">ms</text>\n");
  }
  // Legend.
  double lx = left;
  for (PipeOp op : {PipeOp::kForward, PipeOp::kBackward, PipeOp::kBackwardInput, PipeOp::kBackwardWeight}) {
    o += cat("<rect x=\"", fmt(lx), "\" y=\"", fmt(legend_y), "\" width=\"14\" height=\"14\" fill=\"", op_color(op), "\"/>\n");
    o += cat("<text x=\"", fmt(lx + 20), "\" y=\"", fmt(legend_y + 12), "\" fill=\"#222\">", op_letter(op), " ",
             pipe_op_name(op), "</text>\n");
    lx += 150;
  }
  o += cat("<text x=\"", fmt(lx), "\" y=\"", fmt(legend_y + 12), "\" fill=\"#555\">labels: micro-batch",
           s.virtual_stages > 1 ? "/chunk (later chunks lighter)" : "", "; grey: idle</text>\n");
  o += "</svg>\n";
  return o;
}

}  // namespace loom::parallel
