"""The planner loop on the simulated engine: segmentation, suspension, dispatch, results, endings."""

import pytest

from timelyllm_ros.core.clock import VirtualClock
from timelyllm_ros.core.exec_time import ExecTimeEstimator
from timelyllm_ros.core.planner import Planner, PlannerConfig
from timelyllm_ros.core.ports import PlannerListener
from timelyllm_ros.core.policies import make_policy
from timelyllm_ros.core.robots import load_robots
from timelyllm_ros.core.tuf import NORMAL, URGENT
from timelyllm_ros.core.types import GenState, PlanRequest, RequestError, ResultCode, SegmentResult
from timelyllm_ros.engines.base import EngineError
from timelyllm_ros.engines.simulated import SimulatedEngine
from timelyllm_ros.sim.prompts import SimPromptSource
from timelyllm_ros.core.tokenizer import SimTokenizer

ROBOTS = load_robots()


class RecordingDispatcher:
    """Dispatcher port that holds goals until the test reports their results."""

    def __init__(self):
        self.goals, self.cancelled = [], []

    def dispatch(self, goal):
        self.goals.append(goal)

    def cancel(self, request_id):
        self.cancelled.append(request_id)


def make(policy="timelyllm", **cfg):
    clock = VirtualClock()
    tok = SimTokenizer()
    engine = SimulatedEngine(clock, tokenizer=tok)
    disp = RecordingDispatcher()
    planner = Planner(clock=clock, engine=engine, dispatcher=disp, robots=ROBOTS, policy=make_policy(policy),
                      estimator=ExecTimeEstimator(ROBOTS), prompts=SimPromptSource(engine, tok, robots=ROBOTS),
                      config=PlannerConfig(**cfg))
    return planner, disp, clock


def req(rid, plan, tuf=NORMAL, robot="d1", rtype="tello", t=0.0):
    return PlanRequest(rid, robot, rtype, "find the cat", "cat, sofa", tuf, t, reference_plan=plan)


def run_until(planner, cond, limit=10_000):
    for _ in range(limit):
        if cond():
            return
        planner.step()
    raise AssertionError("condition not reached")


def ok(planner, goal, clock, dur=1.0, value=None):
    t = clock.now()
    planner.post_result(SegmentResult(goal.request_id, goal.segment_index, ResultCode.OK, t, t + dur,
                                      (dur,) * len(goal.calls), len(goal.calls), value))


def test_segments_suspend_dispatch_resume_and_finish():
    planner, disp, clock = make()
    assert planner.submit(req("a", "mf(50);tc(90);tp;")).accepted
    run_until(planner, lambda: disp.goals)
    g = planner.generations["a"]
    # suspended right after the first statement: one goal out, engine slot freed
    assert [x.text for x in disp.goals] == ["mf(50);"] and g.state is GenState.SUSPENDED
    assert g.text == "mf(50);"
    run_until(planner, lambda: len(disp.goals) == 3)
    assert [x.text for x in disp.goals] == ["mf(50);", "tc(90);", "tp;"]
    assert [c.name for x in disp.goals for c in x.calls] == ["move_forward", "turn_cw", "take_picture"]
    assert g.resumes >= 2 and all(c > 0 for c in g.cached_tokens[1:])  # resumes hit the prefix cache
    run_until(planner, lambda: g.engine_finished)
    assert g.state is GenState.DRAINING
    for goal in disp.goals:
        ok(planner, goal, clock)
    planner.step()
    assert g.state is GenState.FINISHED and g.reason == "plan executed"
    assert not planner.busy()


def test_blocking_segment_waits_for_its_result():
    planner, disp, clock = make()
    planner.submit(req("b", "s('cat');g('cat');"))
    run_until(planner, lambda: disp.goals)
    g = planner.generations["b"]
    assert disp.goals[0].blocking and g.state is GenState.WAITING
    for _ in range(50):
        planner.step()
    assert len(disp.goals) == 1  # no resume before the scan's result
    ok(planner, disp.goals[0], clock, value=True)
    run_until(planner, lambda: len(disp.goals) == 2)
    assert g.segments[0].result is True


