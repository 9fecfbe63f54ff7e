#!/usr/bin/env python3
"""plot_scaling.py CSV SVG MACHINE: images/s against ranks for each implementation (columns
ranks,<implementation>...) as a small SVG line chart, with ideal linear scaling from dtrain's one
rank dashed, and the machine the figures come from written under the title. Plain SVG, no
plotting library."""
import csv
import sys

table = list(csv.DictReader(open(sys.argv[1])))
machine = sys.argv[3] if len(sys.argv) > 3 else "machine not recorded"
names = [c for c in table[0] if c != "ranks"]
series = {c: [(int(r["ranks"]), float(r[c])) for r in table] for c in names}
labels = {"dtrain": "dtrain DDP (C++)", "pytorch_ddp": "PyTorch DDP (gloo)"}
colours = ["#1f6feb", "#d1242f", "#1a7f37"]
W, H, L, B, T, R = 600, 380, 70, 50, 48, 20
first = series[names[0]]
xmax = max(n for n, _ in first)
ideal = [(n, first[0][1] * n) for n, _ in first]
ymax = max(max(v for s in series.values() for _, v in s), max(v for _, v in ideal)) * 1.1


def x(n):
    return round(L + (n - 1) / max(1, xmax - 1) * (W - L - R), 1)


def y(v):
    return round(H - B - v / ymax * (H - B - T), 1)


out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
       f'<rect width="{W}" height="{H}" fill="white"/>',
       f'<text x="{W / 2}" y="18" text-anchor="middle" font-size="14">Fashion-MNIST ConvNet, data parallel, 1 thread per rank: images/s against ranks</text>',
       f'<text x="{W / 2}" y="34" text-anchor="middle" fill="#555">{machine}</text>',
       f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="black"/>',
       f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="black"/>']
for n, _ in first:
    out.append(f'<text x="{x(n)}" y="{H - B + 18}" text-anchor="middle">{n}</text>')
out.append(f'<text x="{W / 2}" y="{H - 10}" text-anchor="middle">ranks</text>')
step = 10 ** (len(str(int(ymax))) - 1)
for v in range(0, int(ymax) + 1, step if ymax / step > 3 else step // 2):
    out.append(f'<text x="{L - 6}" y="{y(v) + 4}" text-anchor="end">{v}</text>')
    out.append(f'<line x1="{L}" y1="{y(v)}" x2="{W - R}" y2="{y(v)}" stroke="#ddd"/>')
out.append(f'<text x="16" y="{H / 2}" transform="rotate(-90 16 {H / 2})" text-anchor="middle">images/s</text>')
pts = " ".join(f"{x(n)},{y(v)}" for n, v in ideal)
out.append(f'<polyline points="{pts}" fill="none" stroke="#999" stroke-dasharray="5,4"/>')
for i, name in enumerate(names):
    colour = colours[i % len(colours)]
    rows = series[name]
    pts = " ".join(f"{x(n)},{y(v)}" for n, v in rows)
    out.append(f'<polyline points="{pts}" fill="none" stroke="{colour}" stroke-width="2"/>')
    for n, v in rows:
        out.append(f'<circle cx="{x(n)}" cy="{y(v)}" r="4" fill="{colour}"/>')
        last = n == xmax
        dy = -8 if i == 0 else 16
        out.append(f'<text x="{x(n) + (-6 if last else 6)}" y="{y(v) + dy}" text-anchor="{"end" if last else "start"}" fill="{colour}">{v:.0f}</text>')
    out.append(f'<text x="{L + 10}" y="{T + 14 + 16 * i}" fill="{colour}">{labels.get(name, name)}</text>')
out.append(f'<text x="{L + 10}" y="{T + 14 + 16 * len(names)}" fill="#999">dashed: linear scaling from 1 rank of {labels.get(names[0], names[0])}</text>')
out.append("</svg>")
open(sys.argv[2], "w").write("\n".join(out) + "\n")
