"""The vLLM adapter against real vLLM(-cpu): segmented == unsegmented, prefix-cache resumes,
measured stats, clear errors, no tokens after an abort.

One engine serves the whole session (fixture `vllm_engine` in tests/vllm_fixtures.py).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from vllm_fixtures import write_config_only  # the vllm_engine fixture itself comes from conftest.py (one per session)

from timelyllm_ros.core.robots import load_robots
from timelyllm_ros.core.segmenter import Segmenter
from timelyllm_ros.core.tuf import TUF
from timelyllm_ros.engines.tiny_model import build_random_llama, tiny_engine_config, tiny_model
from timelyllm_ros.core.types import PlanRequest
from timelyllm_ros.engines.base import EngineError, EngineOutput
from timelyllm_ros.engines.vllm_engine import IncrementalDetokenizer, VllmEngine
from timelyllm_ros.engines.vllm_stats import DecodeSpeed, free_blocks_from_usage
from timelyllm_ros.prompts import PromptBuilder

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed in this interpreter")

ROBOTS = load_robots()
TASKS = [  # (robot type, task, scene): LRTrace-style requests
    ("tello", "look for the cat", "living room with a sofa, a table and a cat"),
    ("tello", "check for keys or wallets", "hallway with a cabinet, a wallet and a lamp"),
    ("arm", "stack the red block on the blue block", "table with a red block and a blue block"),
]
MAX_TOKENS = 48


def _prompt(engine, robot_type: str, task: str, scene: str) -> list[int]:
    pb = PromptBuilder(ROBOTS, engine.tokenizer)
    req = PlanRequest(request_id="r", robot_id="x", robot_type=robot_type, task=task, scene=scene,
                      tuf=TUF(ert=1.0, alpha=-2.0, beta=1.0), arrival=0.0)
    return pb.prompt_ids(req)


def _run_one(engine, gen_id: str, prompt: list[int], max_tokens: int) -> tuple[list[int], str, list[EngineOutput]]:
    engine.add(gen_id, prompt, max_tokens)
    outs: list[EngineOutput] = []
    while engine.has_unfinished():
        outs += [o for o in engine.step() if o.gen_id == gen_id]
    ids = [t for o in outs for t in o.token_ids]
    return ids, "".join(o.text for o in outs), outs


def _run_segmented(engine, gen_id: str, prompt: list[int], max_tokens: int, boundary):
    """Greedy generation suspended (aborted) whenever `boundary(text_delta)` says a segment
    ended, and resumed from prompt + generated ids.  Returns ids, text, first outputs, boundaries."""
    ids: list[int] = []
    text = ""
    firsts: list[EngineOutput] = []
    resumed_at: list[int] = []  # len(prompt + generated) at each resume
    engine.add(gen_id, prompt, max_tokens)
    expect_first = True
    while engine.has_unfinished():
        for o in engine.step():
            assert o.gen_id == gen_id
            if expect_first:
                assert o.num_cached_tokens is not None, "first output after add must carry num_cached_tokens"
                firsts.append(o)
                expect_first = False
            else:
                assert o.num_cached_tokens is None
            ids += o.token_ids
            text += o.text
            if o.finished:
                break
            if boundary(o.text, len(ids)) and len(ids) < max_tokens:
                engine.abort(gen_id)
                resumed_at.append(len(prompt) + len(ids))
                engine.add(gen_id, prompt + ids, max_tokens - len(ids))
                expect_first = True
    return ids, text, firsts, resumed_at


# -- pure parts (no vLLM needed) ---------------------------------------------------------------

def _bytes_decode(ids: list[int]) -> str:
    """A byte-level 'tokenizer': one token per UTF-8 byte (worst case for held-back text)."""
    return bytes(ids).decode("utf-8", errors="replace")


TEXT = "mf(50); héllo wörld ✓ 日本語; g('猫');"


def test_detokenizer_streams_exact_text():
    ids = list(TEXT.encode())
    d = IncrementalDetokenizer(_bytes_decode, ids[:3])
    parts = [d.push([t]) for t in ids[3:]]
    assert "".join(parts) == TEXT[3:]
    assert not any("\ufffd" in p for p in parts)  # a character is emitted only once complete
    assert d.unread == 0


@pytest.mark.parametrize("cut", range(4, len(TEXT.encode())))
def test_detokenizer_carries_held_bytes_over_a_resume(cut):
    """Suspend after any byte (also inside a character), resume from prompt + generated ids:
    the concatenated text is exactly the unsuspended one."""
    ids = list(TEXT.encode())
    prompt = ids[:3]
    d = IncrementalDetokenizer(_bytes_decode, prompt)
    text = "".join(d.push([t]) for t in ids[3:cut])
    d2 = IncrementalDetokenizer(_bytes_decode, ids[:cut], unread=d.unread)
    text += "".join(d2.push([t]) for t in ids[cut:])
    assert _bytes_decode(prompt) + text == TEXT


def test_decode_speed_and_free_blocks():
    s = DecodeSpeed(alpha=0.5)
    s.update(tokens=4, seqs=4, dt=0.01)  # every sequence advanced 1 token in 10 ms
    assert s.value == pytest.approx(100.0)
    s.update(tokens=2, seqs=2, dt=0.02)
    assert s.value == pytest.approx(75.0)
    s.update(tokens=0, seqs=0, dt=0.01)  # nothing decoded: no sample
    assert s.samples == 2
    assert free_blocks_from_usage(0.25, 100) == 75
    assert free_blocks_from_usage(1.5, 100) == 0


def test_an_add_checks_every_token_id_and_names_the_bad_ones():
    """checked_add (in-process and remote engines): ids must be plain ints in [0, vocab) — a
    bool, a float, a numpy int, a negative or too large id is named; an int subclass is an int."""
    import enum

    import numpy as np

    from timelyllm_ros.engines.vllm_engine import EngineInputError, checked_add

    class Tok(enum.IntEnum):
        A = 3

    def add(ids, vocab=100):
        return checked_add("g", ids, 4, active={}, vocab_size=vocab, max_model_len=64)

    assert add([0, 5, 99]) == ([0, 5, 99], 61)
    assert add([Tok.A, 4]) == ([Tok.A, 4], 62)
    assert add([7, 10**6], vocab=None)[0] == [7, 10**6]
    for ids, named in (([1, True, 2], "[True]"), ([1, 2.0], "[2.0]"), ([np.int64(3)], "[np.int64(3)]"),
                       ([4, -1, 100, 5], "[-1, 100]"), ([1, "2"], "['2']"), ([None], "[None]")):
        with pytest.raises(EngineInputError) as ei:
            add(ids)
        assert str(ei.value) == f"generation 'g': token ids outside [0, 100): {named}"


def test_config_is_validated_before_vllm_starts(tmp_path):
    with pytest.raises(EngineError, match="unknown vLLM engine config keys"):
        VllmEngine({"model": str(tmp_path), "max_num_seq": 4})
    with pytest.raises(EngineError, match="needs `model`"):
        VllmEngine({"dtype": "float32"})
    with pytest.raises(EngineError, match="must be a mapping"):
        VllmEngine(["model"])  # type: ignore[arg-type]


# -- real vLLM -----------------------------------------------------------------------------------

@pytest.mark.vllm
@pytest.mark.parametrize("robot_type,task,scene", TASKS)
def test_segmented_at_statements_equals_unsegmented(vllm_engine, robot_type, task, scene):
    """(a)+(b): suspend at every Segmenter statement boundary, resume from ids: same ids/text,
    and each resume is served from the prefix cache up to its last full block."""
    eng = vllm_engine
    prompt = _prompt(eng, robot_type, task, scene)
    ref_ids, ref_text, _ = _run_one(eng, "ref", prompt, MAX_TOKENS)
    assert ref_ids, "the model generated nothing"

    seg = Segmenter(ROBOTS[robot_type])
    cuts: list = []

    def at_statement(delta: str, n: int) -> bool:
        new = seg.feed(delta)
        cuts.extend(new)
        return bool(new)

    ids, text, firsts, resumed_at = _run_segmented(eng, "seg", prompt, MAX_TOKENS, at_statement)
    assert ids == ref_ids
    assert text == ref_text
    full = eng.tokenizer.decode(ids)  # vLLM holds back a trailing incomplete UTF-8 sequence
    assert full.startswith(text) and set(full[len(text):]) <= {"\ufffd"}
    if not resumed_at:
        pytest.skip(f"{eng.model_label}: no statement boundary in {ref_text!r}; "  # type: ignore[attr-defined]
                    "covered by test_segmented_every_k_tokens_equals_unsegmented")
    assert len(firsts) == len(resumed_at) + 1
    for first, n in zip(firsts[1:], resumed_at):
        assert first.num_cached_tokens >= n - eng.block_size, (n, first.num_cached_tokens)
        assert first.num_cached_tokens <= n


@pytest.mark.vllm
@pytest.mark.parametrize("every", [1, 5, 13])
def test_segmented_every_k_tokens_equals_unsegmented(vllm_engine, every):
    """(a)+(b) independent of the model's output: suspend every k tokens (k=1: every token)."""
    eng = vllm_engine
    prompt = _prompt(eng, "tello", "find a toy under the bed", "bedroom with a bed and a toy")
    ref_ids, ref_text, _ = _run_one(eng, "ref", prompt, 40)
    ids, text, firsts, resumed_at = _run_segmented(
        eng, "seg", prompt, 40, lambda delta, n: n % every == 0)
    assert ids == ref_ids and text == ref_text
    assert len(resumed_at) >= min(len(ref_ids) - 1, 39) // every  # it really was suspended
    for first, n in zip(firsts[1:], resumed_at):
        assert n - eng.block_size <= first.num_cached_tokens <= n


