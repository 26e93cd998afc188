"""Task success against offload rate (SVG, no plotting library): the router's curve over ``delta_min``, the
random line, and the edge, cloud and oracle points of an ``edgefm-sim route-eval`` report."""
from __future__ import annotations

from html import escape
from pathlib import Path

W, H = 560, 400
LEFT, RIGHT, TOP, BOTTOM = 60, 150, 30, 50
COLOURS = {"router": "#1f77b4", "random": "#7f7f7f", "edge": "#2ca02c", "cloud": "#d62728", "oracle": "#9467bd"}


def _xy(offload: float, success: float) -> tuple[float, float]:
    return (LEFT + offload * (W - LEFT - RIGHT), TOP + (1.0 - success) * (H - TOP - BOTTOM))


def _polyline(points: list[tuple[float, float]], colour: str, dash: str = "") -> str:
    pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in (_xy(o, s) for o, s in points))
    extra = f' stroke-dasharray="{dash}"' if dash else ""
    return f'<polyline points="{pts}" fill="none" stroke="{colour}" stroke-width="2"{extra}/>'


def _point(offload: float, success: float, colour: str, label: str, r: float = 5) -> str:
    x, y = _xy(offload, success)
    return (f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r}" fill="{colour}"><title>{escape(label)}</title></circle>')


def route_plot_svg(report: dict) -> str:
    p = report["placements"]
    s = report.get("settings", {})
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" '
           f'font-size="12">', f'<rect width="{W}" height="{H}" fill="white"/>']
    for i in range(6):  # grid and ticks
        v = i / 5
        x, _ = _xy(v, 0)
        _, y = _xy(0, v)
        out.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{W - RIGHT}" y2="{y:.1f}" stroke="#eee"/>')
        out.append(f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{H - BOTTOM}" stroke="#eee"/>')
        out.append(f'<text x="{LEFT - 8}" y="{y + 4:.1f}" text-anchor="end">{v:.1f}</text>')
        out.append(f'<text x="{x:.1f}" y="{H - BOTTOM + 16}" text-anchor="middle">{v:.1f}</text>')
    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{W - LEFT - RIGHT}" height="{H - TOP - BOTTOM}" fill="none" '
               f'stroke="black"/>')
    out.append(f'<text x="{(W - RIGHT + LEFT) / 2}" y="{H - 12}" text-anchor="middle">share of chunks computed '
               f'in the cloud</text>')
    out.append(f'<text x="16" y="{(H - BOTTOM + TOP) / 2}" text-anchor="middle" transform="rotate(-90 16 '
               f'{(H - BOTTOM + TOP) / 2})">task success</text>')
    title = (f"{s.get('conditions', '')} cameras, {len(s.get('tasks', []))} tasks x {len(s.get('seeds', []))} seeds, "
             f"link {s.get('link', {}).get('mbps', '?')} Mbit/s")
    out.append(f'<text x="{LEFT}" y="18">{escape(title)}</text>')
    edge, cloud = p.get("edge"), p.get("cloud")
    line = [(r["offload_rate"], r["success_rate"]) for r in report.get("random_line", [])
            if r["offload_rate"] is not None and r["success_rate"] is not None]
    if edge and cloud:
        line = sorted([(0.0, edge["success_rate"]), *line, (1.0, cloud["success_rate"])])
    if len(line) >= 2:
        out.append(_polyline(line, COLOURS["random"], "5,4"))
    curve = sorted((r["offload_rate"], r["success_rate"]) for r in report.get("sweep", [])
                   if r["offload_rate"] is not None and r["success_rate"] is not None)
    if curve:
        out.append(_polyline(curve, COLOURS["router"]))
        out.extend(_point(o, v, COLOURS["router"], f"router sweep: offload {o:.2f}, success {v:.2f}", 3)
                   for o, v in curve)
    for name in ("edge", "cloud", "oracle", "router", "random"):
        if name in p and p[name]["success_rate"] is not None and p[name]["offload_rate"] is not None:
            out.append(_point(p[name]["offload_rate"], p[name]["success_rate"], COLOURS[name],
                              f"{name}: offload {p[name]['offload_rate']:.2f}, success {p[name]['success_rate']:.2f}",
                              6 if name != "random" else 4))
    legend = [("router (delta_min sweep)", "router"), ("random offload", "random"), ("edge only", "edge"),
              ("cloud only", "cloud"), ("oracle", "oracle")]
    for i, (text, key) in enumerate(legend):
        y = TOP + 10 + 20 * i
        out.append(f'<rect x="{W - RIGHT + 12}" y="{y - 8}" width="10" height="10" fill="{COLOURS[key]}"/>')
        out.append(f'<text x="{W - RIGHT + 28}" y="{y + 1}">{escape(text)}</text>')
    g = report.get("pgr")
    if g is not None:
        out.append(f'<text x="{W - RIGHT + 12}" y="{TOP + 120}">PGR {g:.2f}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def write_route_plot(report: dict, path: str | Path) -> None:
    Path(path).write_text(route_plot_svg(report))
