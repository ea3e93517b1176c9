"""Simulated engine: latency arithmetic, prefix cache, context-switch modes, memory pressure."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from timelyllm_ros.core.clock import VirtualClock
from timelyllm_ros.core.robots import load_robots
from timelyllm_ros.core.tuf import TUF
from timelyllm_ros.core.types import PlanRequest
from timelyllm_ros.engines.base import EngineError
from timelyllm_ros.engines.simulated import (DEFAULT_PROFILE, KV_MODES, KVCapacityError, LatencyProfile,
                                             ProfileError, SimulatedEngine)
from timelyllm_ros.sim.prompts import SimPromptSource
from timelyllm_ros.core.tokenizer import SimTokenizer

DRONE_PLAN = "s('cat');g('cat');tp;"

# A small profile whose step times are easy to compute by hand.
SMALL = dict(prefill_s_per_token=0.001, prefill_base_s=0.01, decode_base_s=0.02,
             decode_s_per_extra_seq=0.005, decode_s_per_context_token=0.0001,
             kv_block_size=4, kv_capacity_blocks=32, swap_s_per_block=0.003)


def make(**over) -> tuple[VirtualClock, SimulatedEngine]:
    clock = VirtualClock()
    return clock, SimulatedEngine(clock, LatencyProfile(**{**SMALL, **over}))


def ids(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def run_until_done(e: SimulatedEngine, record: dict[str, list[int]] | None = None) -> dict[str, str]:
    """Step until the engine is empty; returns the text each generation produced."""
    text: dict[str, str] = {}
    for _ in range(10_000):
        if not e.has_unfinished():
            return text
        for o in e.step():
            text[o.gen_id] = text.get(o.gen_id, "") + o.text
            if record is not None:
                record.setdefault(o.gen_id, []).extend(o.token_ids)
    raise AssertionError("engine did not finish")


def steps(e: SimulatedEngine, n: int, record: list[int], gen_id: str) -> None:
    for _ in range(n):
        for o in e.step():
            if o.gen_id == gen_id:
                record.extend(o.token_ids)


# ---------------------------------------------------------------- tokeniser

def test_tokenizer_drone_plan_length_and_round_trip() -> None:
    t = SimTokenizer()
    enc = t.encode(DRONE_PLAN)
    assert 15 <= len(enc) <= 20
    assert t.decode(enc) == DRONE_PLAN
    assert t.eos_token_id not in enc and t.decode([t.eos_token_id]) == ""
    # the same text always maps to the same ids; chunks are at most 4 characters
    assert t.encode(DRONE_PLAN) == enc
    assert max(len(p) for p in t.pieces("abcdefghij 123456789 \n\n\n\n\n")) == 4


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=40), max_size=5))
def test_tokenizer_reversible(texts: list[str]) -> None:
    t = SimTokenizer()
    for s in texts:
        assert t.decode(t.encode(s)) == s
    # token-by-token decoding concatenates to the whole (what streaming detokenisation relies on)
    joined = "".join(texts)
    assert "".join(t.decode([i]) for i in t.encode(joined)) == joined


def test_tokenizer_rejects_unknown_ids() -> None:
    t = SimTokenizer()
    t.encode("abc")
    with pytest.raises(ValueError, match="unknown token id"):
        t.decode([99])
    with pytest.raises(ValueError):
        t.decode([-1])


# ---------------------------------------------------------------- profile

def test_default_profile_matches_table1_and_section_4_1() -> None:
    p = LatencyProfile.from_yaml(DEFAULT_PROFILE)
    # Table 1: 2,884-token prompt -> first token in 328.45 ms at batch 1
    assert p.step_s(seqs=1, prefill_tokens=2884, context_tokens=2884) == pytest.approx(0.32845, rel=1e-3)
    # Table 1: ~21.75 ms per decoded token at batch 1
    assert p.step_s(seqs=1, context_tokens=2890) == pytest.approx(0.02175, rel=1e-2)
    # §4.1: 170.35 MB of KV restored from host memory in 9.50 ms (128 KiB per token)
    blocks = 170.35e6 / (p.kv_block_size * 128 * 1024)
    assert blocks * p.swap_s_per_block == pytest.approx(0.0095, rel=2e-2)
    # ~7 GB of KV at 128 KiB/token, 8 ms network latency
    assert p.kv_capacity_blocks * p.kv_block_size * 128 * 1024 / 2**30 == pytest.approx(7.0, rel=0.05)
    assert p.network_latency_s == 0.008


def test_profile_validation(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="missing required"):
        LatencyProfile.from_mapping({"decode_base_s": 0.02})
    with pytest.raises(ProfileError, match="unknown profile keys"):
        LatencyProfile.from_mapping({**SMALL, "decode_ms": 3})
    with pytest.raises(ProfileError, match="prefill_s_per_token"):
        LatencyProfile.from_mapping({**SMALL, "prefill_s_per_token": -1})
    with pytest.raises(ProfileError, match="kv_block_size"):
        LatencyProfile.from_mapping({**SMALL, "kv_block_size": 2.5})
    with pytest.raises(ProfileError, match="kv_capacity_blocks"):
        LatencyProfile.from_mapping({**SMALL, "kv_capacity_blocks": True})
    with pytest.raises(ProfileError, match="decode_base_s must be > 0"):
        LatencyProfile.from_mapping({**SMALL, "decode_base_s": 0})
    with pytest.raises(ProfileError, match="swap_s_per_block"):
        LatencyProfile.from_mapping({**SMALL, "swap_s_per_block": float("nan")})
    with pytest.raises(ProfileError, match="mapping"):
        LatencyProfile.from_mapping([1, 2])
    bad = tmp_path / "bad.yaml"
    bad.write_text("prefill_s_per_token: [unclosed\n")
    with pytest.raises(ProfileError, match="cannot read"):
        LatencyProfile.from_yaml(bad)
    with pytest.raises(ProfileError, match="cannot read"):
        LatencyProfile.from_yaml(tmp_path / "missing.yaml")
    good = tmp_path / "good.yaml"
    good.write_text("".join(f"{k}: {v}\n" for k, v in SMALL.items()))
    assert LatencyProfile.from_yaml(good) == LatencyProfile(**SMALL)


# ---------------------------------------------------------------- latency arithmetic

def test_scaled_profile_multiplies_engine_time_and_keeps_the_rest() -> None:
    p = LatencyProfile.from_yaml(DEFAULT_PROFILE)
    p = dataclasses.replace(p, tokenize_s=4e-5, detokenize_s=2e-6, swap_s_per_block=1e-4, network_latency_s=0.008,
                            add_base_s=8e-4, add_s_per_seq=3e-4)
    half = p.scaled(0.5)
    for kw in ({"seqs": 1}, {"seqs": 7, "context_tokens": 5000}, {"seqs": 3, "prefill_tokens": 400,
               "prefill_context_tokens": 900, "swap_blocks": 2, "new_requests": 3, "adds": 2}):
        assert half.step_s(**kw) == pytest.approx(0.5 * p.step_s(**kw), rel=1e-12)
    assert (half.network_latency_s, half.kv_block_size, half.kv_capacity_blocks, half.host_capacity_blocks) == \
        (p.network_latency_s, p.kv_block_size, p.kv_capacity_blocks, p.host_capacity_blocks)
    assert half.intake_s(2) == pytest.approx(0.5 * (8e-4 + 2 * 3e-4), rel=1e-12)
    assert p.scaled(1.0) == p
    for bad in (0, -1.0, float("inf"), float("nan"), True, "2"):
        with pytest.raises(ProfileError, match="speed factor"):
            p.scaled(bad)  # type: ignore[arg-type]


def test_single_generation_step_times_by_hand() -> None:
    clock, e = make()
    e.set_script("a", "x y")  # 3 tokens, then EOS
    e.add("a", ids(1000, 10), max_tokens=16)
    times, outs = [], []
    while e.has_unfinished():
        before = clock.now()
        outs += e.step()
        times.append(clock.now() - before)
    # prefill: decode_base + ctx*10 + prefill_base + 10*per_token
    assert times[0] == pytest.approx(0.02 + 0.0001 * 10 + 0.01 + 0.001 * 10)
    # decodes: context grows by one token per step
    assert times[1:] == pytest.approx([0.02 + 0.0001 * 11, 0.02 + 0.0001 * 12, 0.02 + 0.0001 * 13])
    assert "".join(o.text for o in outs) == "x y"
    assert outs[0].num_cached_tokens == 0 and all(o.num_cached_tokens is None for o in outs[1:])
    assert outs[-1].finished and outs[-1].finish_reason == "stop"
    assert outs[-1].token_ids == (e.eos_token_id,) and outs[-1].text == ""
    assert not any(o.finished for o in outs[:-1])
    assert e.stats().tokens_per_s == pytest.approx(1 / (0.02 + 0.0001 * 13))
    assert e.counters.prefill_tokens == 10 and e.counters.decode_tokens == 4
    assert e.stats().kv_free_blocks == 32  # finished: blocks freed (cached ones stay evictable)


def test_batch_step_time_and_max_tokens() -> None:
    clock, e = make()
    e.set_script("a", DRONE_PLAN)
    e.set_script("b", DRONE_PLAN)
    e.add("a", ids(1000, 10), max_tokens=3)
    e.add("b", ids(2000, 10), max_tokens=30)
    e.step()
    assert clock.now() == pytest.approx(0.02 + 0.005 + 0.0001 * 20 + 0.01 + 0.001 * 20)
    t = clock.now()
    outs = e.step()
    assert clock.now() - t == pytest.approx(0.02 + 0.005 + 0.0001 * 22)
    assert e.stats().running == 2
    outs = e.step()
    fin = {o.gen_id: o for o in outs}
    assert fin["a"].finished and fin["a"].finish_reason == "length"
    assert not fin["b"].finished
    assert e.stats().running == 1


def test_host_intake_is_charged_for_new_and_resumed_sequences_only() -> None:
    """add_base_s + add_s_per_seq x A before a step that takes in A sequences (new or resumed),
    not for decode steps, and not in record_s (a measured step's duration does not hold it)."""
    clock, e = make(add_base_s=0.5, add_s_per_seq=0.25)
    for g, start in (("a", 1000), ("b", 2000)):
        e.set_script(g, DRONE_PLAN)
        e.add(g, ids(start, 10), max_tokens=30)
    log: list = []
    e.step_log = log
    e.step()
    assert clock.now() == pytest.approx(0.02 + 0.005 + 0.0001 * 20 + 0.01 + 0.001 * 20 + 0.5 + 0.25 * 2)
    t = clock.now()
    e.step()  # decode only: no intake
    assert clock.now() - t == pytest.approx(0.02 + 0.005 + 0.0001 * 22)
    e.abort("a", "cache")
    e.add("a", ids(1000, 10) + [5, 6], max_tokens=30)  # resumed with its generated tokens
    t = clock.now()
    e.step()
    assert log[-1].adds == 1
    assert clock.now() - t == pytest.approx(0.5 + 0.25 + log[-1].duration_s)  # intake, then the iteration
    assert log[-1].start_s == pytest.approx(t + 0.5 + 0.25)
    assert log[-1].duration_s == pytest.approx(e.profile.record_s(log[-1]))  # as a measured StepRecord
    assert log[0].adds == 2 and log[1].adds == 0


def test_tokenize_and_detokenize_costs_are_charged_once() -> None:
    clock, e = make(tokenize_s=0.5, detokenize_s=0.25)
    e.set_script("a", "x y")
    e.add("a", ids(1000, 4), max_tokens=16)
    e.step()
    assert clock.now() == pytest.approx(0.02 + 0.0004 + 0.01 + 0.004 + 0.5 + 0.25)
    e.abort("a")
    t = clock.now()
    e.add("a", ids(1000, 4) + [e.tokenizer.encode("x")[0]], max_tokens=16)  # resume: no re-tokenising
    e.step()
    assert clock.now() - t == pytest.approx(0.02 + 0.0005 + 0.01 + 0.001 * 1 + 0.25)


# ---------------------------------------------------------------- prefix cache

def test_second_request_of_a_type_prefills_only_its_own_part() -> None:
    clock, e = make()
    prefix = ids(500, 12)  # three full blocks
    e.set_script("a", "x")
    e.set_script("b", "y")
    e.add("a", prefix + [2001, 2002], 8)
    first = e.step()[0]
    assert first.num_cached_tokens == 0
    run_until_done(e)
    e.add("b", prefix + [3001, 3002, 3003], 8)
    t = clock.now()
    out = e.step()[0]
    assert out.num_cached_tokens == 12
    assert clock.now() - t == pytest.approx(0.02 + 0.0001 * 15 + 0.01 + 0.001 * 3)
    assert e.counters.cached_tokens == 12


def test_requests_prefilled_in_the_same_step_share_the_prefix() -> None:
    clock, e = make()
    prefix = ids(500, 12)
    e.set_script("a", "x")
    e.set_script("b", "y")
    e.add("a", prefix + [2001, 2002], 8)
    e.add("b", prefix + [3001, 3002, 3003], 8)
    outs = {o.gen_id: o.num_cached_tokens for o in e.step()}
    assert outs == {"a": 0, "b": 12}  # like vLLM, which caches blocks when it schedules them
    assert clock.now() == pytest.approx(0.02 + 0.005 + 0.0001 * (14 + 15) + 0.01 + 0.001 * (14 + 3))
    assert e.counters.prefill_tokens == 17 and e.counters.cached_tokens == 12


def test_concurrent_requests_share_prefix_blocks() -> None:
    _, e = make()
    prefix = ids(500, 12)
    for g in "abc":
        e.set_script(g, DRONE_PLAN)
    e.add("a", prefix + [1], 30)
    e.step()
    free = e.stats().kv_free_blocks  # 32 - 4 (13 tokens)
    e.add("b", prefix + [2], 30)
    e.add("c", prefix + [3], 30)
    # the three full prefix blocks are shared: each later request takes one private block only
    assert e.stats().kv_free_blocks == free - 2
    outs = e.step()
    assert {o.gen_id: o.num_cached_tokens for o in outs if o.num_cached_tokens is not None} == {"b": 12, "c": 12}


def test_fully_cached_prompt_still_computes_its_last_token() -> None:
    _, e = make()
    prefix = ids(500, 12)
    e.set_script("a", "x")
    e.set_script("b", "x")
    e.add("a", prefix, 8)
    run_until_done(e)
    e.add("b", prefix, 8)
    # 12 tokens all cached, but the last one must be computed: only blocks within 11 tokens hit
    assert e.step()[0].num_cached_tokens == 8


# ---------------------------------------------------------------- suspend / resume modes

def _suspend_after(e: SimulatedEngine, mode: str, k: int = 5, max_tokens: int = 64) -> list[int]:
    """Generation a: 14-token prompt, k tokens generated, then aborted with `mode`."""
    e.set_script("a", DRONE_PLAN)
    prompt = ids(500, 12) + [2001, 2002]
    e.add("a", prompt, max_tokens)
    out: list[int] = []
    steps(e, k, out, "a")
    e.abort("a", mode)
    return prompt + out  # what the planner re-adds: prompt ids + generated ids


@pytest.mark.parametrize("mode,cached,prefill", [
    ("cache", 16, 3),  # the 4 full blocks of the 18 computed tokens; the partial block recomputed
    ("preserve", 18, 1),  # everything kept; only the last sampled token is computed
    ("discard", 0, 19),  # dropped from the cache: recompute all
    ("swap", 18, 1),  # full blocks still in the GPU cache, the partial block swapped in
])
def test_resume_cached_tokens_and_latency(mode: str, cached: int, prefill: int) -> None:
    clock, e = make()
    resume = _suspend_after(e, mode)
    assert len(resume) == 19
    assert e.script_position("a") == 5
    swap_out = 5 if mode == "swap" else 0  # the 5 private blocks of a copied to host
    swap_in = 1 if mode == "swap" else 0
    e.add("a", resume, 64)
    t = clock.now()
    out = e.step()[0]
    assert out.num_cached_tokens == cached
    expected = 0.02 + 0.0001 * 19 + 0.01 + 0.001 * prefill + 0.003 * (swap_out + swap_in)
    assert clock.now() - t == pytest.approx(expected)
    assert e.counters.swap_in_blocks == swap_in and e.counters.swap_out_blocks == swap_out
    # the script continues where it stopped
    text = e.tokenizer.decode(resume[14:]) + out.text + "".join(run_until_done(e).values())
    assert text == DRONE_PLAN


@pytest.mark.parametrize("mode", ["cache", "preserve", "discard", "swap"])
def test_stock_engine_serves_every_mode_as_vllm_does(mode: str) -> None:
    """Issue 25: the `stock` engine kind is vLLM as users run it (`VllmEngine.kv_modes`): it
    reports {cache, discard}; an abort frees the KV into the prefix cache whatever the mode (vLLM
    has no per-request eviction, no pinning, no swap without offloading), so a resume gets the
    full blocks back from the prefix cache — 16 of 18 tokens, the partial block recomputed — and
    a mode it lacks is counted as a fallback."""
    clock = VirtualClock()
    e = SimulatedEngine(clock, LatencyProfile(**SMALL), kind="stock")
    assert e.kv_modes == frozenset({"cache", "discard"})
    resume = _suspend_after(e, mode)
    assert e.pinned_blocks == 0 and e.stats().kv_free_blocks == 32
    assert e.counters.kv_fallbacks == (mode in ("preserve", "swap"))
    e.add("a", resume, 64)
    t = clock.now()
    out = e.step()[0]
    assert out.num_cached_tokens == 16
    assert clock.now() - t == pytest.approx(0.02 + 0.0001 * 19 + 0.01 + 0.001 * 3)
    assert e.counters.swap_in_blocks == e.counters.swap_out_blocks == 0
    text = e.tokenizer.decode(resume[14:]) + out.text + "".join(run_until_done(e).values())
    assert text == DRONE_PLAN


def test_engine_kind_is_checked() -> None:
    with pytest.raises(ValueError, match="engine kind 'gpu'"):
        SimulatedEngine(VirtualClock(), LatencyProfile(**SMALL), kind="gpu")
    assert SimulatedEngine(VirtualClock(), LatencyProfile(**SMALL)).kv_modes == KV_MODES  # preserve-capable


def test_preserve_pins_blocks_and_discard_frees_them() -> None:
    _, e = make()
    _suspend_after(e, "preserve")
    assert e.pinned_blocks == 5 and e.stats().kv_free_blocks == 27
    e.abort("a", "discard")  # e.g. the request was cancelled while suspended
    assert e.pinned_blocks == 0 and e.stats().kv_free_blocks == 32
    e.set_script("b", "x")
    e.add("b", ids(500, 12) + [2001, 2002, 9], 8)
    assert e.step()[0].num_cached_tokens == 0  # discard also removed its blocks from the cache


def test_cache_then_discard_drops_the_cached_blocks() -> None:
    _, e = make()
    resume = _suspend_after(e, "cache")
    assert e.suspended_mode("a") == "cache"
    e.abort("a", "discard")  # e.g. its request failed while suspended
    assert e.suspended_mode("a") == "discard"
    e.add("a", resume, 64)
    assert e.step()[0].num_cached_tokens == 0


def test_discard_keeps_prefix_blocks_another_generation_holds() -> None:
    _, e = make()
    e.set_script("b", DRONE_PLAN)
    e.add("b", ids(500, 12) + [7, 7, 7], 64)  # holds the shared 12-token prefix while a is away
    resume = _suspend_after(e, "discard")
    e.add("a", resume, 64)
    outs = {o.gen_id: o for o in e.step()}
    assert outs["a"].num_cached_tokens == 12


def test_swap_after_gpu_copies_were_evicted_restores_all_private_blocks() -> None:
    clock, e = make()
    resume = _suspend_after(e, "swap")
    assert e.host_blocks == 5
    # a big request takes every block: a's GPU copies are evicted
    e.set_script("x", "x")
    e.add("x", ids(9000, 32 * 4), 1)
    assert e.counters.evictions == 4  # a's 4 full cached blocks (the partial one was never cached)
    run_until_done(e)
    e.abort("x", "discard")
    e.add("a", resume, 64)
    t = clock.now()
    out = e.step()[0]
    assert out.num_cached_tokens == 18
    assert e.counters.swap_in_blocks == 5
    assert clock.now() - t == pytest.approx(0.02 + 0.0001 * 19 + 0.01 + 0.001 * 1 + 0.003 * 5)
    assert e.host_blocks == 0


def test_swap_respects_host_capacity() -> None:
    _, e = make(host_capacity_blocks=2)
    _suspend_after(e, "swap")
    assert e.host_blocks == 2 and e.counters.swap_out_blocks == 2


def test_cache_mode_loses_evicted_blocks() -> None:
    _, e = make()
    resume = _suspend_after(e, "cache")
    e.set_script("x", "x")
    e.add("x", ids(9000, 32 * 4), 1)
    run_until_done(e)
    e.abort("x", "discard")
    e.add("a", resume, 64)
    assert e.step()[0].num_cached_tokens == 0


# ---------------------------------------------------------------- memory pressure

def test_lru_eviction_takes_the_oldest_blocks_tail_first() -> None:
    _, e = make()
    for g, base in (("A", 100), ("B", 200)):
        e.set_script(g, "x")
        e.add(g, ids(base, 16), 4)
        run_until_done(e)  # 4 full blocks cached per prompt
    assert e.stats().kv_free_blocks == 32
    # C needs 26 blocks: 24 never-cached blocks first, then the 2 least recently used cached ones
    e.set_script("C", "x y")
    e.add("C", ids(300, 26 * 4), 8)
    assert e.counters.evictions == 2
    e.step()
    e.abort("C", "discard")  # C's blocks go back as never-cached
    e.set_script("A2", "x")
    e.set_script("B2", "x")
    e.add("A2", ids(100, 16), 4)
    e.add("B2", ids(200, 16), 4)
    cached = {o.gen_id: o.num_cached_tokens for o in e.step()}
    # A's last two blocks went first (tail-first release), its first two are still there
    assert cached == {"A2": 8, "B2": 12}


def test_add_beyond_capacity_preempts_the_youngest_running_generation() -> None:
    clock, e = make()
    for g in ("p1", "p2", "p3"):
        e.set_script(g, DRONE_PLAN)
    rec: dict[str, list[int]] = {}
    e.add("p1", ids(1000, 60), 64)
    e.add("p2", ids(2000, 60), 64)
    for o in e.step():
        rec.setdefault(o.gen_id, []).extend(o.token_ids)
    assert e.stats().kv_free_blocks == 2  # 15 + 15 of 32 (61 tokens fit in 16 blocks later)
    e.add("p3", ids(3000, 20), 64)  # needs 5 blocks: p2 (youngest running) is preempted
    assert e.counters.preemptions == 1 and e.preempted == {"p2"}
    assert e.stats().running == 2
    outs = e.step()
    assert {o.gen_id for o in outs} == {"p1", "p3"}
    for o in outs:
        rec.setdefault(o.gen_id, []).extend(o.token_ids)
    run_until_done(e, rec)
    assert e.counters.readmissions == 1
    # p2 carries on exactly where it was preempted: every output is exactly its script
    assert {g: e.tokenizer.decode(r) for g, r in rec.items()} == dict.fromkeys(("p1", "p2", "p3"), DRONE_PLAN)


def test_decode_growth_preempts_the_youngest_and_readmits_it() -> None:
    _, e = make(kv_capacity_blocks=8)
    e.set_script("a", DRONE_PLAN)
    e.set_script("b", DRONE_PLAN)
    e.add("a", ids(1000, 15), 17)  # 15 + 17 tokens: exactly the 8 blocks
    e.add("b", ids(2000, 15), 17)
    rec: dict[str, list[int]] = {}
    for _ in range(2):
        for o in e.step():
            rec.setdefault(o.gen_id, []).extend(o.token_ids)
    assert e.stats().kv_free_blocks == 0
    outs = e.step()  # both need a 5th block: b (youngest) is preempted so a can grow
    assert [o.gen_id for o in outs] == ["a"]
    assert e.preempted == {"b"} and e.counters.preemptions == 1
    for o in outs:
        rec.setdefault(o.gen_id, []).extend(o.token_ids)
    run_until_done(e, rec)
    assert e.tokenizer.decode(rec["a"]) == DRONE_PLAN
    assert e.tokenizer.decode(rec["b"]) == DRONE_PLAN


def test_add_that_cannot_fit_raises_and_changes_nothing() -> None:
    _, e = make(kv_capacity_blocks=8)
    resume = _suspend_after(e, "preserve", max_tokens=18)  # 5 blocks pinned
    before = (e.stats(), e.pinned_blocks)
    e.set_script("b", "x")
    with pytest.raises(KVCapacityError, match="pinned by preserved generations 5"):
        e.add("b", ids(3000, 20), 8)  # needs 5 blocks, 3 free, nothing running to preempt
    assert (e.stats(), e.pinned_blocks) == before
    with pytest.raises(KVCapacityError, match="need 9 KV blocks"):
        e.add("b", ids(3000, 30), 4)  # could never finish, even with the whole cache
    e.add("a", resume, 13)  # the preserved generation is intact
    assert e.step()[0].num_cached_tokens == 18
    assert isinstance(KVCapacityError("x"), EngineError)


# ---------------------------------------------------------------- protocol errors, determinism

def test_bad_calls_give_clear_errors() -> None:
    _, e = make()
    with pytest.raises(ValueError, match="no script"):
        e.add("nope", [1, 2], 4)
    e.set_script("a", "x")
    with pytest.raises(ValueError, match="max_tokens"):
        e.add("a", [1, 2], 0)
    with pytest.raises(ValueError, match="empty"):
        e.add("a", [], 4)
    with pytest.raises(ValueError, match="bad token id"):
        e.add("a", [1, -2], 4)
    e.add("a", [1, 2], 4)
    with pytest.raises(ValueError, match="already in the engine"):
        e.add("a", [1, 2], 4)
    with pytest.raises(ValueError, match="kv mode"):
        e.abort("a", "keep")
    e.step()
    with pytest.raises(ValueError, match="another script"):
        e.set_script("a", "y")
    before = e.stats()
    e.abort("unknown-id")  # aborting what the engine does not hold is a no-op (like vLLM)
    assert e.stats() == before and e.stats().running == 1


def _scenario() -> list[tuple]:
    clock, e = make(kv_capacity_blocks=12)
    trace: list[tuple] = []
    for i in range(6):
        e.set_script(f"g{i}", DRONE_PLAN if i % 2 else "tu(90);mf(100);")
    modes = ["cache", "preserve", "swap", "discard"]
    live: dict[str, list[int]] = {}
    for i in range(3):
        live[f"g{i}"] = ids(500, 12) + [i]
        e.add(f"g{i}", live[f"g{i}"], 30)
    n = 0
    while e.has_unfinished() or n < 3:
        outs = e.step()
        for o in outs:
            live[o.gen_id] = live.get(o.gen_id, []) + list(o.token_ids)
            trace.append((round(clock.now(), 12), o.gen_id, o.token_ids, o.finished, o.num_cached_tokens))
        n += 1
        if n % 3 == 0 and outs and not outs[0].finished:
            g = outs[0].gen_id
            e.abort(g, modes[n % 4])
            e.add(g, live[g], 30 - (len(live[g]) - 13))
        if n == 4:
            for i in range(3, 6):
                live[f"g{i}"] = ids(500, 12) + [i]
                e.add(f"g{i}", live[f"g{i}"], 30)
    trace.append(tuple(sorted(vars(e.counters).items())) if hasattr(e.counters, "__dict__")
                 else tuple((f, getattr(e.counters, f)) for f in e.counters.__slots__))
    return trace


def test_deterministic() -> None:
    a, b = _scenario(), _scenario()
    assert a == b and len(a) > 20


# ---------------------------------------------------------------- random operation sequences

SCRIPTS = [DRONE_PLAN, "tu(90);mf(100);", "x y z", "?iv('book')==True{g('book');tp;}", "l('hi');"]
_OP = st.one_of(
    st.tuples(st.just("add"), st.integers(0, 4)),
    st.tuples(st.just("abort"), st.integers(0, 4), st.sampled_from(["cache", "preserve", "discard", "swap"])),
    st.tuples(st.just("step")),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_OP, max_size=50), st.integers(10, 24))