@pytest.mark.vllm
def test_batch_resume_matches_and_new_request_ids(vllm_engine):
    """Several generations in one batch, one of them suspended/resumed repeatedly: each equals
    its solo greedy run, and vLLM request ids are never reused."""
    eng = vllm_engine
    prompts = {f"b{i}": _prompt(eng, rt, t, s) for i, (rt, t, s) in enumerate(TASKS)}
    solo = {g: _run_one(eng, g, p, 24)[0] for g, p in prompts.items()}
    for g, p in prompts.items():
        eng.add(g, p, 24)
    got: dict[str, list[int]] = {g: [] for g in prompts}
    seen_rids: set[str] = {a.request_id for a in eng._active.values()}
    while eng.has_unfinished():
        for o in eng.step():
            got[o.gen_id] += o.token_ids
            if o.gen_id == "b0" and not o.finished and len(got["b0"]) % 4 == 0:
                eng.abort("b0")
                eng.add("b0", prompts["b0"] + got["b0"], 24 - len(got["b0"]))
                rid = eng._active["b0"].request_id
                assert rid not in seen_rids
                seen_rids.add(rid)
    assert got == solo


@pytest.mark.vllm
def test_stats_free_blocks_shrink_while_generating(vllm_engine):
    """(c) KV capacity/usage from vLLM; free blocks drop while generations hold KV, come back
    (as cached-but-free blocks) after they finish; decode speed is measured."""
    eng = vllm_engine
    s0 = eng.stats()
    assert s0.healthy and s0.block_size == 32 and s0.kv_total_blocks > 0
    assert s0.running == 0 and s0.kv_free_blocks == s0.kv_total_blocks
    base = _prompt(eng, "tello", "avoid the human", "corridor with a person walking")
    prompts = {f"s{i}": base + eng.tokenizer.encode(f" variant {i}") * (i + 1) for i in range(4)}
    for g, p in prompts.items():
        eng.add(g, p, 40)
    eng.step()
    s1 = eng.stats()
    assert s1.running == 4
    # at least every request's uncached tail holds a block while it runs
    assert s1.kv_free_blocks <= s0.kv_free_blocks - 4
    while eng.has_unfinished():
        eng.step()
    s2 = eng.stats()
    assert s2.running == 0 and s2.kv_free_blocks == s2.kv_total_blocks
    assert s2.tokens_per_s > 0