def test_whole_and_stream_modes():
    planner, disp, clock = make("vllm")
    planner.submit(req("w", "mf(50);tc(90);"))
    run_until(planner, lambda: planner.generations["w"].engine_finished)
    assert [x.text for x in disp.goals] == ["mf(50);", "tc(90);"]
    d0 = [planner.generations["w"].segments[i].dispatched_at for i in range(2)]
    assert d0[0] == d0[1]  # whole plan first, then all statements at once
    planner, disp, clock = make("vllm-stream")
    planner.submit(req("s", "mf(50);tc(90);"))
    run_until(planner, lambda: planner.generations["s"].engine_finished)
    g = planner.generations["s"]
    assert g.segments[0].dispatched_at < g.segments[1].dispatched_at and g.resumes == 0


def test_invalid_llm_statement_is_never_dispatched():
    planner, disp, clock = make()
    planner.submit(req("x", "mf(50);mf(9000);tp;"))
    run_until(planner, lambda: planner.generations["x"].state.terminal)
    g = planner.generations["x"]
    assert g.state is GenState.FAILED and "9000" in g.reason
    assert [x.text for x in disp.goals] == ["mf(50);"]
    assert disp.cancelled == ["x"]  # what was dispatched is cancelled on the robot
    planner2, disp2, _ = make()
    planner2.submit(req("y", "fly_to_moon(1);"))
    run_until(planner2, lambda: planner2.generations["y"].state.terminal)
    assert planner2.generations["y"].state is GenState.FAILED and not disp2.goals


def test_executor_failure_cancel_and_engine_failure_end_requests_with_reasons():
    planner, disp, clock = make()
    planner.submit(req("f", "mf(50);tc(90);"))
    run_until(planner, lambda: disp.goals)
    t = clock.now()
    planner.post_result(SegmentResult("f", 0, ResultCode.TIMEOUT, t, t + 5, (), 0, None, "no answer in 5 s"))
    planner.step()
    g = planner.generations["f"]
    assert g.state is GenState.FAILED and "timeout" in g.reason and "no answer" in g.reason

    planner.submit(req("c", "mf(50);tc(90);", robot="d2"))
    planner.cancel("c", "operator abort")
    planner.step()
    assert planner.generations["c"].state is GenState.CANCELLED
    assert planner.generations["c"].reason == "operator abort"

    class Boom:
        def __getattr__(self, name):
            return getattr(planner_engine, name)

        def step(self):
            raise EngineError("engine core died")

    planner_engine = planner.engine
    planner.submit(req("e", "mf(50);", robot="d3"))
    planner.engine = Boom()
    planner.step()
    e = planner.generations["e"]
    assert e.state is GenState.FAILED and "engine core died" in e.reason
    assert not planner.submit(req("later", "tp;", robot="d4")).accepted  # unhealthy: refused with reason


@pytest.mark.parametrize("mapping,reason", [
    ({"robot_id": "d", "robot_type": "tello", "task": "x", "tuf": {"ert": 1, "alpha": -1, "beta": 1}}, "request_id"),
    ({"request_id": "r", "robot_id": "d", "robot_type": "submarine", "task": "x",
      "tuf": {"ert": 1, "alpha": -1, "beta": 1}}, "unknown robot_type"),
    ({"request_id": "r", "robot_id": "d", "robot_type": "tello", "task": "x",
      "tuf": {"ert": 1, "alpha": 2, "beta": 1}}, "alpha"),
    ({"request_id": "r id; drop", "robot_id": "d", "robot_type": "tello", "task": "x",
      "tuf": {"ert": 1, "alpha": -1, "beta": 1}}, "request_id must match"),
    ("not a mapping", "mapping"),
])
def test_bad_requests_rejected_with_reason(mapping, reason):
    """An untrusted request (topic message, workload line) is validated against the planner's robots
    before anything is submitted (the node's `_submit` does this, then `Planner.submit`)."""
    planner, _, _ = make()
    with pytest.raises(RequestError) as e:
        PlanRequest.from_mapping(mapping, arrival=planner.clock.now(), robot_types=set(planner.robots))
    assert reason in str(e.value)
    assert planner.rejected == 0 and not planner.generations