def test_random_operations_keep_block_accounting_and_scripts(ops: list[tuple], capacity: int) -> None:
    """Whatever the interleaving of adds, suspensions (any mode) and steps under memory pressure,
    the block accounting stays exact and every generation outputs exactly its script."""
    _, e = make(kv_capacity_blocks=capacity, host_capacity_blocks=6)
    gens = [f"g{i}" for i in range(5)]
    record = {g: ids(500, 8) + [900 + i] for i, g in enumerate(gens)}  # shared 8-token prefix
    out: dict[str, list[int]] = {g: [] for g in gens}
    state = dict.fromkeys(gens, "new")
    for g, text in zip(gens, SCRIPTS):
        e.set_script(g, text)

    def apply(op: tuple) -> None:
        if op[0] == "add":
            g = gens[op[1]]
            if state[g] in ("new", "suspended"):
                try:  # 9 + 30 tokens at most: a generation alone always fits in 10 blocks
                    e.add(g, record[g], 30 - len(out[g]))
                    state[g] = "running"
                except KVCapacityError:
                    pass  # refused without side effects (checked by the invariants)
        elif op[0] == "abort":
            g = gens[op[1]]
            if state[g] == "running":
                e.abort(g, op[2])
                state[g] = "suspended"
            elif state[g] == "suspended":
                e.abort(g, op[2])  # re-deciding how a suspended generation's KV is kept
        else:
            try:
                outs = e.step()
            except KVCapacityError:
                return
            for o in outs:
                assert state[o.gen_id] == "running"
                record[o.gen_id] += list(o.token_ids)
                out[o.gen_id] += list(o.token_ids)
                if o.finished:
                    state[o.gen_id] = "done"

    for op in ops:
        apply(op)
        e.check_invariants()
    # drain: give back preserved memory, then finish every generation one after the other
    for g in gens:
        if state[g] == "suspended":
            e.abort(g, "discard")
    for _ in range(1000):
        if not e.has_unfinished():
            break
        apply(("step",))
    for g in gens:
        if state[g] != "done":
            apply(("add", gens.index(g)))
            for _ in range(1000):
                if state[g] == "done":
                    break
                apply(("step",))
        e.check_invariants()
    assert all(v == "done" for v in state.values())
    for g, text in zip(gens, SCRIPTS):
        assert e.tokenizer.decode(out[g]) == text
    assert e.stats().kv_free_blocks == capacity and e.pinned_blocks == 0


