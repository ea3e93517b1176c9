"""Results a person can read: the per-task-type table, the engine speed a real run got, and the
deadline line — all from a run's records (metrics summaries, StepRecords), never from a live
planner, so every way of running the demo (single process, ROS graph) reports the same way.

* ``print_table(console, metrics, title)``: per task type (natural order T1 < T2 < T10), per
  [category] and overall.
* ``engine_speed(records, profile)``: tokens/s and mean step time measured vs what the fitted
  latency profile charges for the same iterations; ``slow_note``: where a slow run's time went
  (stalled steps vs steady ones).
* ``deadline_line(real, at_profile_speed, speed)``: how many requests missed their ERT, beside
  the simulator at the profile's speed on the same arrivals, and whether the machine's speed
  explains the difference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .engines.base import StepRecord
from .engines.simulated import LatencyProfile
from .plots import task_sort_key

SLOW_FACTOR = 1.2  # steps this much slower than the profile: the machine, not the scheduler
# A stall: one engine step that took at least STALL_S and STALL_FACTOR times what the profile
# charges for it (the process was not scheduled, a page-in, another job's burst) -- it says where
# a slow run's time went, apart from the steady steps.
STALL_S = 0.5
STALL_FACTOR = 20.0


def console(*, stderr: bool = False) -> Any:
    """A rich Console that does not cut tables at 80 columns when the output is piped."""
    from rich.console import Console

    c = Console(stderr=stderr)
    return c if c.is_terminal else Console(stderr=stderr, width=max(c.width, 160))


def print_table(console: Any, metrics: Mapping[str, Any], title: str) -> None:
    """Per task type, then per [category] and overall: the whole plan's accrued utility (Eq. 3,
    % of its maximum), the first action's mean utility and % of max (sum of TUF betas), mean and
    p99 response, mean waiting, mean and p99 completion, mean / p99 / max continuation wait
    (seconds), and how many requests did not finish."""
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=title)
    for col in ("task", "n", "plan %max", "1st util", "1st %max", "resp s", "p99 s", "wait s", "compl s",
                "c.p99 s", "cont.wait s", "c.w p99", "c.w max", "unfin"):
        t.add_column(col, justify="left" if col == "task" else "right", no_wrap=True)

    def row(name: str, a: Mapping[str, Any], style: str = "") -> None:
        unfinished = a["count"] - a["states"].get("finished", 0)
        cw = a.get("continuation_wait_s") or {}
        t.add_row(escape(name), str(a["count"]), _f(a.get("accrued_utility_pct_of_max"), "{:.1f}"),
                  _f(a["utility_mean"]), _f(a["utility_pct_of_max"], "{:.1f}"),
                  _f(a["response_s"]["mean"]), _f(a["response_s"]["p99"]), _f(a["waiting_s"]["mean"]),
                  _f(a["completion_s"]["mean"], "{:.2f}"), _f(a["completion_s"]["p99"], "{:.2f}"),
                  _f(cw.get("mean")), _f(cw.get("p99")), _f(cw.get("max"), "{:.2f}"), str(unfinished), style=style)

    for name in sorted(metrics.get("by_task_type", {}), key=task_sort_key):
        row(name, metrics["by_task_type"][name])
    for name in sorted(metrics.get("by_category", {})):
        row(f"[{name}]", metrics["by_category"][name], "dim")
    row("all", metrics["overall"], "bold")
    console.print(t)


def _f(v: Any, fmt: str = "{:.3f}") -> str:
    return "-" if v is None else fmt.format(v)


@dataclass(frozen=True, slots=True)
class EngineSpeed:
    """Measured engine iterations against what a latency profile charges for the same ones."""

    profile: str
    steps: int
    output_tokens: int
    measured_s: float  # sum of step + adapter time
    profile_s: float  # what the profile charges for the same steps
    stalls_s: tuple[float, ...] = ()  # measured time of each stalled step (STALL_S, STALL_FACTOR), longest first
    stalls_profile_s: float = 0.0  # what the profile charges for the stalled steps
    median_step_s: float = 0.0  # median measured step
    median_profile_s: float = 0.0  # median of what the profile charges per step

    @property
    def ratio(self) -> float:
        """Measured / profile time (1.0: as fast as when the profile was fitted)."""
        return self.measured_s / self.profile_s if self.profile_s > 0 else float("nan")

    @property
    def steady_ratio(self) -> float:
        """Measured / profile time of the steps that did not stall: the engine's speed apart from
        stalls (what the simulator is scaled by to replay a run "at this run's engine speed")."""
        measured, charged = self.measured_s - sum(self.stalls_s), self.profile_s - self.stalls_profile_s
        return measured / charged if charged > 0 else float("nan")

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.measured_s if self.measured_s > 0 else 0.0

    @property
    def profile_tokens_per_s(self) -> float:
        return self.output_tokens / self.profile_s if self.profile_s > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"profile": self.profile, "steps": self.steps, "output_tokens": self.output_tokens,
                "measured_s": self.measured_s, "profile_s": self.profile_s, "ratio": self.ratio,
                "tokens_per_s": self.tokens_per_s, "profile_tokens_per_s": self.profile_tokens_per_s,
                "stalls_s": list(self.stalls_s), "stalls_profile_s": self.stalls_profile_s,
                "steady_ratio": self.steady_ratio, "median_step_s": self.median_step_s,
                "median_profile_s": self.median_profile_s}


def engine_speed(records: Sequence[StepRecord], profile: LatencyProfile) -> EngineSpeed:
    """The measured time of ``records`` (iteration + adapter work, as the profile fit counts it)
    against ``profile.record_s`` of each; which steps stalled (``STALL_S`` and ``STALL_FACTOR``
    times their charge) and the median step, measured and charged."""
    import statistics

    measured = [r.duration_s + r.post_s for r in records]
    charged = [profile.record_s(r) for r in records]
    stalled = [(m, c) for m, c in zip(measured, charged) if m >= STALL_S and m >= STALL_FACTOR * c]
    return EngineSpeed(profile=profile.name or "profile", steps=len(records),
                       output_tokens=sum(r.output_tokens for r in records),
                       measured_s=sum(measured), profile_s=sum(charged),
                       stalls_s=tuple(sorted((m for m, _ in stalled), reverse=True)),
                       stalls_profile_s=sum(c for _, c in stalled),
                       median_step_s=statistics.median(measured) if measured else 0.0,
                       median_profile_s=statistics.median(charged) if charged else 0.0)


def slow_note(s: EngineSpeed) -> str | None:
    """Where a run slower than the profile (``SLOW_FACTOR``) lost its time, in one line -- e.g.
    "engine 10.65x slower than profile vllm_cpu_tiny: 2 stalls of 7.0 s and 4.0 s; median step
    15.5 ms vs 9.8 ms (steady steps 1.58x)"; None when the run was not slower."""
    if not s.steps or not s.ratio > SLOW_FACTOR:
        return None
    if s.stalls_s:
        shown = [f"{x:.1f} s" for x in s.stalls_s[:3]]
        if len(s.stalls_s) > 3:
            shown = [", ".join(shown), f"{len(s.stalls_s) - 3} more"]
        stalls = (f"{len(s.stalls_s)} stall{'s' if len(s.stalls_s) > 1 else ''} of {' and '.join(shown)}"
                  f"{f' ({sum(s.stalls_s):.1f} s in all)' if len(s.stalls_s) > 1 else ''}")
    else:
        stalls = "no stalls"
    return (f"engine {s.ratio:.2f}x slower than profile {s.profile}: {stalls}; median step "
            f"{1e3 * s.median_step_s:.1f} ms vs {1e3 * s.median_profile_s:.1f} ms (steady steps {s.steady_ratio:.2f}x)")