def test_admission_limits():
    planner, _, clock = make(max_per_agent=2, max_queued=3, agent_rate_per_s=1.0, agent_burst=2,
                             max_prompt_tokens=100_000)
    assert planner.submit(req("a1", "tp;", robot="a")).accepted
    assert planner.submit(req("a2", "tp;", robot="a")).accepted
    r = planner.submit(req("a3", "tp;", robot="a"))
    assert not r.accepted and "unfinished requests" in r.reason
    dup = planner.submit(req("a1", "tp;", robot="b"))
    assert not dup.accepted and "duplicate" in dup.reason
    assert planner.submit(req("b1", "tp;", robot="b")).accepted
    q = planner.submit(req("c1", "tp;", robot="c"))
    assert not q.accepted and "queue full" in q.reason
    planner2, _, clock2 = make(agent_rate_per_s=1.0, agent_burst=2)
    assert planner2.submit(req("r1", "tp;", robot="z")).accepted
    assert planner2.submit(req("r2", "tp;", robot="z", t=0)).accepted
    rate = planner2.submit(req("r3", "tp;", robot="z"))
    assert not rate.accepted and "requests/s" in rate.reason
    clock2.advance(1.5)
    assert planner2.submit(req("r4", "tp;", robot="z")).accepted  # the bucket refilled
    planner3, _, _ = make(max_prompt_tokens=10)
    big = planner3.submit(req("p", "tp;"))
    assert not big.accepted and "prompt has" in big.reason


def test_timelyllm_serves_urgent_first():
    planner, disp, clock = make(max_live=100)
    planner.batcher = planner.fixed(1)
    for i in range(3):
        planner.submit(req(f"n{i}", "mf(50);tc(90);", robot=f"n{i}"))
    planner.submit(req("u", "mb(100);", tuf=URGENT, robot="u"))
    run_until(planner, lambda: disp.goals)
    assert disp.goals[0].request_id == "u"


def test_engine_restart_requeues_running_generations():
    planner, disp, clock = make()
    real = planner.engine
    fail = {"n": 1}

    class Flaky:
        """The real simulated engine whose next step dies once (a crashed engine core)."""

        def __getattr__(self, name):
            return getattr(real, name)

        def step(self):
            if fail["n"]:
                fail["n"] -= 1
                for gid in list(planner._live):
                    real.abort(gid, "discard")  # the crash loses the KV of everything running
                raise EngineError("engine core died")
            return real.step()

    planner.engine = Flaky()
    planner.engine_restart = lambda old: real  # the supervisor brings up a fresh engine
    planner.submit(req("a", "mf(50);tp;"))
    run_until(planner, lambda: disp.goals)
    g = planner.generations["a"]
    assert planner.engine_restarts == 1 and g.engine_restarts == 1
    assert not g.state.terminal and disp.goals[0].text == "mf(50);"
    assert planner.engine_healthy


def test_suspension_tells_the_policy_which_batch_stays():
    """kv_mode at a suspension sees the generations still running beside it (LAMPS weighs the
    suspended one's memory against that batch), never the suspended generation itself."""
    planner, disp, clock = make()
    seen = []
    orig = planner.policy.kv_mode

    def spy(g, seg, ctx):
        if seg is not None:
            seen.append((g.gen_id, sorted(x.gen_id for x in ctx.running)))
        return orig(g, seg, ctx)

    planner.policy.kv_mode = spy
    assert planner.submit(req("a", "mf(50);tp;")).accepted
    assert planner.submit(req("b", "mf(20);mf(30);mf(40);mf(50);tp;", robot="d2")).accepted
    run_until(planner, lambda: len(seen) >= 1)
    first, others = seen[0]
    assert first not in others and others == sorted({"a", "b"} - {first})
    run_until(planner, lambda: not any(g.state is GenState.RUNNING for g in planner.generations.values()))
    assert all(gid not in running for gid, running in seen)


