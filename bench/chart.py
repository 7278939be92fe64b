#!/usr/bin/env python3
"""One matrix run's figures, from the results ledger, as an SVG chart: a
panel per operation, a group of bars per shape, a bar per tool (its best
GB/s, the median marked on it), and pinned host-to-device copies as a line
where the run measured them. Only figures of one run are drawn (one
commit, one command: compare only rows of one run).

    python3 bench/chart.py --commit 52686d7 [--match "--ops load_file"] --out bench/matrix.svg
"""

from __future__ import annotations

import argparse
import json
import re
from html import escape

FIGURE = re.compile(r"(\S+) (\S+) (.+?) GB/s \((best|median) of (\d+)\)$")
H2D = "pinned host-to-device copies GB/s (best of 5)"
COLORS = ["#2b6cb0", "#9c4221", "#2f855a", "#6b46c1", "#b7791f", "#4a5568", "#c53030"]
PANEL_W, PANEL_H, TOP, LEFT, BOTTOM = 560, 250, 40, 48, 60


def one_run(lines: list, commit: str, match: str) -> tuple:
    """The newest matrix command of `commit` (whose text holds `match`) and
    its lines."""
    runs = [l["command"] for l in lines
            if l["commit"] == commit and "bench/matrix.py" in l["command"] and match in l["command"]]
    if not runs:
        raise SystemExit(f"no matrix run of commit {commit} in the ledger" + (f" matching {match!r}" if match else ""))
    command = runs[-1]
    return command, [l for l in lines if l["command"] == command and l["commit"] == commit]


def figures(lines: list) -> tuple:
    """{op: {shape: {tool: {"best", "median", "n"}}}} and the H2D limit."""
    table: dict = {}
    h2d = None
    for l in lines:
        if l["figure"] == H2D:
            h2d = l["value"]
            continue
        m = FIGURE.match(l["figure"])
        if not m:
            continue
        op, shape, tool, kind, n = m.groups()
        cell = table.setdefault(op, {}).setdefault(shape, {}).setdefault(tool, {"n": int(n)})
        cell[kind] = l["value"]
    return table, h2d


def panel(op: str, shapes: dict, tools: list, color: dict, h2d, x0: int, y0: int) -> list:
    """One operation's bars, in SVG elements, at (x0, y0)."""
    top = max([c.get("best", 0) for cols in shapes.values() for c in cols.values()] + [h2d or 0]) * 1.12 or 1
    plot_w, plot_h = PANEL_W - LEFT - 10, PANEL_H - TOP - BOTTOM

    def y_of(v: float) -> float:
        return y0 + TOP + plot_h - v / top * plot_h

    out = [f'<text x="{x0 + LEFT}" y="{y0 + 22}" font-weight="bold">{escape(op)}</text>',
           f'<line x1="{x0 + LEFT}" y1="{y0 + TOP + plot_h}" x2="{x0 + LEFT + plot_w}" '
           f'y2="{y0 + TOP + plot_h}" stroke="#333"/>']
    for k in range(5):
        v = top / 1.12 * k / 4
        out.append(f'<text x="{x0 + LEFT - 6}" y="{y_of(v) + 4:.1f}" text-anchor="end" font-size="10">{v:.0f}</text>')
    group = plot_w / len(shapes)
    bar = min(40, group * 0.8 / len(tools))
    for i, (shape, cols) in enumerate(shapes.items()):
        gx = x0 + LEFT + i * group + (group - bar * len(tools)) / 2
        out.append(f'<text x="{gx + bar * len(tools) / 2:.1f}" y="{y0 + TOP + plot_h + 16}" text-anchor="middle" '
                   f'font-size="11">{escape(shape)}</text>')
        for j, tool in enumerate(tools):
            c = cols.get(tool)
            if not c or "best" not in c:
                continue
            x, y = gx + j * bar, y_of(c["best"])
            out.append(f'<rect class="bar" data-tool="{escape(tool)}" x="{x:.1f}" y="{y:.1f}" width="{bar - 2:.1f}" '
                       f'height="{y0 + TOP + plot_h - y:.1f}" fill="{color[tool]}"/>')
            out.append(f'<text x="{x + (bar - 2) / 2:.1f}" y="{y - 3:.1f}" text-anchor="middle" '
                       f'font-size="9">{c["best"]:.1f}</text>')
            if "median" in c:
                my = y_of(c["median"])
                out.append(f'<line x1="{x:.1f}" y1="{my:.1f}" x2="{x + bar - 2:.1f}" y2="{my:.1f}" stroke="#fff" '
                           f'stroke-width="2"/>')
    if h2d and op in ("load_file", "get_slice"):
        out.append(f'<line x1="{x0 + LEFT}" y1="{y_of(h2d):.1f}" x2="{x0 + LEFT + plot_w}" y2="{y_of(h2d):.1f}" '
                   f'stroke="#c53030" stroke-dasharray="5,3"/>')
        out.append(f'<text x="{x0 + LEFT + plot_w}" y="{y_of(h2d) - 4:.1f}" text-anchor="end" font-size="10" '
                   f'fill="#c53030">pinned H2D {h2d:.1f}</text>')
    return out


def render(table: dict, h2d, title: list) -> str:
    """The chart: `title`'s lines, panels two to a row, a legend of the
    tools."""
    tools = list(dict.fromkeys(t for shapes in table.values() for cols in shapes.values() for t in cols))
    tools.sort(key=lambda t: (not t.startswith("zerohop"), t))
    color = {t: COLORS[j % len(COLORS)] for j, t in enumerate(tools)}
    cols = min(2, len(table)) or 1
    rows = (len(table) + cols - 1) // cols
    head = 18 * len(title) + 6
    width, height = cols * PANEL_W, head + rows * PANEL_H + 36
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
           f'font-size="12">', f'<rect width="{width}" height="{height}" fill="#fff"/>']
    out += [f'<text x="10" y="{18 * (k + 1)}">{escape(t)}</text>' for k, t in enumerate(title)]
    for k, (op, shapes) in enumerate(table.items()):
        out += panel(op, shapes, [t for t in tools if any(t in c for c in shapes.values())], color, h2d,
                     (k % cols) * PANEL_W, head + (k // cols) * PANEL_H)
    x = 10
    for tool in tools:
        out.append(f'<rect x="{x}" y="{height - 22}" width="12" height="12" fill="{color[tool]}"/>')
        out.append(f'<text x="{x + 16}" y="{height - 12}">{escape(tool)}</text>')
        x += 24 + 7 * len(tool)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ledger", default="bench/results.jsonl")
    ap.add_argument("--commit", required=True, help="the commit whose matrix run to draw")
    ap.add_argument("--match", default="", help="text its command holds, where the commit has several runs")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    with open(args.ledger) as f:
        lines = [json.loads(l) for l in f if l.strip()]
    command, mine = one_run(lines, args.commit, args.match)
    table, h2d = figures(mine)
    if not table:
        raise SystemExit(f"the run of {args.commit} has no GB/s figures to draw")
    date, machine = mine[0]["date"], mine[0]["machine"]
    title = ["GB/s, first call in a fresh process (bar: best; white mark: median)",
             f"commit {args.commit}, {machine}, {date}"]
    with open(args.out, "w") as f:
        f.write(render(table, h2d, title))
    print(f"{args.out}: {', '.join(table)} from {command!r}")


if __name__ == "__main__":
    main()
