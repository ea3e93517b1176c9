"""Paper-style figures from benchmark results (matplotlib, headless Agg backend).

* ``plot_task_types``: Fig. 5 / Fig. 9 style grouped bars per task type and policy — time utility,
  response time, robot waiting time and task completion time (means).
* ``plot_timeline``: Fig. 6 style trace — per request, when each segment was being generated and
  when it was executing, for one or more policies on the same requests.

Both read the JSON form written by ``timelyllm bench`` (metrics summaries and timeline records), so
figures can be redrawn from a results file without re-running the simulation.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

PANELS = (("accrued_utility_pct_of_max", "whole plan (Eq. 3),\n% of max"),
          ("utility_mean", "first-action utility"), ("response_s", "response time (s)"),
          ("continuation_wait_s", "wait between\nactions (s)"), ("completion_s", "completion time (s)"))


def task_sort_key(task_type: str) -> tuple:
    """T1 < T2 < T10 < C1: natural order, robot tasks before chat."""
    m = re.match(r"^([A-Za-z]*)(\d+)$", task_type)
    if m:
        return (m.group(1) != "T", m.group(1), int(m.group(2)))
    return (True, task_type, 0)


def _value(agg: Mapping[str, Any], key: str) -> float:
    v = agg.get(key)
    if isinstance(v, Mapping):
        v = v.get("mean")
    return float(v) if v is not None else float("nan")


def plot_task_types(summaries: Mapping[str, Mapping[str, Any]], path: str | Path, *, title: str = "",
                    task_names: Mapping[str, str] | None = None) -> Path:
    """Grouped bars: x = task type, one bar per policy.  ``summaries``: policy -> metrics summary
    (``core.metrics.summarize`` output, possibly JSON-loaded)."""
    policies = list(summaries)
    types = sorted({t for s in summaries.values() for t in s.get("by_task_type", {})}, key=task_sort_key)
    if not policies or not types:
        raise ValueError("nothing to plot: no policies or no task types in the results")
    fig, axes = plt.subplots(len(PANELS), 1, figsize=(max(6.0, 0.9 * len(types) * max(1, len(policies)) / 2 + 3),
                                                      2.3 * len(PANELS)), sharex=True)
    width = 0.8 / len(policies)
    cmap = plt.get_cmap("tab10")
    for ax, (key, label) in zip(axes, PANELS):
        for i, pol in enumerate(policies):
            by_type = summaries[pol].get("by_task_type", {})
            ys = [_value(by_type[t], key) if t in by_type else float("nan") for t in types]
            xs = [j + (i - (len(policies) - 1) / 2) * width for j in range(len(types))]
            ax.bar(xs, ys, width=width, label=pol, color=cmap(i % 10))
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
        if key in ("utility_mean", "accrued_utility_pct_of_max"):
            ax.axhline(0, color="black", linewidth=0.6)
    labels = [f"{t}\n{task_names[t]}" if task_names and t in task_names else t for t in types]
    axes[-1].set_xticks(range(len(types)))
    axes[-1].set_xticklabels(labels, fontsize=8)
    axes[0].legend(ncol=min(len(policies), 5), fontsize=8, loc="lower right")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def select_for_timeline(records: Sequence[Mapping[str, Any]], n: int = 4) -> list[str]:
    """Request ids for a Fig. 6 style trace: from the largest event (requests arriving together)
    that mixes urgent and non-urgent requests — where scheduling matters most — n requests taken
    alternately from its urgent and other ones; without such an event, the earliest requests."""
    groups: dict[float, list[Mapping[str, Any]]] = {}
    for r in records:
        groups.setdefault(r["arrival"], []).append(r)
    mixed = [t for t, g in groups.items()
             if any(r["category"] == "urgent" for r in g) and any(r["category"] != "urgent" for r in g)]
    if mixed:
        t = max(mixed, key=lambda t: (len(groups[t]), -t))
        g = sorted(groups[t], key=lambda r: r["request_id"])
        urgent = [r for r in g if r["category"] == "urgent"]
        other = [r for r in g if r["category"] != "urgent"]
        picked = [r for pair in itertools.zip_longest(urgent, other) for r in pair if r is not None][:n]
        return sorted(r["request_id"] for r in picked)
    return [r["request_id"] for r in sorted(records, key=lambda r: (r["arrival"], r["request_id"]))[:n]]


def plot_timeline(timelines: Mapping[str, Sequence[Mapping[str, Any]]], path: str | Path, *,
                  request_ids: Sequence[str] | None = None, title: str = "",
                  window_s: float | None = None) -> Path:
    """Per policy, per request: generation intervals (upper bar) and execution intervals (lower bar)
    of every segment, with the arrival and the ERT deadline marked.  ``timelines``: policy ->
    timeline records (``core.metrics.timeline_records``).  ``window_s`` limits the x axis to that
    many seconds after the first arrival (long executions otherwise hide the first segments)."""
    policies = list(timelines)
    if not policies:
        raise ValueError("nothing to plot: no timelines")
    if request_ids is None:
        request_ids = select_for_timeline(timelines[policies[0]])
    ids = list(request_ids)
    rows: list[tuple[str, str, Mapping[str, Any]]] = []
    for pol in policies:
        byid = {r["request_id"]: r for r in timelines[pol]}
        missing = [i for i in ids if i not in byid]
        if missing:
            raise ValueError(f"policy {pol!r} has no request {missing[0]!r}")
        rows.extend((pol, i, byid[i]) for i in ids)
    fig, ax = plt.subplots(figsize=(10, 0.55 * len(rows) + 1.5))
    t0 = min(r["arrival"] for _, _, r in rows)
    for y, (pol, rid, rec) in enumerate(reversed(rows)):
        for s in rec["segments"]:
            if s.get("gen_start") is not None and s.get("gen_end") is not None:
                ax.broken_barh([(s["gen_start"] - t0, max(s["gen_end"] - s["gen_start"], 1e-3))],
                               (y + 0.05, 0.4), facecolors="tab:blue", edgecolors="white", linewidth=0.5)
            if s.get("exec_start") is not None and s.get("exec_end") is not None:
                ax.broken_barh([(s["exec_start"] - t0, max(s["exec_end"] - s["exec_start"], 1e-3))],
                               (y - 0.45, 0.4), facecolors="tab:orange", edgecolors="white", linewidth=0.5)
        ax.plot([rec["arrival"] - t0], [y], marker="|", color="black", markersize=14)
        ax.plot([rec["arrival"] + rec["ert"] - t0], [y], marker="v", color="red", markersize=6)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"{pol}: {rid} ({rec['task_type']}, {rec['category']})"
                        for pol, rid, rec in reversed(rows)], fontsize=8)
    if window_s is not None:
        ax.set_xlim(-0.02 * window_s, window_s)
    ax.set_xlabel("time since first arrival (s)")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(handles=[Patch(color="tab:blue", label="generation"), Patch(color="tab:orange", label="execution"),
                       plt.Line2D([], [], color="red", marker="v", linestyle="", label="ERT deadline")],
              fontsize=8, loc="lower right")
    if title:
        ax.set_title(title)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_robot_timeline(records: Sequence[Mapping[str, Any]], path: str | Path, *, title: str = "") -> Path:
    """Fig. 6 style, one row per robot: when each segment of its requests was being generated
    (upper bar) and executed (lower bar), each request's arrival (|) and ERT deadline (v).
    ``records``: timeline records (``core.metrics.timeline_records``) of one run."""
    robots = sorted({r["robot_id"] for r in records}, key=task_sort_key)
    if not robots:
        raise ValueError("nothing to plot: no requests")
    t0 = min(r["arrival"] for r in records)
    fig, ax = plt.subplots(figsize=(12, 0.45 * len(robots) + 1.6))
    shade = {"generation": ("tab:blue", "lightsteelblue"), "execution": ("tab:orange", "navajowhite")}
    for y, robot in enumerate(reversed(robots)):
        mine = sorted((r for r in records if r["robot_id"] == robot), key=lambda r: r["arrival"])
        for k, rec in enumerate(mine):
            for s in rec["segments"]:
                if s.get("gen_start") is not None and s.get("gen_end") is not None:
                    ax.broken_barh([(s["gen_start"] - t0, max(s["gen_end"] - s["gen_start"], 1e-2))],
                                   (y + 0.05, 0.38), facecolors=shade["generation"][k % 2],
                                   edgecolors="white", linewidth=0.3)
                if s.get("exec_start") is not None and s.get("exec_end") is not None:
                    ax.broken_barh([(s["exec_start"] - t0, max(s["exec_end"] - s["exec_start"], 1e-2))],
                                   (y - 0.43, 0.38), facecolors=shade["execution"][k % 2],
                                   edgecolors="white", linewidth=0.3)
            ax.plot([rec["arrival"] - t0], [y], marker="|", color="black", markersize=12)
            ax.plot([rec["arrival"] + rec["ert"] - t0], [y + 0.5], marker="v", color="red", markersize=5)
            if rec["state"] != "finished":
                ax.annotate(rec["state"], (rec["arrival"] - t0, y + 0.25), fontsize=6, color="red")
    ax.set_yticks(range(len(robots)))
    ax.set_yticklabels(list(reversed(robots)), fontsize=8)
    ax.set_xlabel("time since the first arrival (s)")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(handles=[Patch(color="tab:blue", label="generation"), Patch(color="tab:orange", label="execution"),
                       plt.Line2D([], [], color="black", marker="|", linestyle="", label="arrival"),
                       plt.Line2D([], [], color="red", marker="v", linestyle="", label="ERT deadline")],
              fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=4, frameon=False)
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


PCT_FLOOR = -150.0  # % of max: the utility panel's lower edge; a bar below it is cut there, its value written


def plot_pct_of_max(runs: Mapping[str, Mapping[str, Any]], path: str | Path, *, title: str = "",
                    task_labels: Mapping[str, str] | None = None, notes: Sequence[str] = ()) -> Path:
    """What a scheduler buys, readable: per task type, then per [category] and overall, the
    utility of the whole plan (Eq. 3: first action and every wait between actions) and of the first
    action, each as % of its maximum (urgent TUFs have beta 2, normal 1, so absolute utility does
    not compare), and the mean response time, one bar per run (``runs``: label -> metrics summary, e.g.
    the demo's policy on the real engine beside a baseline on the same arrivals).  ``task_labels``
    name what each task type is (robot kind, category).  The legend sits below the panels; ``notes``
    (e.g. why the real run was slower than the profile: ``report.slow_note``) under the title.
    Utility below ``PCT_FLOOR`` % (a request answered seconds late) is cut at the panel's edge with
    its value written on the bar, so one late request does not flatten every other bar.  Runs
    recorded before the whole-plan score have no accrued figure: their bars are left out."""
    labels = list(runs)
    types = sorted({t for m in runs.values() for t in m.get("by_task_type", {})}, key=task_sort_key)
    cats = sorted({c for m in runs.values() for c in m.get("by_category", {})})
    groups = [("by_task_type", t) for t in types] + [("by_category", c) for c in cats] + [("overall", None)]
    if not labels or not types:
        raise ValueError("nothing to plot: no runs or no task types in the results")

    def agg(m: Mapping[str, Any], kind: str, key: str | None) -> Mapping[str, Any] | None:
        return m.get("overall") if kind == "overall" else m.get(kind, {}).get(key)

    fig, axes = plt.subplots(3, 1, figsize=(min(16.0, max(7.0, 0.32 * len(groups) * len(labels) + 2)), 9.0), sharex=True)
    width = 0.8 / len(labels)
    cmap = plt.get_cmap("tab10")
    pct_fields = ("accrued_utility_pct_of_max", "utility_pct_of_max")
    for ax, (field, ylabel) in zip(axes, (("accrued_utility_pct_of_max", "whole plan (Eq. 3), % of max"),
                                          ("utility_pct_of_max", "first action, % of max"),
                                          ("response_s", "mean response time (s)"))):
        for i, lab in enumerate(labels):
            ys = []
            for kind, key in groups:
                a = agg(runs[lab], kind, key)
                ys.append(_value(a, field) if a is not None else float("nan"))
            xs = [j + (i - (len(labels) - 1) / 2) * width for j in range(len(groups))]
            if field in pct_fields:
                cut = [(x, y) for x, y in zip(xs, ys) if y < PCT_FLOOR]
                ys = [max(y, PCT_FLOOR) if y == y else y for y in ys]
                for x, y in cut:
                    ax.text(x, PCT_FLOOR * 0.97, f"{y:.0f}", rotation=90, ha="center", va="bottom", fontsize=6)
            ax.bar(xs, ys, width=width, label=lab, color=cmap(i % 10))
        ax.set_ylabel(ylabel)
        ax.grid(axis="y", alpha=0.3)
        ax.axvline(len(types) - 0.5, color="grey", linewidth=0.6, linestyle=":")
    for ax in axes[:2]:
        ax.axhline(100, color="black", linewidth=0.6, linestyle="--")
        ax.axhline(0, color="black", linewidth=0.6)
    ticks = [f"{t}\n{task_labels[t]}" if task_labels and t in task_labels else t for t in types]
    ticks += [f"[{c}]" for c in cats] + ["all"]
    axes[-1].set_xticks(range(len(groups)))
    axes[-1].set_xticklabels(ticks, fontsize=7)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=1, fontsize=8, frameon=False)
    top = 1.0
    if title or notes:
        fig.suptitle("\n".join([title, *notes]) if title else "\n".join(notes), fontsize=9 if notes else 10)
        top = 1.0 - 0.03 * len(notes)
    fig.tight_layout(rect=(0, 0.03 + 0.03 * len(labels), 1, top))
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_regime_heatmap(doc: Mapping[str, Any], path: str | Path) -> Path:
    """Regime map (``timelyllm sweep`` JSON): rows = policies, columns = cells; top panel = points
    of accrued utility of the whole plan (Eq. 3) below the best policy of the cell (0 = best), next
    to it points of first-action utility below the best, bottom = accrued utility as % of the
    isolated-service bound of Eq. 3.  Runs that timed out, failed or are pending are grey with
    T / E / P."""
    import numpy as np

    policies = list(doc["grid"]["policies"])
    cells = list(doc["cells"])
    if not policies or not cells:
        raise ValueError("nothing to plot: the regime map has no cells or no policies")
    n, m = len(policies), len(cells)
    acc_gap = np.full((n, m), np.nan)
    gap = np.full((n, m), np.nan)
    pob = np.full((n, m), np.nan)
    marks: list[tuple[int, int, str]] = []
    for j, c in enumerate(cells):
        tops = {}
        for f in ("accrued_total_pct", "total_pct"):
            best = c["best"].get(f)
            tops[f] = c["policies"][best][f] if best else None
        for i, p in enumerate(policies):
            r = c["policies"].get(p, {})
            if r.get("status") != "ok":
                marks.append((i, j, str(r.get("status", "?"))[:1].upper()))
                continue
            for f, arr in (("accrued_total_pct", acc_gap), ("total_pct", gap)):
                if r.get(f) is not None and tops[f] is not None:
                    arr[i, j] = tops[f] - r[f]
            if r.get("accrued_pct_of_bound") is not None:
                pob[i, j] = r["accrued_pct_of_bound"]
    labels = [f"{Path(c['load']).stem if '/' in c['load'] else c['load']} | {c['capacity']} | {c['profile']}"
              + (f" | {c['engine']}" if c.get("engine") else "") for c in cells]
    fig, axes = plt.subplots(3, 1, figsize=(max(8.0, 0.32 * m + 3), 3 * (0.32 * n + 1.6) + 3.5), layout="constrained")
    panels = ((acc_gap, "points of accrued utility (Eq. 3, whole plan) below the best policy of the cell", "magma_r",
               0.0, 50.0),
              (gap, "points of first-action utility (Eq. 1 only) below the best policy of the cell", "magma_r",
               0.0, 50.0),
              (pob, "accrued utility (Eq. 3), % of the isolated-service bound", "viridis", 0.0, 100.0))
    for ax, (data, title, cmap, lo, hi) in zip(axes, panels):
        cm = plt.get_cmap(cmap).with_extremes(bad="#cccccc")
        im = ax.imshow(np.clip(data, lo, hi), aspect="auto", cmap=cm, vmin=lo, vmax=hi, interpolation="nearest")
        ax.set_yticks(range(n), policies, fontsize=7)
        ax.set_xticks(range(m), labels, rotation=90, fontsize=6)
        ax.set_title(title + f" (clipped to {lo:g}..{hi:g})", fontsize=9)
        for i, j, s in marks:
            ax.text(j, i, s, ha="center", va="center", fontsize=6, color="black")
        if m * n <= 400:
            for i in range(n):
                for j in range(m):
                    if not np.isnan(data[i, j]):
                        r, g, b, _ = cm((min(max(data[i, j], lo), hi) - lo) / (hi - lo))
                        ax.text(j, i, f"{data[i, j]:.0f}", ha="center", va="center", fontsize=5,
                                color="white" if 0.299 * r + 0.587 * g + 0.114 * b < 0.5 else "black")
        fig.colorbar(im, ax=ax, fraction=0.02, pad=0.01)
    fig.suptitle(f"Regime map ({doc.get('source', 'simulator')}; profiles {', '.join(doc['grid']['profiles'])})",
                 fontsize=10)
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