class SpanningTokenizer:
    """Characters, except a few multi-character tokens — one of which closes a statement and
    holds the whole next one (`);tc(90);`), as a BPE merge of a real tokenizer could."""

    eos_token_id = 0
    MERGES = ("mf(50", ");tc(90);", "tp;")

    def __init__(self):
        self.pieces = [""]
        self.ids = {}

    def _id(self, piece):
        if piece not in self.ids:
            self.ids[piece] = len(self.pieces)
            self.pieces.append(piece)
        return self.ids[piece]

    def encode(self, text):
        out, i = [], 0
        while i < len(text):
            m = next((p for p in self.MERGES if text.startswith(p, i)), text[i])
            out.append(self._id(m))
            i += len(m)
        return out

    def decode(self, ids):
        return "".join(self.pieces[i] for i in ids)


def test_statement_completed_inside_the_suspending_token_is_not_lost():
    """The token that ends one statement also holds the whole next one: both are dispatched, in
    order, and the plan goes on from there (nothing the model generated is dropped silently)."""
    clock = VirtualClock()
    tok = SpanningTokenizer()
    engine = SimulatedEngine(clock, tokenizer=tok)
    disp = RecordingDispatcher()
    planner = Planner(clock=clock, engine=engine, dispatcher=disp, robots=ROBOTS, policy=make_policy("timelyllm"),
                      estimator=ExecTimeEstimator(ROBOTS), prompts=SimPromptSource(engine, tok, robots=ROBOTS))
    assert planner.submit(req("a", "mf(50);tc(90);tp;")).accepted
    g = planner.generations["a"]
    run_until(planner, lambda: g.engine_finished or g.state.terminal)
    assert [x.text for x in disp.goals] == ["mf(50);", "tc(90);", "tp;"]
    assert g.text == "mf(50);tc(90);tp;"
    for goal in disp.goals:
        ok(planner, goal, clock)
    planner.step()
    assert g.state is GenState.FINISHED


def test_admission_sees_memory_freed_while_the_engine_was_idle():
    """A generation blocked on KV memory is admitted once an abort outside an engine step (here a
    cancelled request whose suspended generation pinned its KV) frees the memory: the planner's
    engine-stats snapshot never outlives a scheduling point (it used to, and the run stalled)."""
    import dataclasses

    from timelyllm_ros.core.batching import FixedBatch
    from timelyllm_ros.core.policies.basic import FCFS
    from timelyllm_ros.engines.simulated import DEFAULT_PROFILE, LatencyProfile

    class PinAll(FCFS):  # always keep a suspended generation's KV (no memory-based fallback)
        def kv_mode(self, g, seg, ctx):
            return "preserve"

    clock, tok = VirtualClock(), SimTokenizer()
    profile = dataclasses.replace(LatencyProfile.from_yaml(DEFAULT_PROFILE), kv_capacity_blocks=220)
    engine = SimulatedEngine(clock, profile, tok)
    disp = RecordingDispatcher()
    planner = Planner(clock=clock, engine=engine, dispatcher=disp, robots=ROBOTS, policy=PinAll(),
                      estimator=ExecTimeEstimator(ROBOTS), prompts=SimPromptSource(engine, tok, robots=ROBOTS),
                      config=PlannerConfig(max_tokens=32))
    planner.batcher = FixedBatch(8, planner.max_segment_tokens, kv_watermark=0.2)
    planner._release_pinned = lambda: 0  # this test isolates the snapshot: no pinned-KV release
    assert planner.submit(req("a", "mf(50);tc(90);tp;", robot="d1")).accepted
    run_until(planner, lambda: disp.goals)  # a: first segment out, suspended with its KV pinned
    assert planner.generations["a"].state is GenState.SUSPENDED and engine.pinned_blocks > 150
    assert planner.submit(req("b", "tp;", robot="d2")).accepted
    planner.step()
    b = planner.generations["b"]
    assert b.state is GenState.QUEUED and b.blocked == "kv memory"
    planner.cancel("a")  # frees a's pinned KV; the engine does not step meanwhile
    run_until(planner, lambda: b.state is not GenState.QUEUED, limit=5)
    assert b.state in (GenState.RUNNING, GenState.SUSPENDED, GenState.DRAINING)


