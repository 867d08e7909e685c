"""The simulation report: a terminal table, a JSON document and PNG charts.

JSON shape (``to_json``)::

    {"policies": {NAME: {LOAD: {"gpu_milli_allocation_ratio": mean (FGD's metric),
                                "allocation_ratio": mean (whole-GPU occupancy),
                                "stranded_gpus": mean, "placed": mean,
                                "unplaced": mean, "oom_risk": mean or null,
                                "premium_gpu_hours_wasted": mean, "cost_per_hour": mean, ...,
                                "stranded_by_model": {model: mean},
                                "stranded_by_cause": {cause: mean} (``run.STRANDED_CAUSES``),
                                "defrag_moves": mean, "defrag_started": mean (``OPTIONAL_METRICS``:
                                                  policy gpuplace+defrag only),
                                "spread": {metric: sample standard deviation over seeds}}}},
     "curves": {NAME: {"arrived_percent": [0, 1, ...], "allocation_percent": [mean, ...],
                       "spread": [...]}} (fill mode: FGD's allocation rate at each whole
                       arrived percent, ``run.allocation_curve``),
     "seeds": [...], "run_seconds": {NAME: s}, "meta": {...}}

``LOAD`` keys are the load levels as given on the command line (``"1.0"``, ``"1.3"``). A metric
that is unknown for every seed (``oom_risk`` on a trace without VRAM needs) is ``null``. Metrics
are defined in ``scheduler_extender.simulator.run``.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

from scheduler_extender.simulator.run import STRANDED_CAUSES, RunResult, Snapshot

METRICS = ("gpu_milli_allocation_ratio", "allocation_ratio", "stranded_gpus", "placed", "unplaced", "oom_risk",
           "premium_gpu_hours_wasted", "premium_gpu_hours_fit_cheaper", "cost_per_hour", "sharing_placed", "sharing_unplaced", "allocated_gpus",
           "allocated_gpu_milli", "arrived_ratio", "cpu_only_placed", "cpu_only_unplaced",
           "queue_delay_hours_mean", "queue_delay_hours_max", "overcommitted_gpus",
           "overcommitted_pods", "overcommitted_milli", "safe_allocation_ratio")
OPTIONAL_METRICS = ("defrag_moves", "defrag_started")
"""Metrics of one policy only (``gpuplace+defrag``, replay): in the JSON where a seed has them, else left out."""


def load_key(load: float) -> str:
    """``1.0`` -> ``"1.0"``, ``1.25`` -> ``"1.25"``."""
    text = f"{load:.3f}".rstrip("0")
    return text + "0" if text.endswith(".") else text


def aggregate(snaps: Sequence[Snapshot]) -> dict[str, Any]:
    """Mean of each metric over seeds, and its spread (sample standard deviation; 0 for one seed)."""
    out: dict[str, Any] = {}
    spread: dict[str, float | None] = {}
    for m in (*METRICS, *(m for m in OPTIONAL_METRICS if any(getattr(s, m) is not None for s in snaps))):
        values = [getattr(s, m) for s in snaps if getattr(s, m) is not None]
        if not values:
            out[m] = None
            spread[m] = None
            continue
        out[m] = statistics.fmean(values)
        spread[m] = statistics.stdev(values) if len(values) > 1 else 0.0
    models = sorted({k for s in snaps for k in s.stranded_by_model})
    out["stranded_by_model"] = {k: statistics.fmean(s.stranded_by_model.get(k, 0) for s in snaps) for k in models}
    causes = [c for c in STRANDED_CAUSES if any(c in s.stranded_by_cause for s in snaps)]
    out["stranded_by_cause"] = {c: statistics.fmean(s.stranded_by_cause.get(c, 0) for s in snaps) for c in causes}
    out["spread"] = spread
    return out


def aggregate_curves(curves: Sequence[dict[int, float]]) -> dict[str, list]:
    """Per whole arrived percent that every seed reached: the mean allocation rate (percent) over
    seeds and its spread (sample standard deviation; 0 for one seed)."""
    xs = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
    vals = [[c[x] for c in curves] for x in xs]
    return {"arrived_percent": xs, "allocation_percent": [statistics.fmean(v) for v in vals],
            "spread": [statistics.stdev(v) if len(v) > 1 else 0.0 for v in vals]}


def to_json(result: RunResult) -> dict[str, Any]:
    return {
        "policies": {name: {load_key(l): aggregate(snaps) for l, snaps in by_load.items()}
                     for name, by_load in result.snapshots.items()},
        "curves": {name: aggregate_curves(curves) for name, curves in result.curves.items()},
        "seeds": result.seeds,
        "run_seconds": {k: round(v, 3) for k, v in result.seconds.items()},
        "per_seed": {name: {load_key(l): [_per_seed(s) for s in snaps] for l, snaps in by_load.items()}
                     for name, by_load in result.snapshots.items()},
        "meta": result.meta,
    }


def _per_seed(snap: Snapshot) -> dict[str, Any]:
    """One seed's ``Snapshot``, less the ``OPTIONAL_METRICS`` it does not have."""
    return {k: v for k, v in asdict(snap).items() if v is not None or k not in OPTIONAL_METRICS}


