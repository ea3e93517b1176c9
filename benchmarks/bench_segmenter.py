"""Segmenter cost per token on LRTrace plans (paper §7.5.1: stop checking must stay negligible).

Feeds every reference plan of workloads/lrtrace_tasks.yaml (plus a few harder hand-written
MiniSpec plans with loops, conditionals and quoted separators) token by token, using a regex that
splits text into ~3-character pieces like a BPE tokenizer would, and prints the wall-clock cost
per token.  Goal: <= 20 us/token.  For contrast it also times the naive stop checker that
re-parses the whole text after every token.

    python benchmarks/bench_segmenter.py [--repeat 200]
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path

import yaml

from timelyllm_ros.core.minispec import MiniSpecError, parse_program  # noqa: E402
from timelyllm_ros.core.robots import load_robots  # noqa: E402
from timelyllm_ros.core.segmenter import Segmenter  # noqa: E402

TOKEN_RE = re.compile(r"[A-Za-z]{1,3}|[0-9]{1,3}|\s+|[^A-Za-z0-9\s]{1,2}")
EXTRA = {
    "tello": [
        "s('cat');?iv('cat')==True{g('cat');tp;l('found; the } cat')}:{l('no {cat}')};mf(50);tp",
        "_1=ox('cat');?_1>0.6{tc(15)};?_1<0.4{tu(15)};2{3{?iv('x')&oh('x')<0.5{mf(40)}:{tp}}};->True",
        "8{?iv('person')==True{mb(100);->True}tc(45)};mu(80);l('area clear')",
    ],
}


def tokenize(text: str) -> list[str]:
    toks = TOKEN_RE.findall(text)
    assert "".join(toks) == text
    return toks


def load_plans(robots) -> dict[str, list[str]]:
    path = Path(__file__).resolve().parents[1] / "workloads" / "lrtrace_tasks.yaml"
    plans: dict[str, list[str]] = {}
    for task in yaml.safe_load(path.read_text())["tasks"].values():
        for sc in task["scenes"]:
            plans.setdefault(task["robot_type"], []).append(sc["plan"])
    for rt, extra in EXTRA.items():
        plans.setdefault(rt, []).extend(extra)
    return plans


def run_incremental(robot, token_lists, repeat: int) -> tuple[float, int, int]:
    """Best-of-`repeat` total seconds for feeding all plans, tokens fed, cuts produced."""
    best = float("inf")
    tokens = cuts = 0
    for _ in range(repeat):
        tokens = cuts = 0
        t0 = time.perf_counter()
        for toks in token_lists:
            seg = Segmenter(robot)
            for tok in toks:
                cuts += len(seg.feed(tok))
            cuts += len(seg.finish())
            tokens += len(toks)
        best = min(best, time.perf_counter() - t0)
    return best, tokens, cuts


def run_naive(robot, token_lists, repeat: int) -> float:
    """Re-parse the whole text after every token (what a regex-on-everything checker does)."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for toks in token_lists:
            text = ""
            for tok in toks:
                text += tok
                try:
                    parse_program(text, robot)
                except MiniSpecError:
                    pass
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=50, help="repetitions; the best run is reported")
    args = ap.parse_args()
    robots = load_robots()
    plans = load_plans(robots)
    print(f"python {sys.version.split()[0]}, best of {args.repeat} runs, ~3-char regex tokens")
    print(f"{'robot':6} {'plans':>5} {'tokens':>7} {'tok/plan':>8} {'cuts':>5} {'us/token':>9} {'naive us/token':>15}")
    all_us = []
    for rt, texts in sorted(plans.items()):
        robot = robots[rt]
        token_lists = [tokenize(t) for t in texts]
        secs, tokens, cuts = run_incremental(robot, token_lists, args.repeat)
        us = secs / tokens * 1e6
        all_us.append(us)
        naive = ""
        if robot.language == "minispec":
            naive = f"{run_naive(robot, token_lists, max(1, args.repeat // 10)) / tokens * 1e6:15.1f}"
        print(f"{rt:6} {len(texts):5d} {tokens:7d} {tokens / len(texts):8.1f} {cuts:5d} {us:9.2f} {naive:>15}")
    worst = max(all_us)
    print(f"worst robot type: {worst:.2f} us/token (goal <= 20 us/token): {'OK' if worst <= 20 else 'MISSED'}")
    print(f"median over robot types: {statistics.median(all_us):.2f} us/token")


if __name__ == "__main__":
    main()