# ---------------------------------------------------------------- prompts

def test_prompt_source_shares_prefix_and_registers_scripts() -> None:
    clock = VirtualClock()
    e = SimulatedEngine(clock)
    robots = load_robots()
    src = SimPromptSource(e, robots=robots)
    tuf = TUF(1.0, -2.0, 1.0)
    r1 = PlanRequest("r1", "drone1", "tello", "look for the cat", "a living room with a sofa", tuf, 0.0,
                     reference_plan=DRONE_PLAN)
    r2 = PlanRequest("r2", "drone2", "tello", "find a toy under the bed", "a bedroom", tuf, 0.0,
                     reference_plan="tu(90);mf(100);")
    p1, p2 = src.prompt_ids(r1), src.prompt_ids(r2)
    assert p1[:2850] == p2[:2850] and p1[2850:] != p2[2850:]
    assert 2870 <= len(p1) <= 2900  # ~2,884 tokens as in Table 1
    assert "tello" in e.tokenizer.decode(p1[:50])
    assert src.result_ids(r1, None, True) == []  # type: ignore[arg-type]
    e.add("r1", p1, 64)
    e.add("r2", p2, 64)
    first = e.step()
    # added together, the shared prefix is still computed once (full 16-token blocks of 2,850)
    assert {o.gen_id: o.num_cached_tokens for o in first} == {"r1": 0, "r2": 2848}
    rec = {o.gen_id: list(o.token_ids) for o in first}
    run_until_done(e, rec)
    assert {g: e.tokenizer.decode(r) for g, r in rec.items()} == {"r1": DRONE_PLAN, "r2": "tu(90);mf(100);"}
    arm = PlanRequest("r3", "arm1", "arm", "stack", "", tuf, 0.0, reference_plan="hm;")
    p3 = src.prompt_ids(arm)
    assert p3[:2850] != p1[:2850] and src.prefix_ids("arm") == p3[:2850]  # one prefix per robot type
    with pytest.raises(ValueError, match="reference_plan"):
        src.prompt_ids(PlanRequest("r4", "d", "tello", "t", "", tuf, 0.0))
    with pytest.raises(ValueError, match="prefix_tokens"):
        SimPromptSource(e, prefix_tokens=-1)
    small = SimPromptSource(e, prefix_tokens={"tello": 5})
    assert len(small.prefix_ids("tello")) == 5


