#!/usr/bin/env python3
"""The MiniSpec corpora through segmenter -> guard -> executor: tests/data/minispec_corpus.txt on
robots/tello.yaml (TypeFly's paper-era skills) and tests/data/minispec_corpus_typefly.txt on
robots/tello_typefly.yaml (TypeFly's current skill names, assignments in conditions, && / ||).

For every plan: segmentation streamed one character at a time must equal whole-text segmentation;
the plan is *dispatchable* when every segment is valid and the dispatch guard accepts it (with the
plan's state: variable types, envelope so far); dispatchable plans then run on the simulated Tello
executor (the project's simulator backend, time scale 0).  Plans marked '!' must be refused with
the given reason.  Prints the counts (tests/test_minispec_corpus.py asserts them).

    python benchmarks/minispec_corpus.py
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from timelyllm_ros.core.guard import PlanState, check_segment  # noqa: E402
from timelyllm_ros.core.robots import RobotSpec, load_robots  # noqa: E402
from timelyllm_ros.core.segmenter import Segmenter, segment_text  # noqa: E402
from timelyllm_ros.core.types import ResultCode, SegmentGoal  # noqa: E402
from timelyllm_ros.executors.base import ExecutorConfig, SegmentExecutor, SimulatedPerception  # noqa: E402
from timelyllm_ros.executors.simulated import SimulatedBackend  # noqa: E402

CORPUS = ROOT / "tests" / "data" / "minispec_corpus.txt"
TYPEFLY_CORPUS = ROOT / "tests" / "data" / "minispec_corpus_typefly.txt"
CORPORA = ((CORPUS, "tello"), (TYPEFLY_CORPUS, "tello_typefly"))  # (file, robot type)


@dataclass
class Entry:
    line: int
    plan: str
    refusal: str = ""  # '' = must be dispatchable; else a fragment of the expected refusal


@dataclass
class Outcome:
    entry: Entry
    stream_equal: bool
    segments: int
    dispatchable: bool
    reason: str  # why not dispatchable ('' when it is)
    run_codes: tuple[str, ...] = ()  # executor result per segment (dispatchable plans)


def load_corpus(path: Path = CORPUS) -> list[Entry]:
    out = []
    for i, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not raw.strip() or raw.startswith("#"):
            continue
        if raw.startswith("!"):
            reason, _, plan = raw[1:].partition("|")
            out.append(Entry(i, plan, reason))
        else:
            out.append(Entry(i, raw))
    return out


def check(entry: Entry, robot: RobotSpec, *, run: bool = True) -> Outcome:
    whole = segment_text(robot, entry.plan)
    seg = Segmenter(robot)
    streamed = []
    for ch in entry.plan:
        streamed.extend(seg.feed(ch))
    streamed.extend(seg.finish())
    reason, plan = "", PlanState()
    for cut in whole:
        if not cut.ok:
            reason = f"segmenter: {cut.error}"
            break
        v = check_segment(robot, cut.text, cut.calls, plan)
        if not v.ok:
            reason = f"guard: {v.reason}"
            break
        plan = v.plan
    codes: tuple[str, ...] = ()
    if run and not reason:
        ex = SegmentExecutor(robot, SimulatedBackend(robot, time_scale=0.0,
                                                     perception=SimulatedPerception(("cat", "door", "box"), seed=3)),
                             ExecutorConfig(timeout_s=5.0))
        codes = tuple(ex.execute(SegmentGoal("c", "d", robot.robot_type, k, c.text, c.calls, 1.0, c.blocking)).code.name
                      for k, c in enumerate(whole))
    return Outcome(entry, streamed == whole, len(whole), not reason, reason, codes)


def main() -> int:
    robots = load_robots()
    return max(report(path, robots[rtype]) for path, rtype in CORPORA)


def report(path: Path, robot: RobotSpec) -> int:
    outcomes = [check(e, robot) for e in load_corpus(path)]
    expected_ok = [o for o in outcomes if not o.entry.refusal]
    expected_refused = [o for o in outcomes if o.entry.refusal]
    print(f"corpus: {len(outcomes)} plans ({path.relative_to(ROOT)}, robot {robot.robot_type}), "
          f"{sum(o.segments for o in outcomes)} segments")
    print(f"streamed 1 char at a time == whole text: {sum(o.stream_equal for o in outcomes)}/{len(outcomes)}")
    print(f"dispatchable: {sum(o.dispatchable for o in expected_ok)}/{len(expected_ok)} plans the {robot.robot_type} "
          f"schema allows; ran on the simulated executor: "
          f"{sum(all(c == ResultCode.OK.name for c in o.run_codes) for o in expected_ok)} with every segment OK")
    print(f"refused as expected: {sum(not o.dispatchable and o.entry.refusal in o.reason for o in expected_refused)}"
          f"/{len(expected_refused)} plans TypeFly's grammar accepts but the Tello schema / envelope does not:")
    for o in expected_refused:
        print(f"  line {o.entry.line}: {o.entry.plan!r} -> {o.reason}")
    bad = [o for o in outcomes if not o.stream_equal or o.dispatchable == bool(o.entry.refusal)
           or (o.entry.refusal and o.entry.refusal not in o.reason)
           or any(c != ResultCode.OK.name for c in o.run_codes)]
    for o in bad:
        print(f"  UNEXPECTED line {o.entry.line}: {o.entry.plan!r}: stream_equal={o.stream_equal} "
              f"reason={o.reason!r} run={o.run_codes}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
