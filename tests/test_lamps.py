"""LAMPS: InferCept waste formulas against hand-computed values, the handling choice, the
memory-area ranking, starvation prevention, and the registered policy variants."""

import math

import pytest

from timelyllm_ros.core.exec_time import ExecTimeEstimator
from timelyllm_ros.core.kv_handling import (KVCostModel, SharedPrefix, choose, other_context,
                                            predicted_idle, private_context, waste)
from timelyllm_ros.core.policies import PolicyContext, make_policy, policy_names
from timelyllm_ros.core.policies.lamps import LAMPS
from timelyllm_ros.core.robots import load_robots
from timelyllm_ros.core.tuf import NORMAL
from timelyllm_ros.core.types import Generation, GenState, PlanRequest, Segment
from timelyllm_ros.engines.base import EngineStats

ROBOTS = load_robots()
COST = KVCostModel(prefill_s_per_token=1e-4, prefill_base_s=0.0, swap_s_per_block=1e-4, block_size=16)


def ctx(running=(), iteration=1, G=0.1, token_s=0.02):
    return PolicyContext(estimator=ExecTimeEstimator(ROBOTS), robots=ROBOTS,
                         stats=EngineStats(1000, 1000, 16, 0, 45.0), seg_gen_s=G, token_s=token_s,
                         running=running, iteration=iteration)


_IDS = {}


def gen(rid, prompt=1000, out=0, shared=0, arrival=0.0, segments=()):
    """A generation whose first `shared` prompt tokens are common to all, the rest its own."""
    own = _IDS.setdefault(rid, 100 + len(_IDS))
    g = Generation(request=PlanRequest(rid, "d1", "tello", "t", "s", NORMAL, arrival))
    g.prompt_ids = [5] * shared + [own] * (prompt - shared)
    g.output_ids = [2] * out
    g.segments.extend(segments)
    g.ready_since = arrival
    return g


def seg(est, blocking=True, tokens=8, index=0, end=0.0):
    return Segment(index=index, text="s('x');", calls=(), blocking=blocking, token_count=tokens,
                   gen_start=end - 0.1, gen_end=end, est_exec_s=est, dispatched_at=end)


# ------------------------------------------------------------------ the formulas
def test_waste_hand_computed():
    # C_i = 1000, C_other = 3000, T_INT = 2 s
    w = waste(2.0, 1000, 3000, COST)
    assert w.preserve == pytest.approx(2.0 * 1000)  # T_INT * C_i
    assert w.discard == pytest.approx(0.1 * 1000 + 0.1 * 3000)  # T_fwd = 1e-4 * 1000 = 0.1 s
    assert w.swap == pytest.approx(2 * (63 * 1e-4) * 4000)  # ceil(1000/16) = 63 blocks
    assert w.best() == "swap"
    assert w.best(["preserve", "discard"]) == "discard"


def test_choice_by_call_length():
    # discard beats preserve once T_INT * C_i > T_fwd * (C_i + C_other): T* = 0.1 * 4000 / 1000 = 0.4 s
    no_swap = ("preserve", "discard")
    assert choose(0.39, 1000, 3000, COST, no_swap)[0] == "preserve"
    assert choose(0.41, 1000, 3000, COST, no_swap)[0] == "discard"
    # swap waste 50.4 token-s: preserve wins only below T = 50.4 / 1000 = 0.0504 s
    assert choose(0.05, 1000, 3000, COST)[0] == "preserve"
    assert choose(0.051, 1000, 3000, COST)[0] == "swap"
    # short context, long call, costly swap: discard (paper: long call + short context -> discard)
    slow_swap = KVCostModel(prefill_s_per_token=1e-4, swap_s_per_block=1e-2, block_size=16)
    assert choose(5.0, 50, 100, slow_swap)[0] == "discard"
    # ties go to the least work: zero-length call
    assert choose(0.0, 1000, 0, COST)[0] == "preserve"


def test_cost_model_from_profile_and_validation():
    from timelyllm_ros.engines.simulated import LatencyProfile
    p = LatencyProfile.from_yaml()
    c = KVCostModel.from_profile(p)
    assert c.prefill_s_per_token == p.prefill_s_per_token and c.block_size == p.kv_block_size
    assert c.t_swap(17) == pytest.approx(2 * p.swap_s_per_block)
    assert KVCostModel.from_profile({"prefill_s_per_token": 2e-4, "kv_block_size": 32}).block_size == 32
    with pytest.raises(ValueError):
        KVCostModel(prefill_s_per_token=-1)
    with pytest.raises(ValueError):
        waste(-1, 1, 1, COST)