def test_admission_sees_memory_that_preemptions_at_the_same_point_freed():
    """Regression (regime map: trail on drones:800 / drones:1600 kv/4, edge board, could not
    finish): a policy preempts the running generations to make room; the admission that follows
    at the same scheduling point must see the KV those aborts freed.  It saw the snapshot taken
    before them, refused the best waiting generation for memory with the engine now empty, the
    engine did not step, and the simulation stopped with requests left."""
    from timelyllm_ros.core.policies.base import Selection
    from timelyllm_ros.core.policies.basic import FCFS

    class MakeRoom(FCFS):  # a newcomer preempts everything running (KV: cache, freed)
        def select(self, ready, running, ctx, now):
            new = [g for g in ready if not g.output_ids]
            return Selection(order=new, preempt=list(running) if new else [])

    planner, engine, disp, clock = _pinning_planner(MakeRoom())
    assert planner.submit(req("a", "mf(50);tc(90);tp;", robot="d1")).accepted
    planner.step()
    a = planner.generations["a"]
    assert a.state is GenState.RUNNING
    assert planner.submit(req("b", "tp;", robot="d2")).accepted
    stats = engine.stats()  # a's context leaves too little beside it for b
    assert stats.kv_free_blocks - 1 < planner.batcher.kv_watermark * stats.kv_total_blocks
    assert planner.step()  # a preempted, b admitted at the same point: the engine runs
    b = planner.generations["b"]
    assert a.state is GenState.QUEUED and b.state is not GenState.QUEUED, b.blocked


def _pinning_planner(policy, capacity=220, engine_cls=SimulatedEngine):
    """A planner on a small simulated engine (`capacity` KV blocks) with a 20 % KV watermark:
    one suspended generation whose KV is preserved leaves too little for a second one."""
    import dataclasses

    from timelyllm_ros.core.batching import FixedBatch
    from timelyllm_ros.engines.simulated import DEFAULT_PROFILE, LatencyProfile

    clock, tok = VirtualClock(), SimTokenizer()
    profile = dataclasses.replace(LatencyProfile.from_yaml(DEFAULT_PROFILE), kv_capacity_blocks=capacity)
    engine = engine_cls(clock, profile, tok)
    disp = RecordingDispatcher()
    planner = Planner(clock=clock, engine=engine, dispatcher=disp, robots=ROBOTS, policy=policy,
                      estimator=ExecTimeEstimator(ROBOTS), prompts=SimPromptSource(engine, tok, robots=ROBOTS),
                      config=PlannerConfig(max_tokens=32))
    planner.batcher = FixedBatch(8, planner.max_segment_tokens, kv_watermark=0.2)
    return planner, engine, disp, clock


def test_pinned_kv_that_blocks_an_empty_engine_is_released():
    """Regression (regime map: fcfs-preserve on WID1 kv/4 and lamps on drones:400 kv/4, edge
    board, could not finish).  Priority inversion on pinned KV: a suspended generation preserves
    its KV; the best waiting generation does not fit beside it, and with nothing running nothing
    would ever free it.  The planner turns the preserved KV into cached KV (freed, reused on
    resume unless evicted) and admits the waiting one; the suspended one still resumes."""
    policy = make_policy("fcfs-preserve", max_pinned_frac=1.0)  # preserve always (no fallback)
    planner, engine, disp, clock = _pinning_planner(policy)
    assert planner.submit(req("a", "s('cat');g('cat');", robot="d1")).accepted
    run_until(planner, lambda: disp.goals)  # a: scan dispatched, waits for its result, KV pinned
    a = planner.generations["a"]
    assert a.state is GenState.WAITING and engine.pinned_blocks > 150
    assert a.policy.lamps.kv == "preserve"
    assert planner.submit(req("b", "tp;", robot="d2")).accepted
    planner.step()
    b = planner.generations["b"]
    assert b.state is not GenState.QUEUED, b.blocked
    assert engine.pinned_blocks == 0 and engine.suspended_mode("a") == "cache"
    assert a.kv_released == 1 and planner.kv_released == 1
    assert a.policy.lamps.kv == "cache"  # the policy was told (LAMPS's admission and ranking read it)
    ok(planner, disp.goals[0], clock, value=True)  # the scan's result: a resumes
    run_until(planner, lambda: a.state is GenState.DRAINING or a.state.terminal, limit=2000)
    assert a.state is GenState.DRAINING and a.text == "s('cat');g('cat');"


