"""vllm-priority on real vLLM(-cpu): the engine started with scheduling_policy="priority" orders its
own waiting queue by the priorities the adapter and the planner give it.

Read on vLLM's own scheduler (`VllmEngine.scheduler_queues`: its `running` list and its waiting
queue in admission order), never on the planner's bookkeeping.  vLLM 0.32 (scheduler.py
`Scheduler.schedule`): the waiting loop stops at `len(self.running) >= max_num_active_reqs`
(max_num_seqs), so a waiting urgent request does not displace a running one; the waiting queue
is `PriorityRequestQueue` (a heap by `Request.__lt__`: priority, arrival_time, request_id), so
the urgent one added last is admitted first when a slot frees.

Preemption (`Scheduler.schedule`'s running loop): a running request that cannot get a block
preempts `max(self.running, key=lambda r: (r.priority, r.arrival_time))` — the normal request,
even when it is the older one; FCFS would take `self.running.pop()`, the urgent one admitted last.
The same trace on the simulated engine preempts the same request.

One engine of its own for this module (~20-60 s to start): max_num_seqs 2, priority scheduling,
9 KV blocks of 32 tokens (`num_gpu_blocks_override`, so memory runs out within a few hundred
tokens), max_model_len 288.
"""

from __future__ import annotations

import importlib.util
import os
import time
from typing import Iterator

import pytest

from timelyllm_ros.core.clock import WallClock
from timelyllm_ros.core.exec_time import ExecTimeEstimator
from timelyllm_ros.core.planner import Planner
from timelyllm_ros.core.policies import make_policy
from timelyllm_ros.core.robots import load_robots
from timelyllm_ros.core.tuf import NORMAL, URGENT
from timelyllm_ros.core.types import GenState, PlanRequest
from timelyllm_ros.engines.tiny_model import tiny_engine_config, tiny_model
from timelyllm_ros.engines.vllm_engine import EngineInputError, check_priority

pytestmark = pytest.mark.vllm
HAVE_VLLM = importlib.util.find_spec("vllm") is not None
ROBOTS = load_robots()


@pytest.fixture(scope="module")
def prio_engine() -> Iterator[object]:
    if not HAVE_VLLM:
        pytest.skip("vLLM is not installed in this interpreter")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from timelyllm_ros.engines.vllm_engine import VllmEngine

    model, _ = tiny_model()
    eng = VllmEngine(tiny_engine_config(model, max_num_seqs=2, scheduling_policy="priority", ignore_eos=True,
                                   max_model_len=288, engine_args={"num_gpu_blocks_override": 10}))
    assert (eng.kv_total_blocks, eng.block_size) == (9, 32)
    try:
        yield eng
    finally:
        eng.shutdown()


def _ids(engine, text: str) -> list[int]:
    return engine.tokenizer.encode_prompt(text)


def _drain(engine) -> None:
    for _ in range(500):
        if not engine.has_unfinished():
            return
        engine.step()
    raise AssertionError("engine did not drain")


def test_priority_needs_priority_scheduling() -> None:
    check_priority("g", 0, "fcfs")
    check_priority("g", 3, "priority")
    with pytest.raises(EngineInputError, match="needs the engine started with scheduling_policy: priority"):
        check_priority("g", 1, "fcfs")
    with pytest.raises(EngineInputError, match="priority must be an int"):
        check_priority("g", True, "priority")


def test_urgent_added_later_is_served_before_a_waiting_normal_one(prio_engine) -> None:
    e = prio_engine
    assert e.scheduling_policy == "priority"
    e.add("n1", _ids(e, "look for the cat"), 6, priority=1)  # ends first: frees one slot
    e.add("n2", _ids(e, "look for the dog"), 60, priority=1)
    e.step()
    assert e.scheduler_queues() == (["n1", "n2"], [])
    e.add("n3", _ids(e, "look for the keys"), 6, priority=1)
    e.add("u", _ids(e, "look for the fire"), 6, priority=0)  # urgent, added after n3
    e.step()
    running, waiting = e.scheduler_queues()
    assert running == ["n1", "n2"]  # a full batch (max_num_seqs 2) is not displaced
    assert waiting == ["u", "n3"]  # vLLM's heap: priority first, then arrival
    sched = e._scheduler()
    assert {e.gen_of(r.request_id): r.priority for r in sched.waiting} == {"u": 0, "n3": 1}
    for _ in range(100):
        running, waiting = e.scheduler_queues()
        if "u" in running or "n3" in running:
            break
        e.step()
    assert "u" in running and "n3" not in running and waiting == ["n3"]  # u took n1's slot
    _drain(e)