def test_full_drone_request_latency_on_default_profile() -> None:
    """End-to-end check of the calibration: one ~2,884-token request, 16-token plan, batch 1."""
    clock = VirtualClock()
    e = SimulatedEngine(clock)
    src = SimPromptSource(e, prefix_tokens=2870)
    r = PlanRequest("r1", "d1", "tello", "look for the cat", "kitchen", TUF(1.0, -2.0, 1.0), 0.0,
                    reference_plan=DRONE_PLAN)
    e.add("r1", src.prompt_ids(r), 64)
    first = e.step()
    t_first = clock.now()
    run_until_done(e)
    n = len(e.tokenizer.encode(DRONE_PLAN)) + 1  # plan + EOS
    assert t_first == pytest.approx(0.3285 + 0.0026, abs=0.003)  # prefill + tokenisation (Table 1)
    per_token = (clock.now() - t_first) / (n - 1)
    assert per_token == pytest.approx(0.02175, rel=0.01)
    assert math.isclose(e.stats().tokens_per_s, 1 / per_token, rel_tol=0.01)
    assert first[0].num_cached_tokens == 0


def test_prefill_context_term_charges_cached_prefix_attention():
    """prefill_s_per_context_token: a prefill step pays for the cached tokens it attends to."""
    from timelyllm_ros.engines.simulated import LatencyProfile

    p = LatencyProfile(prefill_s_per_token=0.001, decode_base_s=0.01, kv_block_size=16,
                       kv_capacity_blocks=100, prefill_base_s=0.005, prefill_s_per_context_token=0.0001)
    # 1 sequence prefilling 10 new tokens over 900 cached ones (no detokenize/tokenize costs set)
    t = p.step_s(seqs=1, prefill_tokens=10, context_tokens=0, prefill_context_tokens=900)
    assert t == pytest.approx(0.01 + 0.005 + 0.001 * 10 + 0.0001 * 900)
    # decode-only steps never pay it
    assert p.step_s(seqs=1, prefill_tokens=0, prefill_context_tokens=900) == pytest.approx(0.01)