def test_engine_that_cannot_run_for_pinned_kv_is_not_given_up():
    """An engine step that fails while suspended generations pin KV (the simulated engine's "no
    generation can run: N KV blocks are pinned by preserved generations") releases the pinned KV
    and steps again instead of failing every request (regression: fcfs-preserve on drones:400
    kv/4, edge board, failed all 980 requests and rejected the rest as "engine unavailable")."""
    class Starved(SimulatedEngine):
        def step(self):
            if self.pinned_blocks:
                raise EngineError("no generation can run: KV blocks are pinned by preserved generations")
            return super().step()

    planner, engine, disp, clock = _pinning_planner(make_policy("fcfs-preserve", max_pinned_frac=1.0),
                                                    capacity=2000, engine_cls=Starved)
    assert planner.submit(req("a", "s('cat');g('cat');", robot="d1")).accepted
    run_until(planner, lambda: disp.goals)  # a waits for the scan's result, KV pinned
    assert engine.pinned_blocks > 0
    assert planner.submit(req("b", "tp;", robot="d2")).accepted
    run_until(planner, lambda: planner.generations["b"].state is not GenState.QUEUED, limit=10)
    planner.step()
    assert planner.engine_healthy and planner.kv_released == 1
    assert planner.generations["b"].state not in (GenState.FAILED, GenState.QUEUED)


def test_engine_refusing_an_add_for_pinned_kv_releases_it_and_retries():
    """The engine refuses to add a generation for memory that suspended generations pin: the
    planner releases the pinned KV and adds it again rather than failing the request."""
    class Tight(SimulatedEngine):
        def add(self, gen_id, prompt_ids, max_tokens):
            if self.pinned_blocks and gen_id == "b":
                raise EngineError(f"generation {gen_id!r} needs more KV blocks; pinned {self.pinned_blocks}")
            return super().add(gen_id, prompt_ids, max_tokens)

    planner, engine, disp, clock = _pinning_planner(make_policy("fcfs-preserve", max_pinned_frac=1.0),
                                                    capacity=2000, engine_cls=Tight)
    assert planner.submit(req("a", "s('cat');g('cat');", robot="d1")).accepted
    run_until(planner, lambda: disp.goals)  # a waits for the scan's result, KV pinned
    assert planner.submit(req("b", "tp;", robot="d2")).accepted
    run_until(planner, lambda: planner.generations["b"].state is not GenState.QUEUED, limit=10)
    b = planner.generations["b"]
    assert b.state is not GenState.FAILED, b.reason
    assert planner.kv_released == 1 and planner.generations["a"].kv_released == 1


# ---------------------------------------------------------------- isolation per request (issue 26)

INNOCENT = "mf(50);tc(90);tp;"


def _serve(planner, disp, clock, done, limit=20_000):
    """Step, acknowledging every dispatched goal OK, until done()."""
    acked = 0
    for _ in range(limit):
        if done():
            return
        while acked < len(disp.goals):
            ok(planner, disp.goals[acked], clock, dur=0.01)
            acked += 1
        planner.step()
    raise AssertionError("condition not reached")


