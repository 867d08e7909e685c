#!/usr/bin/env python3
"""Draw the chart's Grafana dashboard to a PNG from a live Prometheus, offline (no Grafana needed).

Each panel's PromQL (deploy/helm/gpuplace/files/dashboard.json) is run against Prometheus' HTTP API
(``query_range`` for time series, ``query`` for stat panels) and drawn with matplotlib on the
dashboard's own 24-column grid, with the panel's legend format and unit. Grafana's
``$__rate_interval`` becomes ``--rate-interval``.

    .venv/bin/pip install -e '.[render]'
    hack/render-dashboard.py --prometheus http://127.0.0.1:9090 --out docs/dashboard.png

The end-to-end test runs it against its Prometheus when GPUPLACE_DASHBOARD_PNG is set.
"""

from __future__ import annotations

import argparse
import json
import re
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "deploy" / "helm" / "gpuplace" / "files" / "dashboard.json"
GRID_UNIT_PX = 30  # Grafana's row height is 30 px; a column is 1/24 of the width


def query(prom: str, path: str, **params: Any) -> list[dict[str, Any]]:
    url = f"{prom}/api/v1/{path}?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise RuntimeError(f"{path} {params.get('query')}: {body}")
    return body["data"]["result"]


def legend(fmt: str, metric: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: metric.get(m.group(1), ""), fmt).strip() or \
        ",".join(f"{k}={v}" for k, v in metric.items() if k != "__name__") or "value"


def fmt_value(v: float, unit: str) -> str:
    if unit == "bytes":
        return f"{v / 2**30:.1f} GiB"
    if unit == "percentunit":
        return f"{v * 100:.0f} %"
    if unit == "s":
        return f"{v * 1000:.1f} ms" if v < 1 else f"{v:.0f} s"
    return f"{v:g}"


def render(prom: str, out: Path, window_s: float, rate_interval: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    dash = json.loads(DASHBOARD.read_text())
    panels = dash["panels"]
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    width_in, unit_in = 24.0, 0.42
    fig = plt.figure(figsize=(width_in, rows * unit_in + 0.8), facecolor="#111217")
    fig.suptitle(f"{dash['title']}  (Prometheus {prom}, last {window_s / 60:.0f} min)", color="white",
                 fontsize=15, x=0.01, ha="left", y=1 - 0.25 / (rows * unit_in + 0.8))
    end = time.time()
    start = end - window_s
    step = max(1.0, window_s / 240)
    top = 1 - 0.8 / (rows * unit_in + 0.8)

    def box(p: dict[str, Any], pad: float = 0.006) -> list[float]:
        g = p["gridPos"]
        h_frac = top / rows
        return [g["x"] / 24 + pad, top - (g["y"] + g["h"]) * h_frac + pad * 3, g["w"] / 24 - 2 * pad,
                g["h"] * h_frac - pad * 5]

    for p in panels:
        if p["type"] == "row":
            g = p["gridPos"]
            fig.text(0.005, top - (g["y"] + 0.75) * top / rows, p["title"], color="#cccccc", fontsize=13, weight="bold")
            continue
        frame = box(p)
        bg = fig.add_axes(frame)
        bg.set_facecolor("#181b1f")
        bg.set_xticks([])
        bg.set_yticks([])
        for s in bg.spines.values():
            s.set_color("#2c3235")
        bg.set_title(p["title"], color="white", fontsize=10, loc="left")
        inset = 0.04 if p["type"] != "stat" else 0.0  # room for the y tick labels inside the panel
        ax = fig.add_axes([frame[0] + inset, frame[1] + (0.012 if inset else 0), frame[2] - inset - 0.004,
                           frame[3] - (0.016 if inset else 0)])
        ax.set_facecolor("#181b1f")
        for s in ax.spines.values():
            s.set_color("#2c3235")
        ax.tick_params(colors="#aaaaaa", labelsize=8)
        unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
        if p["type"] == "stat":
            ax.axis("off")
            parts = []
            for t in p["targets"]:
                for r in query(prom, "query", query=t["expr"].replace("$__rate_interval", rate_interval)):
                    label = legend(t.get("legendFormat", ""), r["metric"])
                    parts.append((label, fmt_value(float(r["value"][1]), unit)))
            text = "\n".join(f"{v}  {lbl}" if len(parts) > 1 else v for lbl, v in parts) or "No data"
            ax.text(0.5, 0.45, text, ha="center", va="center", color="#73bf69" if parts else "#888888",
                    fontsize=22 if len(parts) <= 1 else 12, transform=ax.transAxes, weight="bold")
            continue
        stacked = p.get("fieldConfig", {}).get("defaults", {}).get("custom", {}).get("stacking", {}).get("mode") == "normal"
        series = []
        for t in p["targets"]:
            expr = t["expr"].replace("$__rate_interval", rate_interval)
            for r in query(prom, "query_range", query=expr, start=start, end=end, step=step):
                xs = [float(v[0]) - end for v in r["values"]]
                ys = [float(v[1]) for v in r["values"]]
                series.append((legend(t.get("legendFormat", ""), r["metric"]), xs, ys))
        if not series:
            ax.text(0.5, 0.5, "No data", ha="center", va="center", color="#888888", transform=ax.transAxes)
            continue
        series.sort(key=lambda s: s[0])
        if stacked:
            grid = sorted({x for _, xs, _ in series for x in xs})
            # in a stack, a missing or NaN point (no rate yet) counts as 0; lines show it as a gap
            stacks = [[(lambda v: v if v == v else 0.0)(dict(zip(xs, ys)).get(x, 0.0)) for x in grid]
                      for _, xs, ys in series]
            ax.stackplot([x / 60 for x in grid], stacks, labels=[s[0] for s in series], alpha=0.75)
        else:
            for label, xs, ys in series:
                ax.plot([x / 60 for x in xs], ys, label=label, linewidth=1.4)
        ax.set_xlim(-window_s / 60, 0)
        ax.set_xlabel("minutes ago", color="#888888", fontsize=8)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos, u=unit: fmt_value(v, u)))
        ax.grid(color="#2c3235", linewidth=0.5)
        ax.legend(fontsize=7, loc="upper left", ncol=2 if len(series) > 6 else 1, facecolor="#181b1f",
                  edgecolor="#2c3235", labelcolor="#dddddd", framealpha=0.8)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80, facecolor=fig.get_facecolor())
    print(f"wrote {out}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prometheus", required=True, help="Prometheus base URL, e.g. http://127.0.0.1:9090")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "dashboard.png", help="PNG to write")
    p.add_argument("--window-seconds", type=float, default=600, help="time range drawn (default 600)")
    p.add_argument("--rate-interval", default="1m", help="stands in for Grafana's $__rate_interval (default 1m)")
    a = p.parse_args()
    render(a.prometheus.rstrip("/"), a.out, a.window_seconds, a.rate_interval)


if __name__ == "__main__":
    main()
