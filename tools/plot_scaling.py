#!/usr/bin/env python3
"""plot_scaling.py CSV SVG: images/s against ranks (columns ranks,images_per_sec) as a small SVG
line chart, with the ideal linear scaling from one rank dashed. Plain SVG, no plotting library."""
import csv
import sys

rows = [(int(r["ranks"]), float(r["images_per_sec"])) for r in csv.DictReader(open(sys.argv[1]))]
W, H, L, B, T, R = 560, 360, 70, 50, 30, 20
xmax = max(n for n, _ in rows)
ideal = [(n, rows[0][1] * n) for n, _ in rows]
ymax = max(max(v for _, v in rows), max(v for _, v in ideal)) * 1.1


def x(n):
    return round(L + (n - 1) / max(1, xmax - 1) * (W - L - R), 1)


def y(v):
    return round(H - B - v / ymax * (H - B - T), 1)


out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
       f'<rect width="{W}" height="{H}" fill="white"/>',
       f'<text x="{W / 2}" y="18" text-anchor="middle" font-size="14">train_fashion_mnist (DDP, 1 thread per rank): images/s against ranks</text>',
       f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="black"/>',
       f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="black"/>']
for n, _ in rows:
    out.append(f'<text x="{x(n)}" y="{H - B + 18}" text-anchor="middle">{n}</text>')
out.append(f'<text x="{W / 2}" y="{H - 10}" text-anchor="middle">ranks</text>')
step = 10 ** (len(str(int(ymax))) - 1)
for v in range(0, int(ymax) + 1, step if ymax / step > 3 else step // 2):
    out.append(f'<text x="{L - 6}" y="{y(v) + 4}" text-anchor="end">{v}</text>')
    out.append(f'<line x1="{L}" y1="{y(v)}" x2="{W - R}" y2="{y(v)}" stroke="#ddd"/>')
out.append(f'<text x="16" y="{H / 2}" transform="rotate(-90 16 {H / 2})" text-anchor="middle">images/s</text>')
pts = " ".join(f"{x(n)},{y(v)}" for n, v in ideal)
out.append(f'<polyline points="{pts}" fill="none" stroke="#999" stroke-dasharray="5,4"/>')
pts = " ".join(f"{x(n)},{y(v)}" for n, v in rows)
out.append(f'<polyline points="{pts}" fill="none" stroke="#1f6feb" stroke-width="2"/>')
for n, v in rows:
    out.append(f'<circle cx="{x(n)}" cy="{y(v)}" r="4" fill="#1f6feb"/>')
    last = n == xmax
    out.append(f'<text x="{x(n) + (-6 if last else 6)}" y="{y(v) - 8}" text-anchor="{"end" if last else "start"}">{v:.0f}</text>')
out.append(f'<text x="{W - R}" y="{T + 14}" text-anchor="end" fill="#999">dashed: linear scaling from 1 rank</text>')
out.append("</svg>")
open(sys.argv[2], "w").write("\n".join(out) + "\n")