@pytest.mark.parametrize("guilty_plan, reason", [
    ("?" + "&".join(["1"] * 1000) + "{tp;}", "more than 64 operators"),  # a 1,000-long & chain
    ("?" + "(" * 400 + "1" + ")" * 400 + "{tp;}", "nested deeper than 16"),  # deep nesting
    ("1{" * 40 + "tp" + "}" * 40, "blocks nested deeper than 8"),
])
def test_hostile_output_fails_only_its_request_beside_ten_concurrent_ones(guilty_plan, reason):
    """A plan the front end cannot take fails its own request with the true reason; ten requests
    generating in the same engine steps (stream mode: no suspension) all finish their plans."""
    planner, disp, clock = make("vllm-stream", max_tokens=4096)
    assert planner.submit(req("guilty", guilty_plan, robot="evil")).accepted
    guilty = planner.generations["guilty"]
    # the innocents arrive just before the guilty statement closes: their tokens share its steps
    run_until(planner, lambda: len(guilty.text) >= len(guilty_plan) - 12)
    for i in range(10):
        assert planner.submit(req(f"ok{i}", INNOCENT, robot=f"d{i}")).accepted
    planner.step()
    assert guilty.state is GenState.RUNNING and all(planner.generations[f"ok{i}"].output_ids for i in range(10))
    _serve(planner, disp, clock, lambda: all(g.state.terminal for g in planner.generations.values()))
    assert guilty.state is GenState.FAILED and reason in guilty.reason, guilty.reason
    assert not [x for x in disp.goals if x.request_id == "guilty"]  # nothing of it reached a robot
    for i in range(10):
        g = planner.generations[f"ok{i}"]
        assert g.state is GenState.FINISHED, (g.gen_id, g.reason)
        assert [s.text for s in g.segments] == ["mf(50);", "tc(90);", "tp;"]
    assert planner.request_faults == 0  # rejected by the front end, not by an exception


def test_a_fault_on_one_output_loses_no_token_of_the_others_in_the_same_step():
    """An unexpected exception while handling one generation's output (here: its segmenter)
    fails that request with the exception as its reason; the other outputs of the same engine
    step are still recorded, so their plans come out whole."""
    planner, disp, clock = make("vllm-stream")
    for i in range(4):
        assert planner.submit(req(f"r{i}", INNOCENT, robot=f"d{i}")).accepted
    planner.step()
    planner.step()
    live = planner._live["r1"]

    class Exploding:
        def feed(self, text):
            raise RecursionError("injected")

        def finish(self):
            raise RecursionError("injected")

    live.segmenter = Exploding()
    before = {i: len(planner.generations[f"r{i}"].output_ids) for i in range(4)}
    planner.step()  # every generation got a token in this step; r1's raises
    for i in (0, 2, 3):
        assert len(planner.generations[f"r{i}"].output_ids) == before[i] + 1
    bad = planner.generations["r1"]
    assert bad.state is GenState.FAILED
    assert bad.reason == "planner fault while handling its LLM output: RecursionError: injected"
    assert planner.request_faults == 1
    _serve(planner, disp, clock, lambda: all(g.state.terminal for g in planner.generations.values()))
    for i in (0, 2, 3):
        g = planner.generations[f"r{i}"]
        assert g.state is GenState.FINISHED and g.text == INNOCENT, (g.reason, g.text)


def test_a_fault_while_handling_a_result_fails_only_that_request():
    planner, disp, clock = make("vllm-stream")

    class Flaky(PlannerListener):
        def on_segment_result(self, gen, seg):
            if gen.gen_id == "bad":
                raise ValueError("listener broke")

    planner.listeners.append(Flaky())
    for rid in ("bad", "good"):
        planner.submit(req(rid, INNOCENT, robot=rid))
    _serve(planner, disp, clock, lambda: all(g.state.terminal for g in planner.generations.values()))
    assert planner.generations["good"].state is GenState.FINISHED
    bad = planner.generations["bad"]
    assert bad.state is GenState.FAILED and bad.reason == (
        "planner fault while handling segment 0's result: ValueError: listener broke")
    assert "good" not in disp.cancelled