def test_private_context_and_idle():
    g = gen("a", prompt=3000, out=40, shared=2805)
    assert private_context(g) == 3040  # no tracker: the whole context
    sp = SharedPrefix(block_size=16)
    assert private_context(g, sp) == 3040  # one prompt seen: nothing known to be shared
    h = gen("h", prompt=2900, shared=2805)
    sp.observe(h)
    assert sp.shared("tello") == 2800  # common prefix 2805, rounded down to full blocks
    assert private_context(g, sp) == 240
    assert other_context(g, [g, h, gen("b", prompt=500)], sp) == 100 + 500  # b differs at token 0
    assert sp.shared("tello") == 0
    assert predicted_idle(seg(3.0, blocking=True), 0.1) == 3.0
    assert predicted_idle(seg(3.0, blocking=False), 0.1) == pytest.approx(2.9)
    assert predicted_idle(seg(0.05, blocking=False), 0.1) == 0.0
    assert predicted_idle(None, 0.1) == 0.0


# ------------------------------------------------------------------ kv_mode of the policies
def test_kv_mode_uses_estimated_execution_and_batch():
    p = LAMPS(cost=COST)
    g = gen("a", prompt=1000)
    others = [gen("b", prompt=3000)]
    assert p.kv_mode(g, seg(2.0), ctx(running=others)) == "swap"
    p2 = LAMPS(cost=COST, allowed=("preserve", "discard"))
    assert p2.kv_mode(g, seg(2.0), ctx(running=others)) == "discard"
    assert p2.kv_mode(g, seg(0.3), ctx(running=others)) == "preserve"
    # the planner passes an empty running list at suspension: the last batch seen is used
    p2.select([], others, ctx(running=others), 0.0)
    assert p2.kv_mode(g, seg(0.41), ctx(running=())) == "discard"
    assert g.policy.lamps.kv_modes == {"swap": 1, "discard": 2, "preserve": 1}


@pytest.mark.parametrize("name,mode", [("fcfs-preserve", "preserve"), ("fcfs-discard", "discard"),
                                       ("fcfs-swap", "swap")])
def test_fixed_handling_baselines(name, mode):
    p = make_policy(name)
    assert p.kv_mode(gen("a"), seg(100.0), ctx()) == mode
    assert p.kv_mode(gen("a"), seg(0.0), ctx()) == mode


def test_registered_variants():
    names = policy_names()
    for n in ("lamps", "infercept", "fcfs-preserve", "fcfs-discard", "fcfs-swap", "timelyllm-lamps"):
        assert n in names
    tl = make_policy("timelyllm-lamps", cost=COST)
    g = gen("a", prompt=1000)
    assert tl.kv_mode(g, seg(2.0), ctx(running=[gen("b", prompt=3000)])) == "swap"
    # TimelyLLM priority is unchanged
    assert tl.priority(g, ctx(), 0.2) == make_policy("timelyllm").priority(g, ctx(), 0.2)
    with pytest.raises(ValueError):
        make_policy("lamps", starvation_threshold=0)
    with pytest.raises(ValueError):
        make_policy("lamps", allowed=("keep",))


# ------------------------------------------------------------------ ranking
def test_area_hand_computed():
    p = LAMPS(cost=COST, allowed=("preserve",))
    robot = ROBOTS["tello"]
    g = gen("a", prompt=100)  # new: n = max_segment_tokens, T = mean nominal skill time
    n = robot.max_segment_tokens
    T = sum(s.exec_time.nominal() for s in robot.skills.values()) / len(robot.skills)
    expected = 0.02 * (n * 100 + n * (n + 1) / 2) + (100 + n) * T
    assert p.area(g, ctx()) == pytest.approx(expected)
    # after a discarded segment of 8 tokens with E = 2 s: resume recompute + n = 8, T = 2
    h = gen("b", prompt=100, out=8, segments=[seg(2.0, tokens=8)])
    h.policy.lamps.kv = "discard"
    expected = 108 * COST.t_fwd(108) + 0.02 * (8 * 108 + 36) + 116 * 2.0
    assert p.area(h, ctx()) == pytest.approx(expected)


def test_ranking_prefers_small_memory_area():
    short_ctx = gen("small", prompt=200, arrival=5.0)
    long_ctx = gen("big", prompt=4000, arrival=0.0)
    long_call = gen("slow", prompt=200, arrival=1.0, out=8, segments=[seg(30.0, tokens=8)])
    ready = [long_ctx, long_call, short_ctx]
    # preserve only: the 30 s call pins 208 tokens for 30 s -> the largest area
    sel = LAMPS(cost=COST, allowed=("preserve",)).select(ready, [], ctx(), 10.0)
    assert [g.gen_id for g in sel.order] == ["small", "big", "slow"]
    # with swap available the long call costs only two copies: its shorter segment (8 tokens)
    # now ranks first - a longer job with memory-friendly handling goes ahead (paper §3.2.2)
    sel = LAMPS(cost=COST).select(ready, [], ctx(), 10.0)
    assert [g.gen_id for g in sel.order] == ["slow", "small", "big"]
    fc = make_policy("infercept", cost=COST).select(ready, [], ctx(), 10.0)
    assert [g.gen_id for g in fc.order] == ["big", "slow", "small"]