@pytest.mark.vllm
def test_abort_then_no_more_outputs(vllm_engine):
    """(e) after abort, nothing more for that id, other generations go on; abort is idempotent."""
    eng = vllm_engine
    p = _prompt(eng, "tello", "look for the cat", "kitchen")
    eng.add("x", p, 40)
    eng.add("y", p + [p[-1]], 40)
    first = eng.step()
    assert {o.gen_id for o in first} == {"x", "y"}
    eng.abort("x")
    eng.abort("x")  # already aborted: no-op
    assert eng.stats().running == 1
    later: list[EngineOutput] = []
    while eng.has_unfinished():
        later += eng.step()
    assert later and all(o.gen_id == "y" for o in later)
    assert later[-1].finished and later[-1].finish_reason in ("length", "stop")
    assert eng.step() == []


@pytest.mark.vllm
def test_bad_calls_are_clear_and_keep_engine_healthy(vllm_engine):
    eng = vllm_engine
    with pytest.raises(EngineError, match="out|outside"):
        eng.add("bad", [eng.vocab_size + 5], 4)
    with pytest.raises(EngineError, match="empty prompt"):
        eng.add("bad", [], 4)
    with pytest.raises(EngineError, match="max_tokens"):
        eng.add("bad", [1, 2], 0)
    with pytest.raises(EngineError, match="no room"):
        eng.add("bad", [2] * eng.max_model_len, 4)
    eng.add("dup", [2, 3, 4], 2)
    with pytest.raises(EngineError, match="already in the engine"):
        eng.add("dup", [2, 3, 4], 2)
    with pytest.raises(EngineError, match="unknown kv mode"):
        eng.abort("dup", kv="bogus")
    eng.abort("dup", kv="preserve")  # not in kv_modes: served as "cache"
    assert "preserve" not in eng.kv_modes and {"cache", "discard"} <= eng.kv_modes
    assert eng.stats().healthy and not eng.has_unfinished()