@pytest.mark.parametrize("policy", ["timelyllm", "vllm", "vllm-stream"])
def test_a_plan_cut_by_max_tokens_ends_failed_saying_it_was_truncated(policy):
    """Issue 26: a plan cut by max_tokens used to end FINISHED "plan executed".  What was generated
    before the cut runs (each statement is complete and guarded), then the request ends FAILED with
    a reason saying the plan was truncated; the text at the cut is never dispatched."""
    planner, disp, clock = make(policy, max_tokens=11)
    planner.submit(req("t", "mf(50);tc(90);tp;l('done');"))  # ~20 tokens
    _serve(planner, disp, clock, lambda: planner.generations["t"].state.terminal)
    g = planner.generations["t"]
    assert [x.text for x in disp.goals] == ["mf(50);", "tc(90);"]
    assert g.state is GenState.FAILED
    assert g.reason.startswith("plan truncated at max_tokens (11 tokens): 2 complete statement(s) before the cut, "
                               "the rest ('tp") and g.reason.endswith("-- not the whole plan; the 2 executed")
    # the same plan with room to finish is FINISHED; one cut before its first statement fails at once
    planner, disp, clock = make(policy, max_tokens=64)
    planner.submit(req("t", "mf(50);tc(90);tp;l('done');"))
    _serve(planner, disp, clock, lambda: planner.generations["t"].state.terminal)
    assert planner.generations["t"].state is GenState.FINISHED
    planner, disp, clock = make(policy, max_tokens=3)
    planner.submit(req("t", "mf(50);tc(90);"))
    _serve(planner, disp, clock, lambda: planner.generations["t"].state.terminal)
    g = planner.generations["t"]
    assert g.state is GenState.FAILED and g.reason.startswith("plan truncated at max_tokens (3 tokens): 0 complete")
    assert not disp.goals


def test_a_trailing_statement_cut_by_max_tokens_is_never_dispatched():
    """`tp` at the cut may be the start of `tpx(...)`: only a real end of generation completes a
    statement without ';'."""
    planner, disp, clock = make("vllm-stream", max_tokens=6)
    planner.submit(req("t", "mf(50);tp"))  # 'mf', '(', '50', ')', ';', 'tp': the 6th token is the cut
    _serve(planner, disp, clock, lambda: planner.generations["t"].state.terminal)
    assert [x.text for x in disp.goals] == ["mf(50);"]
    assert planner.generations["t"].state is GenState.FAILED
    planner, disp, clock = make("vllm-stream", max_tokens=64)  # ended by the model: `tp` is a statement
    planner.submit(req("t", "mf(50);tp"))
    _serve(planner, disp, clock, lambda: planner.generations["t"].state.terminal)
    assert [x.text for x in disp.goals] == ["mf(50);", "tp"] and planner.generations["t"].state is GenState.FINISHED


def test_status_accrued_utility_is_eq3_of_every_kept_generation():
    """Issue 25: PlannerStatus.accrued_utility is the whole plan's Eq. 3 score (core/metrics.plan_terms),
    live requests on what they executed so far; an ended one is scored once, again after a late result."""
    from timelyllm_ros.core.metrics import plan_terms

    planner, disp, clock = make()
    assert planner.submit(req("a", "mf(50);tc(90);")).accepted
    assert planner.submit(req("b", "mf(50);tc(90);tp;")).accepted
    run_until(planner, lambda: len(disp.goals) >= 2)
    for goal in list(disp.goals):
        ok(planner, goal, clock, dur=0.5)
    run_until(planner, lambda: any(x.request_id == "b" and x.segment_index == 1 for x in disp.goals))
    planner.cancel("b")  # its second action is out, not reported yet
    run_until(planner, lambda: planner.generations["b"].state.terminal)
    st = planner.status()
    want = sum(plan_terms(g).accrued for g in planner.generations.values())
    assert st.accrued_utility == pytest.approx(want)
    b = planner.generations["b"]
    assert b.segments[0].exec_end is not None and b.segments[1].exec_end is None
    assert plan_terms(b).accrued_max == 2 * b.request.tuf.beta  # ended early: the missing continuation counts
    # a late result of the ended request (its second action ran after all) changes its score
    late = next(x for x in disp.goals if x.request_id == "b" and x.segment_index == 1)
    before = planner.status().accrued_utility
    ok(planner, late, clock, dur=0.5)
    planner.step()
    after = planner.status().accrued_utility
    assert after != before and after == pytest.approx(sum(plan_terms(g).accrued for g in planner.generations.values()))