def test_starvation_counter_threshold_and_reset():
    p = LAMPS(cost=COST, starvation_threshold=3)
    big = gen("big", prompt=5000)
    for it in range(1, 4):  # ready in iterations 1..3 behind fresh small ones: counter 0, 1, 2
        small = [gen(f"s{it}{i}", prompt=100, arrival=1.0) for i in range(2)]
        sel = p.select([big] + small, [], ctx(iteration=it), 1.0)
        assert sel.order[-1] is big and not big.policy.lamps.starving
    small = [gen(f"s4{i}", prompt=100, arrival=1.0) for i in range(2)]
    sel = p.select([big] + small, [], ctx(iteration=4), 1.0)  # counter 3 = threshold
    assert big.policy.lamps.starving and sel.order[0] is big
    assert not any(s.policy.lamps.starving for s in small)
    # a gap (it ran or waited on a call) resets a non-starving counter
    s = small[0]
    p.select([s], [], ctx(iteration=5), 1.0)
    assert p.wait_count(s) == 1
    p.select([s], [], ctx(iteration=10), 1.0)
    assert p.wait_count(s) == 0
    # starving stays until completion, even after running in between
    assert p.select([big] + small, [], ctx(iteration=21), 1.0).order[0] is big
    # without the threshold being reached nothing is promoted (default 100)
    q = LAMPS(cost=COST)
    for it in range(1, 100):
        q.select([big2 := gen("big2", prompt=5000)] if it == 1 else [big2], [], ctx(iteration=it), 1.0)
    assert q.wait_count(big2) == 98 and not big2.policy.lamps.starving
    q.select([big2], [], ctx(iteration=101), 1.0)  # gap at 100: reset
    assert q.wait_count(big2) == 0


def test_jit_resume_holds_nonblocking_until_action_end():
    p = LAMPS(cost=COST)
    s0 = seg(5.0, blocking=False, end=0.0)
    g = gen("a", prompt=100, out=8, segments=[s0])
    g.state = GenState.SUSPENDED
    assert p.select([g], [], ctx(G=0.1), 1.0).order == []  # action ends at 5.0
    assert p.select([g], [], ctx(G=0.1, iteration=2), 4.95).order == [g]  # within G of the end
    assert LAMPS(cost=COST, jit_resume=False).select([g], [], ctx(), 1.0).order == [g]
    b = gen("b", prompt=100, out=8, segments=[seg(5.0, blocking=True, end=0.0)])
    b.state = GenState.SUSPENDED  # returned from a blocking call: runs at once
    assert p.select([b], [], ctx(), 1.0).order == [b]


@pytest.mark.parametrize("small", [True, False])
def test_jit_resume_reads_the_measured_end(small):
    """An executor result that moves the action's end without new output (the generation's
    slot is not refilled) holds from the next point on: the planner marks it (`touch`), and the
    few-generations path, which keeps the end until then, reads it again; so does the numpy one."""
    p = LAMPS(cost=COST)
    if not small:
        p.small_n = 0
    s0 = seg(5.0, blocking=False, end=0.0)
    g = gen("jit-measured", prompt=100, out=8, segments=[s0])
    g.state = GenState.SUSPENDED
    assert p.select([g], [], ctx(G=0.1), 1.0).order == []  # estimated end: 5.0
    s0.exec_start, s0.exec_end = 0.0, 1.2  # measured: it ended at 1.2
    g.touch()
    assert p.select([g], [], ctx(G=0.1, iteration=2), 1.1).order == [g]  # within G of the end
    assert p.select([g], [], ctx(G=0.1, iteration=3), 1.0).order == []


