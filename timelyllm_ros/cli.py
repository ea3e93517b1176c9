"""The ``timelyllm`` console script.

Subcommands are modular: each lives in a module with ``add_parser(subparsers)`` that registers it
and sets ``func`` (returning an exit code).  ``bench`` is here; others (``demo``, ``plan-offline``,
``serve``, ...) are picked up from ``SUBCOMMAND_MODULES`` when their module exists.

``timelyllm bench`` replays an LRTrace workload in the discrete-event simulator for one or more
policies and writes JSON results (byte-identical for the same seed), a per-task-type table and
optional Fig. 5 / Fig. 6 style plots.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Any, Callable, NoReturn, Sequence

from .inputs import InputError as CliError  # noqa: F401 - subcommands raise it

EXIT_USAGE = 2
SUBCOMMAND_MODULES = ("timelyllm_ros.demo", "timelyllm_ros.serve", "timelyllm_ros.offline.cli",
                      "timelyllm_ros.nodes.cli", "timelyllm_ros.sweep", "timelyllm_ros.profiling.cli")


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (exit 2) that points at ``--help``."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as _v

    try:
        return _v("timelyllm_ros")
    except PackageNotFoundError:  # a source tree that was never installed
        return "unknown (not installed)"


def _positive_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {s!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def _positive_float(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {s!r}") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {s}")
    return v


def _param(s: str) -> tuple[str | None, str, Any]:
    """``--param [policy:]name=value`` (`inputs.parse_policy_param`: YAML values, ``inf``)."""
    from .inputs import InputError, parse_policy_param

    try:
        return parse_policy_param(s)
    except InputError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


# --------------------------------------------------------------------------------------- bench

def add_bench(sub: Any) -> None:
    p = sub.add_parser("bench", help="replay an LRTrace workload in the simulator for several policies",
                       description="Replay an LRTrace workload (paper §7) in the discrete-event simulator.")
    p.add_argument("--workload", required=True, help="bundled name (WID1, WID2, WID3, mixed_small) or YAML path")
    p.add_argument("--policy", action="append", default=None, dest="policies", metavar="P",
                   help=f"policy name; repeat for several ({', '.join(_policy_names())}); none given: default")
    p.add_argument("--param", action="append", type=_param, default=[], metavar="[POLICY:]NAME=VALUE",
                   help="policy parameter (repeatable): `trail:c=0.5` for one policy, `c=0.5` for every "
                        "policy of the run")
    p.add_argument("--max-batch", type=_positive_int, default=None,
                   help="fixed batch cap for every policy (default: latency-guided for segmenting "
                        "policies, 256 for vllm/vllm-stream/vllm-priority)")
    p.add_argument("--engines", type=_positive_int, default=1,
                   help="simulated engines (GPUs) behind the one planner (docs/scale-out.md; default 1)")
    p.add_argument("--engine-kind", choices=("stock", "preserve"), default="stock",
                   help="what the simulated engine can do with a paused request's KV: stock = vLLM as users run "
                        "it (cache/discard: abort frees KV, resume through the prefix cache; the default), "
                        "preserve = an InferCept/LAMPS-style engine that can also pin and swap KV")
    p.add_argument("--seed", type=int, default=None, help="arrival + robot seed (default: the workload's)")
    p.add_argument("--catalog", action="append", default=None, metavar="FILE",
                   help="task catalog YAML (repeatable; default: every bundled workloads/*_tasks.yaml)")
    p.add_argument("--robots-dir", action="append", default=[], metavar="DIR",
                   help="more robot YAMLs (custom robots) beside the bundled robots/ (repeatable)")
    p.add_argument("--profile", default=None, help="engine latency profile YAML (default rtx4090_llama3_8b)")
    p.add_argument("--exclusive-agents", action="store_true",
                   help="each agent is one robot running its goals FIFO (default: per-request lanes)")
    p.add_argument("--out", required=True, help="JSON results file")
    p.add_argument("--plot", help="Fig. 5 style per-task-type bars (PNG)")
    p.add_argument("--timeline", help="Fig. 6 style generation/execution trace (PNG)")
    p.add_argument("--timeline-requests", help="comma-separated request ids for --timeline (default: "
                   "the first event mixing urgent and normal requests)")
    p.add_argument("--timeline-window", type=float, default=3.0, metavar="S",
                   help="seconds after the first arrival shown in --timeline (default 3; 0 = all)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run_bench)


def _policy_names() -> list[str]:
    from .core.policies import policy_names

    return policy_names()


def run_bench(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from .core.metrics import to_json
    from .engines.simulated import DEFAULT_PROFILE, LatencyProfile, ProfileError
    from .inputs import (catalog_for, check_out_file, check_policies, check_run_params, params_for, robots_from_dirs,
                         workload_arrivals)
    from .workloads.format import WorkloadError
    from .report import console as make_console
    from .report import print_table
    from .sim.runner import run_simulation

    console = make_console(stderr=True)
    if not args.policies:
        from .core.policies import DEFAULT_POLICY

        args.policies = [DEFAULT_POLICY]
    check_policies(args.policies)
    robots = robots_from_dirs(args.robots_dir)
    catalog = catalog_for(robots, args.catalog)
    workload, _ = workload_arrivals(args.workload, robots, catalog, seed=args.seed)
    profile = Path(args.profile) if args.profile else DEFAULT_PROFILE
    if not profile.is_file():
        raise CliError(f"--profile {str(profile)!r}: no such file")
    try:
        LatencyProfile.from_yaml(profile)
    except (OSError, ValueError) as e:
        raise CliError(f"--profile: {e}") from None
    check_run_params(args.policies, args.param)
    out = check_out_file(args.out)
    for arg, path in (("--plot", args.plot), ("--timeline", args.timeline)):
        if path:
            check_out_file(path, arg=arg)
    results: dict[str, Any] = {}
    sims = {}
    for name in args.policies:
        params = params_for(name, args.param)
        with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[info]}"),
                      TimeElapsedColumn(), console=console, disable=args.no_progress, transient=True) as prog:
            task = prog.add_task(f"{workload.name} / {name}", total=None, info="")

            def update(now: float, done: int, total: int, _t=task, _p=prog) -> None:
                _p.update(_t, total=total, completed=done, info=f"t={now:7.1f}s {done}/{total}")

            try:
                r = run_simulation(workload, name, max_batch=args.max_batch, seed=args.seed,
                                   profile_path=profile, policy_params=params, progress=update,
                                   robots=robots, catalog=catalog,
                                   exclusive_agents=args.exclusive_agents, engines=args.engines,
                                   engine_kind=args.engine_kind)
            except (WorkloadError, ProfileError, ValueError) as e:
                raise CliError(f"{name}: {e}") from None
        sims[name] = r
        results[name] = r.to_dict()
        console.print(f"{workload.name} / {name}: {len(r.generations)} requests, virtual "
                      f"{r.virtual_end_s:.1f} s, wall {r.wall_s:.2f} s")
        print_table(make_console(), r.metrics, f"{workload.name} — {name} ({r.batcher}, profile {r.profile}, "
                                               f"{args.engine_kind} engine; simulator)")
    doc = {"workload": workload.name, "source": workload.source, "max_batch": args.max_batch,
           "engine_kind": args.engine_kind,
           "seed": args.seed if args.seed is not None else workload.seed, "policies": results,
           **({"engines": args.engines} if args.engines > 1 else {})}
    out.write_text(to_json(doc))
    console.print(f"wrote {out}")
    if args.plot or args.timeline:
        from . import plots

        if args.plot:
            plots.plot_task_types({n: r.metrics for n, r in sims.items()}, args.plot,
                                  title=f"{workload.name} (simulator, profile {next(iter(sims.values())).profile})")
            console.print(f"wrote {args.plot}")
        if args.timeline:
            ids = [s.strip() for s in args.timeline_requests.split(",")] if args.timeline_requests else None
            try:
                plots.plot_timeline({n: r.timeline() for n, r in sims.items()}, args.timeline,
                                    request_ids=ids, title=f"{workload.name}: generation vs execution",
                                    window_s=args.timeline_window or None)
            except ValueError as e:
                raise CliError(f"--timeline: {e}") from None
            console.print(f"wrote {args.timeline}")
    return 0


# --------------------------------------------------------------------------------------- main

BUILTIN: tuple[Callable[[Any], None], ...] = (add_bench,)


def build_parser() -> argparse.ArgumentParser:
    ap = OneLineParser(prog="timelyllm", description="TimelyLLM: segmented LLM serving for robots")
    ap.add_argument("--version", action="version", version=f"timelyllm {version()}")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    for add in BUILTIN:
        add(sub)
    for mod in SUBCOMMAND_MODULES:
        try:
            m = importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name == mod:
                continue  # that subcommand is not part of this installation
            raise
        add = getattr(m, "add_parser", None)
        if add is not None:
            add(sub)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(list(argv) if argv is not None else None)  # argparse exits 2 on usage errors
    try:
        return int(args.func(args) or 0)
    except CliError as e:
        print(f"timelyllm {args.cmd}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