# -- (d) errors before vLLM starts -------------------------------------------------------------

@pytest.mark.vllm
@needs_vllm
def test_missing_model_path_is_clear(tmp_path):
    with pytest.raises(EngineError, match="does not exist.*build_tiny_model"):
        VllmEngine(tiny_engine_config(tmp_path / "nope"))
    with pytest.raises(EngineError, match="no config.json"):
        VllmEngine(tiny_engine_config(tmp_path))
    write_config_only(tmp_path / "noweights", _any_model_dir(tmp_path))
    with pytest.raises(EngineError, match="no weights"):
        VllmEngine(tiny_engine_config(tmp_path / "noweights"))
    with pytest.raises(EngineError, match="multiple of 32"):
        VllmEngine(tiny_engine_config(_any_model_dir(tmp_path), block_size=16))
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        with pytest.raises(EngineError, match="needs a CUDA or XPU GPU"):
            VllmEngine(tiny_engine_config(_any_model_dir(tmp_path), kv_offloading_size_gib=1))


def _any_model_dir(tmp_path: Path) -> Path:
    d = tmp_path / "cfgsrc"
    if not (d / "config.json").exists():
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"],
                                                   "hidden_size": 256, "num_attention_heads": 4}))
        (d / "model.safetensors").write_bytes(b"")
    return d


@pytest.mark.vllm
@needs_vllm
def test_head_dim_16_model_is_rejected_on_cpu(tmp_path):
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("head_dim 16 is a CPU-backend restriction")
    model = build_random_llama(tmp_path / "hd16", head_dim=16, heads=4, layers=1)
    with pytest.raises(EngineError, match="head_dim 16.*CPU attention backend.*head_dim 64"):
        VllmEngine(tiny_engine_config(model))


