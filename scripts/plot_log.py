#!/usr/bin/env python3
"""plot_log.py — plots sbp-train's --log FILE.jsonl as an SVG: three panels sharing
the step axis, training loss (with held-out loss, dashed, on the steps that have one), learning
rate, and gradient norm (before clipping), one line per log file with a legend.

    scripts/plot_log.py RUN.jsonl [MORE.jsonl ...] -o loss.svg [--title TEXT]

The line format is train/train_log.h's. Only the Python standard library is used and the SVG is
written by hand, so the plot can be made on any machine that ran sbp-train, with nothing to
install. A null value (a non-finite number in the log) leaves a gap in its line rather than
stopping the plot: a diverged step is what one wants to see. Lines that are not JSON (a log cut
off mid-line by a crash) are skipped with a note.
"""
import argparse
import json
import math
import sys
from xml.sax.saxutils import escape

# Colours that stay apart for the first few runs and in grey print (Tableau 10's first ones).
COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
W, PANEL_H, GAP, LEFT, RIGHT, TOP = 760, 170, 46, 78, 20, 40
PANELS = [("loss", "loss"), ("lr", "learning rate"), ("grad_norm", "gradient norm")]


def read_log(path):
    """The log's rows as dicts, in file order; a resumed run's log is already one sequence."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                print(f"plot_log.py: note: {path}:{n}: not JSON, skipped", file=sys.stderr)
                continue
            if isinstance(row, dict) and isinstance(row.get("step"), (int, float)):
                rows.append(row)
    return rows


def nice_ticks(lo, hi, n=5):
    """About n round tick values covering [lo, hi] (1, 2, 2.5 or 5 times a power of ten)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [0.0, 1.0]
    if hi <= lo:  # a flat line (a constant lr): give it a band to sit in
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.floor(lo / step) * step
    ticks, t = [], first
    while t < hi + step * 0.999:
        ticks.append(round(t, 12))
        t += step
    return ticks


def fmt(v):
    """A tick label: short, and exponent form for the small numbers a learning rate has."""
    if v == 0:
        return "0"
    if abs(v) < 1e-3 or abs(v) >= 1e5:
        return f"{v:.1e}".replace("e-0", "e-").replace("e+0", "e")
    return f"{v:.6g}"


def series(rows, key):
    """(step, value) runs split at nulls, so a missing value is a gap, not a jump to zero. A
    step without the key at all is passed over: eval_loss is only on the evaluated steps."""
    runs, cur = [], []
    for r in rows:
        if key not in r:
            continue
        v = r[key]
        if isinstance(v, (int, float)) and math.isfinite(v):
            cur.append((float(r["step"]), float(v)))
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    return runs


