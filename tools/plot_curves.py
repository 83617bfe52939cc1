#!/usr/bin/env python3
"""Training-loss curves of several runs as one SVG (no plotting library needed).

Usage: plot_curves.py OUT.svg TITLE LABEL=metrics.jsonl [LABEL=metrics.jsonl ...]
       plot_curves.py --xy XLABEL YLABEL OUT.svg TITLE LABEL=points.csv [...]

The --xy form draws each CSV of "x,y" lines as a polyline with its points marked, unsmoothed.

Each run's `loss` per `step` (lines without a loss are skipped) is drawn as a polyline,
smoothed by a centred moving average over 2% of the steps, on shared axes; the legend
names each run with its final validation figure when the file has one (final_val_loss,
final_val_accuracy, or the last val_loss).
"""
import json
import sys

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
W, H, LEFT, RIGHT, TOP, BOTTOM = 720, 420, 70, 20, 40, 50


def read(path):
    steps, losses, final = [], [], ""
    for line in open(path):
        row = json.loads(line)
        if "loss" in row:
            steps.append(row["step"])
            losses.append(row["loss"])
        if "val_loss" in row:
            final = f"val loss {row['val_loss']:.3f}"
        if "final_val_loss" in row:
            final = f"val loss {row['final_val_loss']:.3f}"
            if "final_val_accuracy" in row:
                final += f", accuracy {row['final_val_accuracy']:.3f}"
    return steps, losses, final


def smooth(ys, k):
    out = []
    for i in range(len(ys)):
        lo, hi = max(0, i - k), min(len(ys), i + k + 1)
        out.append(sum(ys[lo:hi]) / (hi - lo))
    return out


def main():
    args = sys.argv[1:]
    xy = args[0] == "--xy"
    xlabel, ylabel = (args[1], args[2]) if xy else ("step (global batches)", "training loss (smoothed)")
    if xy:
        args = args[3:]
    out, title, runs = args[0], args[1], [a.rsplit("=", 1) for a in args[2:]]
    curves = []
    for label, path in runs:
        if xy:
            pts = [tuple(float(v) for v in line.split(",")) for line in open(path) if line.strip()]
            curves.append((label, [x for x, _ in pts], [y for _, y in pts], ""))
            continue
        steps, losses, final = read(path)
        k = max(1, len(steps) // 100)
        curves.append((label, steps, smooth(losses, k), final))
    xmax = max(max(s) for _, s, _, _ in curves)
    ymin = min(min(y) for _, _, y, _ in curves)
    ymax = max(max(y) for _, _, y, _ in curves)
    pad = 0.05 * (ymax - ymin or 1)
    ymin, ymax = ymin - pad, ymax + pad
    px = lambda x: LEFT + (W - LEFT - RIGHT) * x / xmax
    py = lambda y: TOP + (H - TOP - BOTTOM) * (ymax - y) / (ymax - ymin)
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{W / 2}" y="22" text-anchor="middle" font-size="15">{title}</text>']
    for i in range(6):  # grid and tick labels
        y = ymin + (ymax - ymin) * i / 5
        svg.append(f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{py(y):.1f}" y2="{py(y):.1f}" stroke="#ddd"/>')
        svg.append(f'<text x="{LEFT - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{y:.2f}</text>')
        x = xmax * i / 5
        svg.append(f'<text x="{px(x):.1f}" y="{H - BOTTOM + 18}" text-anchor="middle">{x:.{2 if xy else 0}f}</text>')
    svg.append(f'<rect x="{LEFT}" y="{TOP}" width="{W - LEFT - RIGHT}" height="{H - TOP - BOTTOM}" fill="none" stroke="#333"/>')
    svg.append(f'<text x="{(LEFT + W - RIGHT) / 2}" y="{H - 12}" text-anchor="middle">{xlabel}</text>')
    svg.append(f'<text x="16" y="{(TOP + H - BOTTOM) / 2}" text-anchor="middle" '
               f'transform="rotate(-90 16 {(TOP + H - BOTTOM) / 2})">{ylabel}</text>')
    for i, (label, steps, ys, final) in enumerate(curves):
        color = COLORS[i % len(COLORS)]
        points = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(steps, ys))
        svg.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.6" points="{points}"/>')
        if xy:
            for x, y in zip(steps, ys):
                svg.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{color}"/>')
        ly = TOP + 18 + 18 * i
        lx = LEFT + 12 if xy else W - RIGHT - 260  # xy: loss grows with x, the legend goes top left
        svg.append(f'<line x1="{lx}" x2="{lx + 24}" y1="{ly - 4}" y2="{ly - 4}" stroke="{color}" stroke-width="3"/>')
        svg.append(f'<text x="{lx + 30}" y="{ly}">{label}{": " + final if final else ""}</text>')
    svg.append("</svg>")
    open(out, "w").write("\n".join(svg) + "\n")


if __name__ == "__main__":
    main()