def test_step_log_matches_the_charged_time() -> None:
    """StepRecord: the simulator logs each iteration's cost-model inputs, and its duration is
    exactly what the profile charges for them (the same record the vLLM adapter writes)."""
    clock, e = make(tokenize_s=0.002, detokenize_s=0.0005)
    e.step_log = []
    e.set_script("a", DRONE_PLAN)
    e.add("a", ids(100, 10), 3)
    run_until_done(e)
    first, rest = e.step_log[0], e.step_log[1:]
    assert (first.seqs, first.adds, first.prefill_tokens, first.prefill_context_tokens) == (1, 1, 10, 0)
    assert all(r.prefill_tokens == 0 and r.adds == 0 for r in rest) and len(rest) == 2
    for r in e.step_log:
        assert r.duration_s == pytest.approx(e.profile.record_s(r, new_requests=r.adds if r is first else 0))
        assert r.duration_s == pytest.approx(e.profile.step_s(
            seqs=r.seqs, prefill_tokens=r.prefill_tokens, context_tokens=r.context_tokens,
            new_requests=r.adds if r is first else 0, output_tokens=r.output_tokens,
            prefill_context_tokens=r.prefill_context_tokens))
    assert clock.now() == pytest.approx(sum(r.duration_s for r in e.step_log))
    assert [b.start_s for b in rest] == pytest.approx([a.start_s + a.duration_s for a in e.step_log[:-1]])