def speed_line(s: EngineSpeed) -> str:
    if not s.steps:
        return "engine speed: no engine steps were measured"
    return (f"engine speed: {s.tokens_per_s:.0f} output tokens/s over {s.steps} steps, mean step "
            f"{1e3 * s.measured_s / s.steps:.1f} ms; the fitted profile {s.profile} charges "
            f"{1e3 * s.profile_s / s.steps:.1f} ms for the same steps ({s.profile_tokens_per_s:.0f} tokens/s): "
            f"this run was {s.ratio:.2f}x the profile's step time"
            + (f" — {note}" if (note := slow_note(s)) else ""))


def deadline_misses(metrics: Mapping[str, Any]) -> tuple[int, int]:
    """(requests that earned less than their TUF's maximum — late or never answered, all requests)."""
    rows = metrics.get("requests", [])
    return sum(1 for r in rows if r["utility"] < r["max_utility"] - 1e-9), len(rows)


def deadline_line(real: Mapping[str, Any], at_profile_speed: Mapping[str, Any] | None, speed: EngineSpeed) -> str:
    """One line: deadline misses of the real run, beside the simulator on the same arrivals at the
    profile's speed; says so when the machine was too slow for the workload's deadlines."""
    missed, n = deadline_misses(real)
    if at_profile_speed is None:
        return f"deadlines: {missed} of {n} requests missed their ERT"
    sim_missed, _ = deadline_misses(at_profile_speed)
    base = (f"deadlines: {missed} of {n} requests missed their ERT here, {sim_missed} in the simulator at "
            f"the speed of profile {speed.profile} on the same arrivals")
    if not speed.steps:  # no engine steps measured (the planner ran in another process)
        return base
    if missed > sim_missed and speed.ratio > SLOW_FACTOR:
        return (f"{base} — this machine ran engine steps {speed.ratio:.1f}x slower than the profile (other load "
                f"on the cores?), too slow for the workload's deadlines: the misses are the machine's, not the "
                f"scheduler's")
    if missed > sim_missed:
        return f"{base} — at the profile's speed ({speed.ratio:.2f}x), so not explained by a slow machine"
    return base


__all__ = ["EngineSpeed", "console", "deadline_line", "deadline_misses", "engine_speed", "print_table", "slow_note",
           "speed_line"]
