// `loom report`: reading run directories and drawing their HTML page (include/loom/obs/report.h).
#include "loom/obs/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <set>

#include "loom/core/error.h"
#include "loom/core/fileio.h"

namespace loom::obs {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// One JSON object per line; a line that is not one (a cut last line too) is named.
std::vector<json> read_lines(const std::string& path) {
  const std::string text = read_file(path, size_t{1} << 31);
  std::vector<json> out;
  size_t at = 0;
  for (int64_t line_no = 1; at < text.size(); ++line_no) {
    size_t end = text.find('\n', at);
    const bool cut = end == std::string::npos;
    if (cut) end = text.size();
    const std::string_view line(text.data() + at, end - at);
    at = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception&) {
      j = nullptr;
    }
    if (!j.is_object())
      throw InputError(cat(path, ":", line_no, ": not a JSON object", cut ? " (the file ends in the middle of a line: cut short?)" : ""));
    out.push_back(std::move(j));
  }
  return out;
}

double num(const json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : kNaN;
}

std::string esc(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string fmt(double v, const char* f = "%.4g") {
  if (!std::isfinite(v)) return "&ndash;";
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

const char* const kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"};

struct Series {
  std::string name, color;
  std::vector<std::pair<double, double>> points;
  bool dashed = false, markers = false;
};

// Round tick positions covering [lo, hi]: steps of 1, 2 or 5 times a power of ten.
std::vector<double> ticks(double lo, double hi) {
  const double raw = (hi - lo) / 5, p = std::pow(10.0, std::floor(std::log10(raw)));
  const double step = raw / p < 1.5 ? p : raw / p < 3.5 ? 2 * p : raw / p < 7.5 ? 5 * p : 10 * p;
  std::vector<double> out;
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) out.push_back(std::abs(t) < step * 1e-9 ? 0 : t);
  return out;
}

struct Frame {
  double x0, x1, y0, y1;
};

// The frame of a chart, its title and legend (one band above the plot, two entries a row)
// and its axes; `xtick` labels the x axis (numbers, or the categories of a bar chart).
constexpr double kW = 640, kH = 300, kL = 70, kR = 16, kB = 46;
std::string frame(const std::string& title, const std::string& xlabel, const std::string& ylabel, const std::vector<Series>& series,
                  const Frame& f, double top, const std::vector<std::pair<double, std::string>>& xticks) {
  auto px = [&](double x) { return kL + (x - f.x0) / (f.x1 - f.x0) * (kW - kL - kR); };
  auto py = [&](double y) { return kH - kB - (y - f.y0) / (f.y1 - f.y0) * (kH - top - kB); };
  std::string svg = cat("<figure><svg xmlns=\"http://www.w3.org/2000/svg\" width=\"", kW, "\" height=\"", kH, "\" viewBox=\"0 0 ",
                        kW, " ", kH, "\" role=\"img\" aria-label=\"", esc(title), "\">\n<text x=\"", kL, "\" y=\"16\" class=\"title\">",
                        esc(title), "</text>\n");
  for (size_t k = 0; k < series.size(); ++k) {
    const double lx = kL + static_cast<double>(k % 2) * (kW - kL - kR) / 2, ly = 34 + 15.0 * static_cast<double>(k / 2);
    svg += cat("<line x1=\"", lx, "\" y1=\"", ly - 4, "\" x2=\"", lx + 20, "\" y2=\"", ly - 4, "\" stroke=\"", series[k].color,
               "\" stroke-width=\"", series[k].markers && series[k].dashed ? 2 : 3, "\"", series[k].dashed ? " stroke-dasharray=\"5 3\"" : "",
               "/><text x=\"", lx + 26, "\" y=\"", ly, "\" class=\"legend\">", esc(series[k].name), "</text>\n");
  }
  svg += cat("<rect x=\"", kL, "\" y=\"", top, "\" width=\"", kW - kL - kR, "\" height=\"", kH - top - kB, "\" class=\"plot\"/>\n");
  for (const auto& [x, label] : xticks)
    svg += cat("<line x1=\"", px(x), "\" y1=\"", kH - kB, "\" x2=\"", px(x), "\" y2=\"", kH - kB + 4, "\" class=\"axis\"/>",
               "<text x=\"", px(x), "\" y=\"", kH - kB + 16, "\" class=\"tick\" text-anchor=\"middle\">", label, "</text>\n");
  for (double y : ticks(f.y0, f.y1))
    svg += cat("<line x1=\"", kL, "\" y1=\"", py(y), "\" x2=\"", kW - kR, "\" y2=\"", py(y), "\" class=\"grid\"/>",
               "<text x=\"", kL - 6, "\" y=\"", py(y) + 4, "\" class=\"tick\" text-anchor=\"end\">", fmt(y, "%.4g"), "</text>\n");
  svg += cat("<text x=\"", (kL + kW - kR) / 2, "\" y=\"", kH - 8, "\" class=\"label\" text-anchor=\"middle\">", esc(xlabel), "</text>\n");
  svg += cat("<text x=\"14\" y=\"", (top + kH - kB) / 2, "\" class=\"label\" text-anchor=\"middle\" transform=\"rotate(-90 14 ",
             (top + kH - kB) / 2, ")\">", esc(ylabel), "</text>\n");
  return svg;
}

// Drops non-finite points and empty series; false when nothing is left.
bool finite_only(std::vector<Series>& series) {
  for (Series& s : series)
    std::erase_if(s.points, [](const auto& p) { return !std::isfinite(p.first) || !std::isfinite(p.second); });
  std::erase_if(series, [](const Series& s) { return s.points.empty(); });
  return !series.empty();
}

// The y range of the points, from 0 when `from_zero` and none is negative, with a margin.
std::pair<double, double> y_range(const std::vector<Series>& series, bool from_zero) {
  double y0 = INFINITY, y1 = -INFINITY;
  for (const Series& s : series)
    for (const auto& p : s.points) y0 = std::min(y0, p.second), y1 = std::max(y1, p.second);
  if (from_zero && y0 >= 0) y0 = 0;
  if (y1 == y0) {
    const double d = std::max(std::abs(y0) * 0.1, 1e-9);
    y0 = from_zero && y0 >= 0 ? y0 : y0 - d, y1 += d;
  }
  const double pad = (y1 - y0) * 0.05;
  return {from_zero && y0 >= 0 ? y0 : y0 - pad, y1 + pad};
}

double legend_top(size_t n) { return 34 + 15.0 * static_cast<double>((n + 1) / 2); }

// A line chart in inline SVG: one path per series (with markers where asked). Empty when no
// series has a finite point.
std::string chart(const std::string& title, const std::string& xlabel, const std::string& ylabel, std::vector<Series> series,
                  bool from_zero = false) {
  if (!finite_only(series)) return "";
  double x0 = INFINITY, x1 = -INFINITY;
  for (const Series& s : series)
    for (const auto& p : s.points) x0 = std::min(x0, p.first), x1 = std::max(x1, p.first);
  if (x1 == x0) x0 -= 1, x1 += 1;
  const std::pair<double, double> range = y_range(series, from_zero);
  const double y0 = range.first, y1 = range.second;  // (not a structured binding: lambdas below capture them)
  const Frame f{x0, x1, y0, y1};
  const double top = legend_top(series.size());
  std::vector<std::pair<double, std::string>> xt;
  for (double x : ticks(x0, x1)) xt.emplace_back(x, fmt(x, "%.4g"));
  std::string svg = frame(title, xlabel, ylabel, series, f, top, xt);
  auto px = [&](double x) { return kL + (x - x0) / (x1 - x0) * (kW - kL - kR); };
  auto py = [&](double y) { return kH - kB - (y - y0) / (y1 - y0) * (kH - top - kB); };
  for (const Series& s : series) {
    std::string d;
    for (const auto& [x, y] : s.points) d += cat(d.empty() ? "M" : " L", fmt(px(x), "%.2f"), " ", fmt(py(y), "%.2f"));
    if (s.points.size() == 1) d += cat(" L", fmt(px(s.points[0].first) + 0.5, "%.2f"), " ", fmt(py(s.points[0].second), "%.2f"));
    svg += cat("<path d=\"", d, "\" fill=\"none\" stroke=\"", s.color, "\" stroke-width=\"1.5\"",
               s.dashed ? " stroke-dasharray=\"5 3\"" : "", "/>\n");
    if (s.markers)
      for (const auto& [x, y] : s.points)
        svg += cat("<circle cx=\"", fmt(px(x), "%.2f"), "\" cy=\"", fmt(py(y), "%.2f"), "\" r=\"3\" fill=\"", s.color, "\"/>");
  }
  return svg + "</svg></figure>\n";
}

// Grouped bars: category i (x = i in each series' points) gets one bar per series, labelled
// `label(i)`.
std::string bars(const std::string& title, const std::string& xlabel, const std::string& ylabel, std::vector<Series> series,
                 const std::function<std::string(int64_t)>& label) {
  if (!finite_only(series)) return "";
  int64_t n = 0;
  for (const Series& s : series)
    for (const auto& p : s.points) n = std::max(n, static_cast<int64_t>(p.first) + 1);
  const std::pair<double, double> range = y_range(series, true);
  const double y0 = range.first, y1 = range.second;
  const Frame f{-0.5, static_cast<double>(n) - 0.5, y0, y1};
  const double top = legend_top(series.size());
  std::vector<std::pair<double, std::string>> xt;
  const int64_t every = std::max<int64_t>(1, n / 16);
  for (int64_t i = 0; i < n; i += every) xt.emplace_back(static_cast<double>(i), label(i));
  std::string svg = frame(title, xlabel, ylabel, series, f, top, xt);
  const double slot = (kW - kL - kR) / static_cast<double>(n), width = slot * 0.8 / static_cast<double>(series.size());
  auto py = [&](double y) { return kH - kB - (y - y0) / (y1 - y0) * (kH - top - kB); };
  for (size_t k = 0; k < series.size(); ++k)
    for (const auto& [x, y] : series[k].points) {
      const double left = kL + slot * (x + 0.1) + width * static_cast<double>(k);
      svg += cat("<path d=\"M", fmt(left, "%.2f"), " ", fmt(py(y0), "%.2f"), " L", fmt(left, "%.2f"), " ", fmt(py(y), "%.2f"), " L",
                 fmt(left + width, "%.2f"), " ", fmt(py(y), "%.2f"), " L", fmt(left + width, "%.2f"), " ", fmt(py(y0), "%.2f"),
                 " Z\" fill=\"", series[k].color, "\"><title>", esc(series[k].name), ", ", esc(label(static_cast<int64_t>(x))), ": ",
                 fmt(y, "%.4g"), "</title></path>\n");
    }
  return svg + "</svg></figure>\n";
}

// The start event in force at `step` (the last start at or before it).
const json* start_at(const RunRecord& r, double step) {
  const json* found = nullptr;
  for (const json& e : r.events)
    if (e.value("event", "") == "start" && num(e, "step") < step) found = &e;
  return found;
}

double median(std::vector<double> v) {
  std::erase_if(v, [](double x) { return !std::isfinite(x); });
  if (v.empty()) return kNaN;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// What the page says about one run, computed once.
struct Summary {
  int64_t world = 0;  // 0: unknown (no events.jsonl)
  double tokens = 0, train_s = 0, tokens_per_s = kNaN, step_ms = kNaN, final_loss = kNaN, final_val = kNaN;
  std::string model, precision;
  int64_t parameters = 0;
};

Summary summarize(const RunRecord& r) {
  Summary s;
  std::vector<double> tps, ms;
  for (size_t i = 0; i < r.steps.size(); ++i) {
    const json& j = r.steps[i];
    s.tokens += std::isfinite(num(j, "tokens")) ? num(j, "tokens") : 0;
    s.train_s += std::isfinite(num(j, "step_ms")) ? num(j, "step_ms") / 1e3 : 0;
    if (i > 0 || r.steps.size() == 1) {  // the first step warms up
      tps.push_back(num(j, "tokens_per_s"));
      ms.push_back(num(j, "step_ms"));
    }
    if (std::isfinite(num(j, "loss"))) s.final_loss = num(j, "loss");
    if (std::isfinite(num(j, "val_loss"))) s.final_val = num(j, "val_loss");
  }
  s.tokens_per_s = median(tps);
  s.step_ms = median(ms);
  for (const json& e : r.events)
    if (e.value("event", "") == "start") {
      s.world = e.value("world", int64_t{0});
      s.model = e.contains("model") ? e["model"].dump() : "";
      s.precision = e.value("precision", "");
      s.parameters = e.value("parameters", int64_t{0});
    }
  return s;
}

std::string row(const std::vector<std::string>& cells, bool head = false) {
  std::string out = "<tr>";
  for (const std::string& c : cells) out += cat(head ? "<th>" : "<td>", c, head ? "</th>" : "</td>");
  return out + "</tr>\n";
}

std::string run_section(const RunRecord& r, size_t k, const ReportOptions& o) {
  const Summary s = summarize(r);
  const std::string color = kColors[k % std::size(kColors)];
  std::string h = cat("<section><h2>", esc(r.name), "</h2>\n<p class=\"dir\">", esc(r.dir), "</p>\n");
  // Throughput, and model FLOPs per rank (MFU against the given peak).
  Series tps{"tokens/s", color, {}}, gflops{"GFLOP/s per rank", color, {}};
  for (const json& j : r.steps) {
    const double step = num(j, "step");
    tps.points.emplace_back(step, num(j, "tokens_per_s"));
    if (const json* st = start_at(r, step)) {
      const double per_rank = num(*st, "train_flops_per_token") * num(j, "tokens_per_s") / num(*st, "world") / 1e9;
      gflops.points.emplace_back(step, o.peak_gflops > 0 ? 100.0 * per_rank / o.peak_gflops : per_rank);
    }
  }
  h += "<div class=\"charts\">";
  h += chart("Throughput", "step", "tokens/s", {tps}, true);
  if (o.peak_gflops > 0) {
    gflops.name = cat("MFU (peak ", fmt(o.peak_gflops), " GFLOP/s per rank)");
    h += chart("Model FLOPs utilization", "step", "MFU, %", {gflops}, true);
  } else {
    h += chart("Model FLOPs per rank (give --peak-gflops for MFU)", "step", "GFLOP/s per rank", {gflops}, true);
  }
  // The step's time, split: what the training thread waited for, the rest is compute. Of
  // the waits, as far as they go, the slowest rank's compute beyond rank 0's (compute_ms):
  // waiting for it is a straggler's cost, not the communication's. Not in pipelines, whose
  // stages differ by design (their waits are the bubble, pp_wait_ms).
  Series compute{"compute (forward, backward, update)", "#1f77b4", {}}, comm{"exposed communication", "#d62728", {}},
      slowest{"waiting for the slowest rank", "#ff7f0e", {}, false, true}, wait{"data wait", "#2ca02c", {}},
      stall{"checkpoint stall", "#9467bd", {}, false, true};
  for (const json& j : r.steps) {
    const double step = num(j, "step"), total = num(j, "step_ms");
    double exposed = 0;
    for (const char* key : {"exposed_comm_ms", "tp_exposed_comm_ms", "pp_wait_ms"})
      if (std::isfinite(num(j, key))) exposed += num(j, key);
    double behind = 0;
    const auto it = j.find("compute_ms");
    if (it != j.end() && it->is_array() && it->size() > 1 && !j.contains("pp_wait_ms")) {
      double most = 0;
      for (const json& c : *it)
        if (c.is_number()) most = std::max(most, c.get<double>());
      if ((*it)[0].is_number()) behind = std::clamp(most - (*it)[0].get<double>(), 0.0, exposed);
    }
    const double data = std::isfinite(num(j, "data_wait_ms")) ? num(j, "data_wait_ms") : 0;
    const double ckpt = std::isfinite(num(j, "ckpt_stall_ms")) ? num(j, "ckpt_stall_ms") : 0;
    compute.points.emplace_back(step, std::max(0.0, total - exposed - data - ckpt));
    comm.points.emplace_back(step, exposed - behind);
    if (behind > 0) slowest.points.emplace_back(step, behind);
    wait.points.emplace_back(step, data);
    if (ckpt > 0) stall.points.emplace_back(step, ckpt);
  }
  h += chart("Step time, split", "step", "ms", {compute, comm, slowest, wait, stall}, true);
  // Memory per rank: the highest of each phase's peaks over the run.
  std::map<std::string, std::vector<double>> peaks;
  for (const json& j : r.steps)
    for (const char* key : {"mem_step_peak_mb", "mem_eval_peak_mb", "mem_ckpt_peak_mb"})
      if (j.contains(key) && j[key].is_array()) {
        std::vector<double>& p = peaks[key];
        p.resize(std::max(p.size(), j[key].size()), 0.0);
        for (size_t q = 0; q < j[key].size(); ++q)
          if (j[key][q].is_number()) p[q] = std::max(p[q], j[key][q].get<double>());
      }
  std::vector<Series> mem;
  const std::map<std::string, std::pair<const char*, const char*>> phase = {
      {"mem_step_peak_mb", {"training", "#1f77b4"}}, {"mem_eval_peak_mb", {"evaluation", "#2ca02c"}},
      {"mem_ckpt_peak_mb", {"checkpoint save", "#9467bd"}}};
  for (const char* key : {"mem_step_peak_mb", "mem_eval_peak_mb", "mem_ckpt_peak_mb"}) {
    if (!peaks.contains(key)) continue;
    const std::vector<double>& p = peaks.at(key);
    Series m{phase.at(key).first, phase.at(key).second, {}};
    for (size_t q = 0; q < p.size(); ++q) m.points.emplace_back(static_cast<double>(q), p[q]);
    mem.push_back(std::move(m));
  }
  h += bars("Peak resident memory per rank", "rank", "MiB", mem, [](int64_t r) { return cat(r); });
  h += "</div>\n";
  // Starts: restarts and the steps they lost.
  h += "<h3>Starts and restarts</h3>\n";
  int64_t restarts = 0, lost = 0;
  std::string starts;
  for (const json& e : r.events)
    if (e.value("event", "") == "start") {
      restarts += e.value("how", "") != "fresh";
      lost += e.value("steps_lost", int64_t{0});
      starts += row({esc(e.value("how", "")), fmt(num(e, "step"), "%.0f"), fmt(num(e, "steps_lost"), "%.0f"),
                     fmt(num(e, "world"), "%.0f"), cat(fmt(num(e, "dp"), "%.0f"), " x ", fmt(num(e, "tp"), "%.0f"), " x ", fmt(num(e, "pp"), "%.0f"))});
    }
  if (r.events.empty()) {
    h += "<p>No events.jsonl: a run from before Loom recorded its starts.</p>\n";
  } else {
    h += cat("<p>", restarts, " restart(s), ", lost, " step(s) lost.</p>\n<table>", row({"start", "from step", "steps lost", "ranks", "dp x tp x pp"}, true),
             starts, "</table>\n");
  }
  // Checkpoints: the saves' stalls (on the step after each) and what is on disk.
  h += "<h3>Checkpoints</h3>\n";
  std::string saves;
  int64_t n_saves = 0;
  for (const json& j : r.steps)
    if (std::isfinite(num(j, "ckpt_stall_ms"))) {
      ++n_saves;
      saves += row({fmt(num(j, "step") - 1, "%.0f"), fmt(num(j, "ckpt_stall_ms"), "%.1f")});
    }
  h += cat("<p>", n_saves, " save(s) recorded in the metrics; ", r.checkpoints.size(), " checkpoint(s) on disk.</p>\n");
  if (n_saves > 0) h += cat("<table>", row({"saved after step", "training stalled, ms"}, true), saves, "</table>\n");
  if (!r.checkpoints.empty()) {
    h += cat("<table>", row({"on disk", "MB"}, true));
    for (const auto& [step, bytes] : r.checkpoints) h += row({cat("step_", step), fmt(static_cast<double>(bytes) / 1e6, "%.2f")});
    h += "</table>\n";
  }
  // Cost.
  if (o.price_per_hour > 0) {
    h += "<h3>Cost</h3>\n";
    if (s.world <= 0) {
      h += "<p>Unknown: the run's world size is not recorded (no events.jsonl).</p>\n";
    } else {
      const double per_step = o.price_per_hour * static_cast<double>(s.world) * s.step_ms / 3.6e6;
      const double total = o.price_per_hour * static_cast<double>(s.world) * s.train_s / 3600;
      h += cat("<table>", row({"price per rank-hour", "ranks", "per step (median)", "per 1M tokens", "training time", "total"}, true),
               row({fmt(o.price_per_hour, "%.4g"), cat(s.world), fmt(per_step, "%.6f"), fmt(total / s.tokens * 1e6, "%.4f"),
                    fmt(s.train_s / 3600, "%.3f h"), fmt(total, "%.4f")}),
               "</table>\n");
    }
  }
  return h + "</section>\n";
}

// Scaling: runs of one model (the same model, precision) on different world sizes, against
// the smallest world's tokens/s.
std::string scaling_section(const std::vector<RunRecord>& runs) {
  std::map<std::string, std::vector<std::pair<Summary, const RunRecord*>>> groups;
  for (const RunRecord& r : runs) {
    Summary s = summarize(r);
    if (s.world > 0 && std::isfinite(s.tokens_per_s)) groups[s.model + s.precision].emplace_back(s, &r);
  }
  std::string h;
  for (auto& [key, g] : groups) {
    std::set<int64_t> worlds;
    for (const auto& [s, r] : g) worlds.insert(s.world);
    if (worlds.size() < 2) continue;
    std::sort(g.begin(), g.end(), [](const auto& a, const auto& b) { return a.first.world < b.first.world; });
    const Summary& base = g.front().first;
    Series speedup{"speedup", "#1f77b4", {}, false, true}, ideal{"ideal", "#7f7f7f", {}, true};
    std::string table = row({"run", "ranks", "tokens/s (median)", "speedup", "scaling efficiency"}, true);
    for (const auto& [s, r] : g) {
      const double sp = s.tokens_per_s / base.tokens_per_s, n = static_cast<double>(s.world) / static_cast<double>(base.world);
      speedup.points.emplace_back(static_cast<double>(s.world), sp);
      ideal.points.emplace_back(static_cast<double>(s.world), n);
      table += row({esc(r->name), cat(s.world), fmt(s.tokens_per_s, "%.0f"), fmt(sp, "%.2fx"), fmt(100 * sp / n, "%.1f%%")});
    }
    h += cat("<section><h2>Scaling</h2>\n<p>", g.size(), " runs of one model (", esc(std::to_string(base.parameters)),
             " parameters, ", esc(base.precision), "), against the run on ", base.world, " rank(s).</p>\n<div class=\"charts\">",
             chart("Speedup over the smallest world", "ranks", "speedup", {speedup, ideal}, true), "</div>\n<table>", table,
             "</table></section>\n");
  }
  return h;
}

}  // namespace

RunRecord read_run(const std::string& dir) {
  RunRecord r{.dir = dir, .name = fs::path(dir).lexically_normal().filename().string()};
  if (r.name.empty() || r.name == ".") r.name = fs::path(dir).lexically_normal().parent_path().filename().string();
  const fs::path metrics = fs::path(dir) / "metrics.jsonl";
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw InputError(cat(dir, ": not a run directory (no such directory)"));
  if (!fs::exists(metrics, ec)) throw InputError(cat(dir, ": not a run directory, or no step yet (no metrics.jsonl)"));
  r.steps = read_lines(metrics.string());
  std::erase_if(r.steps, [](const json& j) { return !j.contains("step"); });  // a parameter server's final line
  if (r.steps.empty()) throw InputError(cat(metrics.string(), ": no step recorded yet"));
  for (const json& j : r.steps)
    if (!j["step"].is_number_integer()) throw InputError(cat(metrics.string(), ": a line whose \"step\" is not an integer"));
  if (fs::exists(fs::path(dir) / "events.jsonl", ec)) r.events = read_lines((fs::path(dir) / "events.jsonl").string());
  const fs::path ckpts = fs::path(dir) / "checkpoints";
  if (fs::is_directory(ckpts, ec))
    for (const auto& e : fs::directory_iterator(ckpts, ec)) {
      const std::string n = e.path().filename().string();
      if (!e.is_directory() || !n.starts_with("step_") || n.find_first_not_of("0123456789", 5) != std::string::npos || n.size() == 5)
        continue;
      int64_t bytes = 0;
      for (const auto& f : fs::recursive_directory_iterator(e.path(), ec))
        if (f.is_regular_file()) bytes += static_cast<int64_t>(f.file_size());
      r.checkpoints.emplace_back(std::stoll(n.substr(5)), bytes);
    }
  std::sort(r.checkpoints.begin(), r.checkpoints.end());
  return r;
}

std::string render_report(const std::vector<RunRecord>& runs, const ReportOptions& o) {
  std::string h = R"(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Loom run report</title>
<style>
body { font: 14px/1.4 sans-serif; margin: 24px; color: #222; max-width: 1340px; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 28px; border-bottom: 1px solid #ccc; } h3 { font-size: 15px; }
table { border-collapse: collapse; margin: 8px 0; } td, th { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th { background: #f3f3f3; } td:first-child, th:first-child { text-align: left; }
.charts { display: flex; flex-wrap: wrap; gap: 8px; } figure { margin: 0; }
.plot { fill: #fcfcfc; stroke: #999; } .grid { stroke: #e4e4e4; } .axis { stroke: #999; }
.title { font: bold 13px sans-serif; } .tick { font: 11px sans-serif; fill: #555; } .label { font: 12px sans-serif; fill: #333; }
.legend { font: 11px sans-serif; fill: #333; } .dir { color: #666; font-family: monospace; }
</style></head><body>
)";
  h += cat("<h1>Loom run report</h1>\n<p>", runs.size(), " run(s)", o.generated.empty() ? "" : cat(", generated ", esc(o.generated)),
           ".</p>\n");
  std::string table = row({"run", "steps", "ranks", "precision", "parameters", "tokens", "training time, s", "tokens/s (median)",
                           "step, ms (median)", "last loss", "last val loss"}, true);
  std::vector<Series> loss;
  for (size_t k = 0; k < runs.size(); ++k) {
    const RunRecord& r = runs[k];
    const Summary s = summarize(r);
    table += row({esc(r.name), cat(r.steps.back().value("step", int64_t{0})), s.world > 0 ? cat(s.world) : "&ndash;",
                  esc(s.precision), s.parameters > 0 ? cat(s.parameters) : "&ndash;", fmt(s.tokens, "%.0f"), fmt(s.train_s, "%.1f"),
                  fmt(s.tokens_per_s, "%.0f"), fmt(s.step_ms, "%.1f"), fmt(s.final_loss), fmt(s.final_val)});
    const std::string color = kColors[k % std::size(kColors)];
    Series train{cat(r.name, " loss"), color, {}}, val{cat(r.name, " val loss"), color, {}, true, true};
    for (const json& j : r.steps) {
      train.points.emplace_back(num(j, "step"), num(j, "loss"));
      val.points.emplace_back(num(j, "step"), num(j, "val_loss"));
    }
    loss.push_back(std::move(train));
    loss.push_back(std::move(val));
  }
  h += cat("<table>", table, "</table>\n<div class=\"charts\">", chart("Loss", "step", "loss", loss), "</div>\n");
  for (size_t k = 0; k < runs.size(); ++k) h += run_section(runs[k], k, o);
  h += scaling_section(runs);
  return h + "</body></html>\n";
}

}  // namespace loom::obs