def plot(logs, title):
    """The SVG text for logs: a list of (label, rows)."""
    all_steps = [float(r["step"]) for _, rows in logs for r in rows]
    x_ticks = nice_ticks(min(all_steps), max(all_steps))
    x0, x1 = x_ticks[0], x_ticks[-1]
    pw = W - LEFT - RIGHT
    has_eval = any(series(rows, "eval_loss") for _, rows in logs)
    legend_h = 18 * (len(logs) + (2 if has_eval else 0))
    height = TOP + len(PANELS) * (PANEL_H + GAP) + legend_h + 10
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" '
           f'viewBox="0 0 {W} {height}" font-family="sans-serif" font-size="11">',
           f'<rect width="{W}" height="{height}" fill="white"/>',
           f'<text x="{W / 2}" y="22" text-anchor="middle" font-size="14">{escape(title)}</text>']

    def sx(x):
        return LEFT + (x - x0) / (x1 - x0) * pw

    for p, (key, name) in enumerate(PANELS):
        top = TOP + p * (PANEL_H + GAP)
        keys = [key, "eval_loss"] if key == "loss" else [key]
        vals = [v for _, rows in logs for k in keys for run in series(rows, k) for _, v in run]
        y_ticks = nice_ticks(min(vals), max(vals)) if vals else [0.0, 1.0]
        y0, y1 = y_ticks[0], y_ticks[-1]

        def sy(y, top=top, y0=y0, y1=y1):
            return top + PANEL_H - (y - y0) / (y1 - y0) * PANEL_H

        out.append(f'<g class="panel" id="panel-{key}">')
        out.append(f'<rect x="{LEFT}" y="{top}" width="{pw}" height="{PANEL_H}" fill="none" '
                   'stroke="#444"/>')
        for t in y_ticks:
            y = sy(t)
            out.append(f'<line x1="{LEFT - 4}" y1="{y:.2f}" x2="{LEFT + pw}" y2="{y:.2f}" '
                       'stroke="#ddd"/>')
            out.append(f'<text x="{LEFT - 7}" y="{y + 4:.2f}" text-anchor="end">{fmt(t)}</text>')
        for t in x_ticks:
            x = sx(t)
            out.append(f'<line x1="{x:.2f}" y1="{top}" x2="{x:.2f}" y2="{top + PANEL_H + 4}" '
                       'stroke="#ddd"/>')
            out.append(f'<text x="{x:.2f}" y="{top + PANEL_H + 16}" text-anchor="middle">'
                       f'{fmt(t)}</text>')
        out.append(f'<text x="{LEFT + pw / 2}" y="{top + PANEL_H + 32}" text-anchor="middle">'
                   'step</text>')
        cy = top + PANEL_H / 2
        out.append(f'<text x="16" y="{cy}" text-anchor="middle" transform="rotate(-90 16 {cy})">'
                   f'{escape(name)}</text>')
        for i, (label, rows) in enumerate(logs):
            colour = COLOURS[i % len(COLOURS)]
            for k in keys:
                dash = ' stroke-dasharray="5 3"' if k == "eval_loss" else ""
                for run in series(rows, k):
                    pts = " ".join(f"{sx(x):.2f},{sy(y):.2f}" for x, y in run)
                    out.append(f'<polyline class="{k}" fill="none" stroke="{colour}" '
                               f'stroke-width="1.5"{dash} points="{pts}"><title>'
                               f'{escape(label)}: {k}</title></polyline>')
        out.append("</g>")

    ly = TOP + len(PANELS) * (PANEL_H + GAP)
    for i, (label, _) in enumerate(logs):
        y = ly + 18 * i
        colour = COLOURS[i % len(COLOURS)]
        out.append(f'<line x1="{LEFT}" y1="{y}" x2="{LEFT + 24}" y2="{y}" stroke="{colour}" '
                   'stroke-width="2"/>')
        out.append(f'<text x="{LEFT + 30}" y="{y + 4}">{escape(label)}</text>')
    if has_eval:  # the loss panel's two line styles
        for j, (dash, text) in enumerate(((None, "loss: training (the batch just trained on)"),
                                          ("5 3", "loss: evaluation on held-out data "
                                           "(--eval-data)"))):
            y = ly + 18 * (len(logs) + j)
            d = f' stroke-dasharray="{dash}"' if dash else ""
            out.append(f'<line class="key" x1="{LEFT}" y1="{y}" x2="{LEFT + 24}" y2="{y}" '
                       f'stroke="#444" stroke-width="1.5"{d}/>')
            out.append(f'<text x="{LEFT + 30}" y="{y + 4}">{escape(text)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description="Plot sbp-train --log JSONL files as an SVG.")
    ap.add_argument("logs", nargs="+", help="one or more --log FILE.jsonl")
    ap.add_argument("-o", "--output", required=True, help="the SVG to write")
    ap.add_argument("--title", default="sbp-train", help="the plot's title")
    ap.add_argument("--label", action="append", default=[],
                    help="a legend label per log, in order (default: the file name)")
    a = ap.parse_args()
    logs = []
    for i, path in enumerate(a.logs):
        rows = read_log(path)
        if not rows:
            sys.exit(f"plot_log.py: error: {path}: no step lines")
        logs.append((a.label[i] if i < len(a.label) else path.rsplit("/", 1)[-1], rows))
    svg = plot(logs, a.title)
    with open(a.output, "w", encoding="utf-8") as f:
        f.write(svg)
    steps = sum(len(rows) for _, rows in logs)
    print(f"plot_log.py: {a.output}: {len(logs)} log(s), {steps} steps")


if __name__ == "__main__":
    main()