def write_json(result: RunResult, path: str | Path) -> None:
    Path(path).write_text(json.dumps(to_json(result), indent=2, sort_keys=False) + "\n", encoding="utf-8")


def _fmt(value: float | None, spread: float | None, fmt: str, pct: bool = False) -> str:
    if value is None:
        return "-"
    scale = 100 if pct else 1
    text = format(value * scale, fmt) + ("%" if pct else "")
    if spread:
        text += "±" + format(spread * scale, fmt)
    return text


def render_table(result: RunResult) -> str:
    """One row per policy and load: means over seeds, ± the spread where seeds differ.
    ``milli-alloc`` is FGD's allocation rate (``gpu_milli_allocation_ratio``), ``occupied`` the
    whole-GPU occupancy (``allocation_ratio``)."""
    doc = to_json(result)
    mode = result.meta.get("mode", "fill")
    cols = ["policy", "load", "milli-alloc", "occupied", "stranded", "placed", "unplaced", "sharing p/u",
            "OOM risk", "premium GPU-h wasted", "premium GPU-h (cheaper model fits)", "$/h"]
    if mode == "replay":
        cols.append("queue h (mean)")
    defrag = any("defrag_moves" in a for by_load in doc["policies"].values() for a in by_load.values())
    if defrag:
        cols += ["queue h (max)", "moves", "started by a plan"]
    device_plugin = result.meta.get("sharing") == "device-plugin"
    if device_plugin:
        cols += ["over-committed GPUs (pods)", "safe milli-alloc"]
    rows = []
    for name, by_load in doc["policies"].items():
        for load, a in by_load.items():
            sp = a["spread"]
            row = [name, load,
                   _fmt(a["gpu_milli_allocation_ratio"], sp["gpu_milli_allocation_ratio"], ".2f", pct=True),
                   _fmt(a["allocation_ratio"], sp["allocation_ratio"], ".2f", pct=True),
                   _fmt(a["stranded_gpus"], sp["stranded_gpus"], ".0f"), _fmt(a["placed"], sp["placed"], ".0f"),
                   _fmt(a["unplaced"], sp["unplaced"], ".0f"),
                   f"{a['sharing_placed']:.0f}/{a['sharing_unplaced']:.0f}",
                   _fmt(a["oom_risk"], sp["oom_risk"], ".0f"),
                   _fmt(a["premium_gpu_hours_wasted"], sp["premium_gpu_hours_wasted"], ".0f"),
                   _fmt(a["premium_gpu_hours_fit_cheaper"], sp["premium_gpu_hours_fit_cheaper"], ".0f"),
                   _fmt(a["cost_per_hour"], sp["cost_per_hour"], ".0f")]
            if mode == "replay":
                row.append(_fmt(a["queue_delay_hours_mean"], sp["queue_delay_hours_mean"], ".2f"))
            if defrag:
                row.append(_fmt(a["queue_delay_hours_max"], sp["queue_delay_hours_max"], ".2f"))
                row += [_fmt(a.get(m), sp.get(m), ".0f") for m in OPTIONAL_METRICS]
            if device_plugin:
                row.append(f'{_fmt(a["overcommitted_gpus"], sp["overcommitted_gpus"], ".0f")} '
                           f'({_fmt(a["overcommitted_pods"], sp["overcommitted_pods"], ".0f")})')
                row.append(_fmt(a["safe_allocation_ratio"], sp["safe_allocation_ratio"], ".2f", pct=True))
            rows.append(row)
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
    line = lambda cells: "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))  # noqa: E731
    out = [line(cols), line(["-" * w for w in widths])]
    out += [line(r) for r in rows]
    secs = ", ".join(f"{k} {v:.1f} s" for k, v in result.seconds.items())
    out.append("")
    out.append("milli-alloc: FGD's GPU allocation rate, milli-GPUs of the placed pods / (GPUs x 1000)"
               + (", mean over the pods whose arrived share rounds to the load" if mode != "replay" else "")
               + "; occupied: GPUs with any share taken / GPUs"
               + ("; over-committed GPUs: time-sliced GPUs whose holders' shares exceed them (the device plugin "
                  "picks the GPU), and the pods on them; safe milli-alloc: milli-GPUs of the placed pods at the "
                  "snapshot less those of pods on over-committed GPUs, over GPUs x 1000" if device_plugin else "")
               + ("; moves: running pods moved to make room for waiting ones (gpuplace+defrag), started by a "
                  "plan: the waiting pods started on that room" if defrag else ""))
    out.append(f"seeds {', '.join(map(str, result.seeds))}; run time per policy: {secs}; "
               f"total {sum(result.seconds.values()):.1f} s")
    return "\n".join(out)