@pytest.mark.vllm
@needs_vllm
def test_unloadable_model_is_clear(tmp_path):
    """config.json and a weights file are there but the weights are garbage: vLLM fails to
    load, the adapter says which model and what to do."""
    model = build_random_llama(tmp_path / "broken", layers=1)
    (model / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(EngineError, match="could not load model"):
        VllmEngine(tiny_engine_config(model))


@pytest.mark.vllm
@needs_vllm
def test_worker_death_mid_run_is_engine_error():
    """The model worker dies mid-generation: step() raises EngineError saying to rebuild the
    engine, `healthy` goes false, later calls fail fast.  (Own engine: this one gets killed.)"""
    import os
    import signal
    import time

    model, _ = tiny_model()
    # ignore_eos: the generation must still be running when the worker dies, whatever the model says
    eng = VllmEngine(tiny_engine_config(model, max_num_seqs=2, ignore_eos=True))
    try:
        eng.add("g", eng.tokenizer.encode_prompt("mf(50);tc(90);") * 4, 200)
        eng.step()
        workers = eng.llm_engine.model_executor.workers
        for w in workers:
            os.kill(w.proc.pid, signal.SIGKILL)
        for w in workers:
            w.proc.join(timeout=10)
        deadline = time.monotonic() + 60
        with pytest.raises(EngineError, match="failed during step.*build a new VllmEngine"):
            while time.monotonic() < deadline:
                eng.step()
        assert eng.stats().healthy is False
        with pytest.raises(EngineError, match="failed earlier"):
            eng.add("h", [2, 3], 2)
    finally:
        eng.shutdown()


@pytest.mark.vllm
def test_step_log_records_what_each_iteration_did(vllm_engine):
    """StepRecord (what `timelyllm profile fit --from-serving` and `profile check` read): the first
    iteration after add() is a prefill of the uncached part over the cached part, later ones decode
    one token each with the context growing by one."""
    eng = vllm_engine
    prompt = _prompt(eng, *TASKS[0])
    _run_one(eng, "log-warm", prompt, 4)  # the prompt's full blocks are now cached
    eng.step_log = []
    try:
        _, _, outs = _run_one(eng, "log-a", prompt, 6)
        recs = list(eng.step_log)
    finally:
        eng.step_log = None
    cached = outs[0].num_cached_tokens
    assert cached is not None and cached > 0
    first, rest = recs[0], recs[1:]
    assert (first.seqs, first.adds, first.output_tokens) == (1, 1, 1)
    assert first.prefill_tokens == len(prompt) - cached
    assert first.prefill_context_tokens == cached
    assert first.context_tokens == len(prompt)
    assert len(rest) == 5 and all(r.prefill_tokens == 0 and r.adds == 0 and r.seqs == 1 for r in rest)
    assert [r.context_tokens for r in rest] == [len(prompt) + i for i in range(1, 6)]
    assert all(r.duration_s > 0 and r.post_s >= 0 for r in recs)
    assert all(b.start_s >= a.start_s + a.duration_s for a, b in zip(recs, recs[1:]))


@pytest.mark.vllm
def test_reset_prefix_cache_forgets_cached_prompts(vllm_engine):
    """Benchmarks repeat a workload on one engine; after reset_prefix_cache a prompt the engine
    has seen is computed again (and the reset is refused while a generation is live)."""
    eng = vllm_engine
    prompt = _prompt(eng, *TASKS[1])
    _run_one(eng, "rc-a", prompt, 2)
    assert _run_one(eng, "rc-b", prompt, 2)[2][0].num_cached_tokens > 0
    eng.add("rc-live", prompt, 2)
    with pytest.raises(EngineError, match="live generations"):
        eng.reset_prefix_cache()
    while eng.has_unfinished():
        eng.step()
    eng.reset_prefix_cache()
    assert _run_one(eng, "rc-c", prompt, 2)[2][0].num_cached_tokens == 0
    assert eng.healthy


def test_cpu_without_bf16_hardware_defaults_to_float32():
    """An unset dtype on a CPU that would emulate bf16 becomes float32 (prefill ~5x faster here);
    a configured dtype, or a CPU with bf16 units, is left alone."""
    from timelyllm_ros.engines import vllm_engine as ve

    assert ve.native_bf16("processor: 0\nflags\t\t: fpu sse2 avx2 avx512f\n") is False
    assert ve.native_bf16("flags : fpu avx512f avx512_bf16 amx_tile\n") is True
    assert ve.native_bf16("Features\t: fp asimd bf16 i8mm\n") is True
    assert ve.native_bf16("no flags here") is None
    if not HAVE_VLLM:
        return
    eng = VllmEngine.__new__(VllmEngine)  # only the argument mapping, no engine start
    eng._cpu = True
    eng.scheduling_policy = "fcfs"
    expected = ve.cpu_dtype_default() or "auto"
    eng.config = {"model": "/m"}
    assert eng._engine_args("/m").dtype == expected
    eng.config = {"model": "/m", "dtype": "bfloat16"}
    assert eng._engine_args("/m").dtype == "bfloat16"


@pytest.mark.vllm
def test_engine_reports_the_dtype_it_computes_in(vllm_engine):
    assert vllm_engine.dtype == "float32"  # the test config asks for float32