def test_kv_shortage_preempts_the_normal_request_on_vllm_and_in_the_simulator(prio_engine) -> None:
    """n1 (normal) runs, u (urgent) is added one step later; prompts of 60 tokens, 200 tokens
    each: 2 x 9 blocks wanted, 9 there.  When a block is missing, vLLM preempts n1 (priority 1)
    although u is the younger; the simulated engine in priority mode, on the same trace, too."""
    from timelyllm_ros.core.clock import VirtualClock
    from timelyllm_ros.engines.simulated import LatencyProfile, SimulatedEngine

    e = prio_engine
    prompts = {g: e.tokenizer.encode_prompt(text * 20)[:60]
               for g, text in (("n1", "look for the cat "), ("u", "fire in the hall "))}
    sim = SimulatedEngine(VirtualClock(), LatencyProfile(prefill_s_per_token=1e-4, decode_base_s=0.01,
                                                         kv_block_size=32, kv_capacity_blocks=9),
                          scheduling_policy="priority")
    for g in prompts:
        sim.set_script(g, "go on. " * 120)  # > 200 tokens: runs until max_tokens, as ignore_eos
    trace: dict[str, tuple] = {}
    for name, eng in (("vllm", e), ("sim", sim)):
        eng.add("n1", prompts["n1"], 200, priority=1)
        eng.step()
        eng.add("u", prompts["u"], 200, priority=0)
        for _ in range(150):
            eng.step()
            if name == "vllm":
                sched = e._scheduler()
                pre = {e.gen_of(r.request_id) for r in sched.requests.values()
                       if r.num_preemptions and e.gen_of(r.request_id)}
                running = e.scheduler_queues()[0]
            else:
                pre = set(sim.preempted)
                running = [g for g, s in sim._seqs.items() if not s.waiting]
            if pre:
                trace[name] = (pre, running)
                break
        for g in ("n1", "u"):
            eng.abort(g)
    assert trace["vllm"] == ({"n1"}, ["u"]), trace
    assert trace["sim"] == trace["vllm"]
    _drain(e)


class _ShortPrompts:
    """The task text alone as the prompt (this engine's max_model_len is 288)."""

    def __init__(self, tokenizer) -> None:
        self.tok = tokenizer

    def prompt_ids(self, request) -> list[int]:
        return self.tok.encode_prompt(request.task)

    def result_ids(self, request, segment, value) -> list[int]:
        return self.tok.encode(f" ->{value};")


def test_planner_passes_the_policy_priorities_to_vllm(prio_engine) -> None:
    """vllm-priority through the planner on the same engine: vLLM's requests carry priority 0
    for the urgent request and 1 for the normal one (read on vLLM's scheduler)."""
    e = prio_engine
    policy = make_policy("vllm-priority")

    class Dispatcher:
        def dispatch(self, goal) -> None: ...

        def cancel(self, request_id) -> None: ...

    p = Planner(clock=WallClock(), engine=e, dispatcher=Dispatcher(), robots=ROBOTS, policy=policy,
                estimator=ExecTimeEstimator(ROBOTS), prompts=_ShortPrompts(e.tokenizer))
    p.use_batching(None, 2)
    now = p.clock.now()
    for rid, tuf, cat in (("pn", NORMAL, "normal"), ("pu", URGENT, "urgent")):
        assert p.submit(PlanRequest(rid, f"r-{rid}", "tello", "find the cat", "cat, sofa", tuf, now,
                                    category=cat)).accepted
    p.step()
    sched = e._scheduler()
    got = {e.gen_of(r.request_id): r.priority for r in sched.running}
    assert got == {"pn": 1, "pu": 0}
    for rid in ("pn", "pu"):
        p.cancel(rid)
    for _ in range(50):
        p.step()
        if all(g.state in (GenState.CANCELLED, GenState.FINISHED, GenState.FAILED) for g in p.generations.values()):
            break
    _drain(e)