# ------------------------------------------------------------------ in the simulator
@pytest.mark.parametrize("policy", ["lamps", "infercept", "fcfs-preserve", "fcfs-discard", "timelyllm-lamps"])
def test_simulated_toolbot_run_every_request_terminal(policy):
    """A short memory-pressured run (1,024 KV blocks) ends with every request terminal and, for the
    waste-based policies, shows the handling choices the model predicts (preserve short calls,
    swap long ones)."""
    import dataclasses
    from pathlib import Path

    from timelyllm_ros.core.planner import PlannerConfig
    from timelyllm_ros.workloads.format import load_workload
    from timelyllm_ros.sim.lamps_workload import load_toolbot
    from timelyllm_ros.sim.runner import run_simulation

    root = Path(__file__).resolve().parents[1]
    prof = root / "profiles" / "lamps_small_kv.yaml"
    robot, catalog = load_toolbot()
    wl = dataclasses.replace(load_workload(root / "workloads" / "lamps_single.yaml"), duration_s=8.0)
    params = {"profile": str(prof)} if policy in ("lamps", "infercept", "timelyllm-lamps") else {}
    r = run_simulation(wl, policy, max_batch=256, robots={"toolbot": robot}, catalog=catalog,
                       profile_path=prof, policy_params=params, config=PlannerConfig(max_tokens=4096))
    assert r.generations and all(g.state.terminal for g in r.generations)
    assert all(g.state is GenState.FINISHED for g in r.generations), [g.reason for g in r.generations]
    modes = {}
    for g in r.generations:
        for k, v in g.policy.lamps.kv_modes.items():
            modes[k] = modes.get(k, 0) + v
    if policy == "fcfs-discard":
        assert set(modes) == {"discard"}
    elif policy != "fcfs-preserve":
        # math/VE calls (< 0.1 s) are preserved, chatbot/image/TTS (17-29 s) swapped
        assert modes.get("preserve", 0) > 0 and modes.get("swap", 0) > 0
        for g in r.generations:
            m = g.policy.lamps.kv_modes
            if g.request.task_type in ("S_chatbot", "S_image", "S_tts"):
                assert "swap" in m


def test_memory_admission_cut():
    """Admit in order while private context + one segment of growth fits the free blocks (after
    reserving a segment for each running generation); a preserved generation needs only growth."""
    from timelyllm_ros.engines.base import EngineStats
    p = LAMPS(cost=COST)
    a, b, c = gen("ca", prompt=320), gen("cb", prompt=640), gen("cc", prompt=160)  # 20, 40, 10 blocks
    run = [gen("cr", prompt=16)]
    seg_b = math.ceil(ROBOTS["tello"].max_segment_tokens / 16)  # 1 block of growth each
    c_ = PolicyContext(estimator=ExecTimeEstimator(ROBOTS), robots=ROBOTS,
                       stats=EngineStats(1000, 60 + seg_b, 16, 1, 45.0), seg_gen_s=0.1, token_s=0.02)
    assert p.admission_cut([a, b, c], run, c_) == [a]  # 60 free after reserving: a (21) fits, b (41) not
    assert p.admission_cut([a, c, b], run, c_) == [a, c]  # strict order stops at b
    b.segments.append(seg(1.0))
    b.policy.lamps.kv = "preserve"  # KV pinned: only growth needed
    assert p.admission_cut([a, b, c], run, c_) == [a, b, c]
    # with nothing running the head is always offered (the engine decides if it really fits)
    tiny = PolicyContext(estimator=ExecTimeEstimator(ROBOTS), robots=ROBOTS,
                         stats=EngineStats(1000, 5, 16, 0, 45.0), seg_gen_s=0.1, token_s=0.02)
    assert p.admission_cut([a, c], [], tiny) == [a]
    assert LAMPS(cost=COST, memory_admission=False).select([a, b, c], run, c_, 0.0).order


@pytest.mark.parametrize("small", [True, False])
def test_released_kv_needs_its_blocks_at_the_next_point(small):
    """Preserved KV released between two points (`on_kv_released`: no new output, so the ready
    list and its sched_rev stay) counts at the next one: the generation needs blocks for its
    context again, on both paths (neither reuses the last point's slots)."""
    from timelyllm_ros.engines.base import EngineStats
    p = LAMPS(cost=COST)
    if not small:
        p.small_n = 0
    g = gen("released", prompt=1000, out=8, segments=[seg(0.5)])  # 63 blocks of private context
    g.state = GenState.SUSPENDED
    g.policy.lamps.kv = "preserve"
    run = [gen("released-run", prompt=16)]
    seg_b = math.ceil(ROBOTS["tello"].max_segment_tokens / 16)

    def c_(it):
        return PolicyContext(estimator=ExecTimeEstimator(ROBOTS), robots=ROBOTS,
                             stats=EngineStats(1000, 2 * seg_b + 10, 16, 1, 45.0), seg_gen_s=0.1, token_s=0.02,
                             running=run, iteration=it)

    assert p.select([g], run, c_(1), 1.0).order == [g]  # preserved: one segment of growth fits
    assert p.select([g], run, c_(2), 1.0).order == [g]
    p.on_kv_released(g)
    assert p.select([g], run, c_(3), 1.0).order == []  # 63 more blocks do not
