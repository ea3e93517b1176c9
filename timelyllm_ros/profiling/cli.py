"""`timelyllm profile fit|check`: fit the simulator's latency profile on a real engine
(profiling/fit.py, measure.py, refit.py), and check the simulator with it against real serving
(profiling/check.py).  Their arguments, and `fit`'s checks of them.

    timelyllm profile fit --from-serving          # writes profiles/vllm_cpu_tiny.yaml
    timelyllm profile check --workload WID1,WID3,chat_mixed --duration 40 --runs 4
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any, Callable, NoReturn

from ..demo import DEFAULT_MODEL, DEFAULT_PROFILE
from . import check, fit


def add_parser(sub: Any) -> None:
    p = sub.add_parser("profile", help="fit the simulator's latency profile on real vLLM, or check it",
                       description="Fit the simulator's latency profile (profiles/*.yaml) on a real vLLM "
                                   "engine (`fit`), or check the simulator with it against real serving "
                                   "(`check`).")
    cmds = p.add_subparsers(dest="profile_cmd", required=True, metavar="COMMAND")
    fp = cmds.add_parser("fit", help="measure vLLM step latencies and write a profile",
                         description=fit.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    fp.add_argument("--model", default=None)
    fp.add_argument("--out", default=str(DEFAULT_PROFILE))
    fp.add_argument("--reps", type=int, default=5)
    fp.add_argument("--max-batch", type=int, default=8)
    fp.add_argument("--from-serving", action="store_true",
                    help="fit the step terms on real serving iterations (see fit_serving) instead of "
                         "the isolated micro-measurements")
    fp.add_argument("--fit-workload", default="mixed_small,WID2,chat_burst,chat_poisson",
                    help="comma-separated workloads whose draws are served for --from-serving (a mixture: "
                         "batch sizes, prompt lengths and prefill/decode mixes of several loads; chat_poisson "
                         "brings steady chat streaming, short contexts in long runs of steps, which the others "
                         "lack); keep the fidelity check's workloads (WID1, WID3, chat_mixed) out to test out "
                         "of sample")
    _add_fit_draws(fp)
    fp.add_argument("--save-steps", default=None,
                    help="--from-serving: save the served iterations (StepRecords, host gaps, tokenize/detokenize "
                         "times, KV geometry, load averages) as JSON here, to refit offline with --steps")
    fp.add_argument("--steps", default=None,
                    help="refit the profile from iterations saved by --save-steps, without an engine (seconds); "
                         "A.json,B.json: several saved sessions fitted together as one")
    fp.add_argument("--measure-host", action="store_true",
                    help="with --steps: time tokenising/detokenising now with the model's tokenizer (no engine) "
                         "instead of using the saved figures")
    fp.set_defaults(func=lambda args: run_fit(args, fp.error))

    cp = cmds.add_parser("check", help="the same workload on real vLLM and in the simulator: the error",
                         description=check.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cp.add_argument("--workload", default="mixed_small",
                    help="workload, or a comma-separated list served on one engine in turn (run 1 of each, then "
                         "run 2, ...: each samples the whole session; with --calibrate each one's runs back to back) "
                         "and then simulated (out of sample: WID1,WID3,chat_mixed)")
    cp.add_argument("--duration", type=float, default=60.0, help="only arrivals up to this time")
    cp.add_argument("--runs", type=int, default=3, help="real runs (the reference is their median)")
    cp.add_argument("--policy", default=None,
                    help="policy of the real runs and the simulation (default: `default`, the product's and the "
                         "one `timelyllm profile fit` serves its fit under: the host time between steps depends "
                         "on it; with --real: the policy the saved runs were served under)")
    cp.add_argument("--model", default=str(DEFAULT_MODEL))
    cp.add_argument("--profile", default=str(DEFAULT_PROFILE))
    cp.add_argument("--out", default=None, help="write the figures as JSON here")
    cp.add_argument("--save-real", default=None, help="save the real runs (plans, responses, steps, load) here")
    cp.add_argument("--real", default=None, help="use real runs saved by --save-real instead of serving")
    cp.add_argument("--fit-workload", default=None,
                    help="fit the profile in the same session: serve draws of these workloads (comma-separated; "
                         "e.g. mixed_small,WID2,chat_burst,chat_poisson, never the checked ones) interleaved "
                         "with the real runs, so fit and check see the same machine state; "
                         "`timelyllm profile fit`'s serving fit; "
                         "the profile is written to --fit-out and used for the simulation")
    _add_fit_draws(cp)
    cp.add_argument("--fit-out", default=None, help="with --fit-workload: write the fitted profile here")
    cp.add_argument("--calibrate", default=None, metavar="W",
                    help="calibrate the profile's speed in the same minutes: serve the first --calibrate-duration s "
                         "of workload W (seed --calibrate-seed, the same draw every time; never a checked workload) "
                         "before every real run and after the last, and simulate each checked workload with the "
                         "profile scaled by measured/charged time of the probes around its runs")
    cp.add_argument("--calibrate-duration", type=float, default=12.0, help="seconds of W per probe")
    cp.add_argument("--calibrate-seed", type=int, default=201, help="the probe's draw of W")
    cp.add_argument("--save-steps", default=None,
                    help="with --fit-workload: save the fit's served iterations here "
                         "(`timelyllm profile fit --steps` refits from them offline)")
    cp.set_defaults(func=lambda args: check.run_check(args, cp.error))


def _add_fit_draws(p: argparse.ArgumentParser) -> None:
    """The arguments both commands serve their fit draws with (fit: --from-serving; check: --fit-workload)."""
    p.add_argument("--fit-seed", type=int, default=101,
                   help="arrival/robot seed of the first fit draw, +1 per further draw (the fidelity check "
                        "uses the workload's own seed)")
    p.add_argument("--fit-runs", type=int, default=2, help="draws per fit workload")
    p.add_argument("--fit-duration", type=float, default=40.0,
                   help="serve only the arrivals of each fit draw's first S seconds")
    p.add_argument("--dtype", default=None, help="vLLM dtype (default: what serving uses on this machine)")


def run_fit(a: argparse.Namespace, error: Callable[[str], NoReturn]) -> None:
    """`timelyllm profile fit`: check the arguments, then refit from saved iterations (--steps) or
    measure on a live engine."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if a.reps < 1 or a.max_batch < 1 or a.fit_runs < 1:
        error("--reps, --max-batch and --fit-runs must be >= 1")
    if not a.fit_duration > 0:
        error("--fit-duration must be > 0")
    from ..workloads.format import WorkloadError, load_workload
    try:
        a.fit_workloads = [load_workload(w.strip()) and w.strip() for w in a.fit_workload.split(",") if w.strip()]
    except (WorkloadError, OSError) as e:
        error(f"--fit-workload: {e}")
    if not a.fit_workloads:
        error("--fit-workload: name at least one workload")

    if a.steps:
        missing = [f for f in a.steps.split(",") if not Path(f).is_file()]
        if missing:
            error(f"--steps: no such file {', '.join(missing)} (write one with --from-serving --save-steps)")
        from .refit import refit_saved

        return refit_saved(a)

    from .measure import fit_live

    fit_live(a)