# ------------------------------------------------------------------ remote `vllm serve` (OpenAI API)

@pytest.fixture(scope="module")
def prio_server() -> Iterator[object]:
    """One `vllm serve --scheduling-policy priority --max-num-seqs 2` (~50 s to start, ~3 GB), in
    vLLM's dev mode for its `/pause?mode=keep` and `/resume` endpoints (the test freezes the
    scheduler while it queues requests)."""
    if not HAVE_VLLM:
        pytest.skip("vLLM is not installed in this interpreter")
    from timelyllm_ros.engines.vllm_server import VllmServer

    model, _ = tiny_model()
    server = VllmServer(model, max_num_seqs=2, scheduling_policy="priority",
                        env={"VLLM_SERVER_DEV_MODE": "1"})
    try:
        server.start()
        server.wait_ready()
        yield server
    finally:
        server.kill()


def _server_queue(url: str) -> tuple[int | None, int | None]:
    """(running, waiting) requests in the server's /metrics (its scheduler's last report)."""
    from urllib.request import urlopen

    from timelyllm_ros.engines.openai_remote import parse_metrics

    with urlopen(url.removesuffix("/v1") + "/metrics", timeout=30) as r:
        m = parse_metrics(r.read().decode())
    return m.running, m.waiting


def _server_post(url: str, path: str) -> None:
    from urllib.request import Request, urlopen

    with urlopen(Request(url.removesuffix("/v1") + path, data=b"", method="POST"), timeout=60) as r:
        assert r.status == 200, (path, r.status)


def test_remote_server_serves_the_urgent_request_first(prio_server) -> None:
    """The same trace over the OpenAI API. Two long normal requests hold both slots; the server's
    scheduler is frozen (`/pause?mode=keep`), a normal request and then an urgent one are sent,
    and one long request is aborted. The server's /metrics then shows the three left waiting
    (n2, n3, u). On `/resume` the scheduler alone picks who runs: by (priority, arrival) that
    is u and n2, so the urgent request, sent last, streams before the normal n3 sent before it
    (FCFS would run n2 and n3).

    The scheduler is frozen because a race decided the earlier forms of this test: on this
    2-core machine vLLM's front end can wait seconds for the CPU while the model generates, and
    a slot freed before the urgent request reached the scheduler (CI, 2026-11-27)."""
    from timelyllm_ros.engines.openai_remote import RemoteVllmEngine

    url = prio_server.url
    e = RemoteVllmEngine({"url": url, "scheduling_policy": "priority", "ignore_eos": True})
    try:
        assert e.scheduling_policy == "priority"
        first: list[str] = []

        def note_first_tokens() -> None:
            for o in e.step():
                if o.token_ids and o.gen_id not in first:
                    first.append(o.gen_id)

        def wait_for(cond, what: str, tries: int = 3000) -> None:
            for _ in range(tries):
                note_first_tokens()
                if cond():
                    return
            raise AssertionError(f"never saw {what}; server queue {_server_queue(url)}, first tokens {first}")

        e.add("n1", _ids(e, "look for the cat"), 1900, priority=1)
        e.add("n2", _ids(e, "look for the dog"), 1900, priority=1)
        wait_for(lambda: {"n1", "n2"} <= set(first), "n1 and n2 streaming")
        _server_post(url, "/pause?mode=keep")
        try:
            e.add("n3", _ids(e, "look for the keys"), 8, priority=1)
            e.add("u", _ids(e, "look for the fire"), 8, priority=0)
            idle_until = time.monotonic() + 1.0  # the server is idle: both reach its scheduler
            while time.monotonic() < idle_until:
                note_first_tokens()
            e.abort("n1")  # the scheduler reports its queue again
            wait_for(lambda: _server_queue(url) == (0, 3), "n2, n3 and u waiting in the frozen scheduler")
            assert sorted(first) == ["n1", "n2"]  # neither later request has run
        finally:
            _server_post(url, "/resume")
        wait_for(lambda: {"u", "n3"} <= set(first), "u and n3 streaming after /resume")
        assert first.index("u") < first.index("n3"), first
        e.abort("n2")
        with pytest.raises(EngineInputError, match="priority must be an int"):
            e.add("x", _ids(e, "x"), 2, priority=0.5)
    finally:
        e.shutdown()