def write_charts(result: RunResult, directory: str | Path) -> list[Path]:
    """``gpu_milli_allocation.png`` (FGD's allocation rate against the arrived share of the
    fleet, every whole percent up to the highest load, as the paper's Fig. 9(a) draws it, in fill
    mode; against the load in replay mode), ``allocation_ratio.png`` (whole-GPU occupancy vs load,
    error bars = spread) and ``stranded_by_model.png`` (stranded GPUs by model at the highest load).

    Raises:
        RuntimeError: matplotlib is not installed (``pip install 'gpuplace[sim]'``).
    """
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise RuntimeError("charts need matplotlib: pip install 'gpuplace[sim]'") from e
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    doc = to_json(result)
    title = result.meta.get("title", "")
    paths = []

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, by_load in doc["policies"].items():
        curve = doc["curves"].get(name)
        width = 2.2 if name == "gpuplace" else 1.2
        if curve and curve["arrived_percent"]:
            ax.plot(curve["arrived_percent"], curve["allocation_percent"], label=name, linewidth=width)
        else:
            loads = [l for l in by_load if by_load[l]["gpu_milli_allocation_ratio"] is not None]
            ax.errorbar([float(l) * 100 for l in loads], [by_load[l]["gpu_milli_allocation_ratio"] * 100 for l in loads],
                        yerr=[(by_load[l]["spread"]["gpu_milli_allocation_ratio"] or 0) * 100 for l in loads],
                        marker="o", capsize=3, label=name, linewidth=width)
    replay = result.meta.get("mode") == "replay"
    ax.set_xlabel("load: arrival rate x" if replay else "arrived workloads: GPU demand arrived, % of the fleet's GPUs")
    ax.set_ylabel("GPU allocation rate (milli-GPUs), %")
    ax.set_title(f"GPU allocation rate (FGD's metric) {title}".strip())
    ax.grid(alpha=0.3)
    paths.append(_save(plt, fig, ax, d / "gpu_milli_allocation.png"))

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, by_load in doc["policies"].items():
        loads = list(by_load)
        xs = [float(l) * 100 for l in loads]
        ys = [by_load[l]["allocation_ratio"] * 100 for l in loads]
        es = [(by_load[l]["spread"]["allocation_ratio"] or 0) * 100 for l in loads]
        ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, label=name, linewidth=2.2 if name == "gpuplace" else 1.2)
    ax.set_xlabel("load: GPU demand arrived, % of the fleet's GPUs" if result.meta.get("mode") != "replay"
                  else "load: arrival rate x")
    ax.set_ylabel("GPUs occupied (any share taken), %")
    ax.set_title(f"Whole-GPU occupancy vs load {title}".strip())
    ax.grid(alpha=0.3)
    paths.append(_save(plt, fig, ax, d / "allocation_ratio.png"))

    fig, ax = plt.subplots(figsize=(7, 4.2))
    names = list(doc["policies"])
    top = {n: doc["policies"][n][list(doc["policies"][n])[-1]] for n in names}
    models = sorted({m for a in top.values() for m in a["stranded_by_model"]})
    width = 0.8 / max(1, len(names))
    for k, n in enumerate(names):
        ax.bar([i + k * width for i in range(len(models))], [top[n]["stranded_by_model"].get(m, 0) for m in models],
               width=width, label=n)
    ax.set_xticks([i + width * (len(names) - 1) / 2 for i in range(len(models))])
    ax.set_xticklabels(models, rotation=20, ha="right")
    last = list(doc["policies"][names[0]])[-1] if names else ""
    ax.set_ylabel("stranded GPUs (free, no pending pod fits)")
    ax.set_title(f"Stranded GPUs by model at load {last} {title}".strip())
    ax.grid(alpha=0.3, axis="y")
    paths.append(_save(plt, fig, ax, d / "stranded_by_model.png"))
    return paths


def _save(plt: Any, fig: Any, ax: Any, path: Path) -> Path:
    """Legend, layout, write ``path`` (PNG), free the figure."""
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
