"""Simulated LLM engine: vLLM-like continuous batching on a virtual clock.

Why: the scheduling experiments of the paper (RTX 4090, Llama3-8B) cannot run on this machine's
CPU, and a faithful *cost model* is what the scheduler reacts to anyway.  The engine therefore
produces scripted text (`set_script`) but charges each iteration the time a real GPU would take
(`LatencyProfile` in core/latency_profile.py, calibrated in profiles/*.yaml and docs/simulator.md), and
keeps an exact account of KV blocks (`KVAccounting` in kv_cache.py over the block pool of
kv_blocks.py: prefix cache, LRU eviction, recompute-preemption, the four context-switch modes of a
suspended generation).

Pure: no I/O except `LatencyProfile.from_yaml`, and time only from the injected VirtualClock,
which `step()` advances by the modelled iteration latency.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Sequence

from ..core.clock import VirtualClock
from ..core.engine import EngineOutput, EngineStats, StepRecord, Tokenizer
from ..sim.tokenizer import SimTokenizer
from .kv_blocks import _INT_ONLY, _BlockPool, block_hash
from .kv_cache import (_HEADS_MAX, _KNOWN_MAX, ENGINE_KINDS, KV_MODES, EngineKind, KVAccounting, KVCapacityError,
                       _Known, _Seq, _Suspended, engine_kind)
from ..core.latency_profile import DEFAULT_PROFILE, PROFILES_DIR, LatencyProfile, ProfileError

__all__ = ["DEFAULT_PROFILE", "PROFILES_DIR", "ENGINE_KINDS", "KV_MODES", "EngineCounters", "EngineKind",
           "engine_kind", "KVCapacityError",
           "LatencyProfile", "ProfileError", "Scripts", "SimulatedEngine", "block_hash"]


@dataclass
class Scripts:
    """What the simulated LLM generates per generation id, and how far each has got.  Engines of
    one simulated pool share one, so a generation resumed on another engine continues its text."""

    ids: dict[str, list[int]] = field(default_factory=dict)
    pos: dict[str, int] = field(default_factory=dict)
    at: dict[str, list[int]] = field(default_factory=dict)  # sequence index of each script token output
    # token spans [a, b) of the script that are result annotations the model writes itself after a
    # blocking statement (`#True\n`: streaming modes, sim/prompts.py `WrittenResults`); a rewind to
    # a span's start drops it: the planner has put the robot's real result there instead
    notes: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    prompt_len: dict[str, int] = field(default_factory=dict)  # the prompt's length, when set_script was told


# --------------------------------------------------------------------------------------------
# Engine
# --------------------------------------------------------------------------------------------

@dataclass(slots=True)
class EngineCounters:
    """Cumulative figures for metrics (all since construction)."""

    steps: int = 0
    busy_s: float = 0.0  # virtual time spent in steps
    prefill_tokens: int = 0  # prompt tokens actually computed (uncached)
    cached_tokens: int = 0  # prompt tokens served from KV (prefix cache, preserved, swapped in)
    decode_tokens: int = 0  # tokens output
    evictions: int = 0  # cached blocks reclaimed for new allocations
    swap_in_blocks: int = 0
    swap_out_blocks: int = 0
    preemptions: int = 0  # running generations preempted (recompute) for lack of KV blocks
    kv_fallbacks: int = 0  # aborts asking a KV mode this engine kind lacks (served as "cache")
    readmissions: int = 0  # preempted generations brought back


def _intake(batch: list[_Seq]) -> int:
    """Sequences in their first step after add(), new or resumed (a StepRecord's ``adds``, as
    vLLM's log counts them; a sequence re-admitted after the engine's own preemption is not one)."""
    return sum(1 for s in batch if s.prefilling and not s.generated)


class SimulatedEngine(KVAccounting):
    """Engine protocol implementation that scripts its text and models its time and memory.

    Admission is the planner's job; the engine only guards memory: an `add` that cannot get
    blocks evicts cached blocks, then preempts (recompute) the youngest running generation, and
    raises KVCapacityError (changing nothing) if even that cannot make room.

    `scheduling_policy="priority"` is vLLM's priority scheduling instead (`add(..., priority=)`;
    kv_cache.py `_grow_by_priority`): an add waits in the engine's queue, admitted at the next
    step by (priority, arrival) as blocks allow, and a running generation short of a block
    preempts the lowest-priority, latest one.
    """

    def __init__(self, clock: VirtualClock, profile: LatencyProfile | None = None,
                 tokenizer: Tokenizer | None = None, scripts: Scripts | None = None,
                 kind: str | EngineKind = "preserve", scheduling_policy: str = "fcfs") -> None:
        """``kind``: what it can do with a suspended generation's KV (`kv_cache.EngineKind`):
        ``preserve`` (every mode; the default) or ``stock`` (vLLM: cache / discard, no pinning).
        ``scheduling_policy``: vLLM's ``fcfs`` or ``priority`` (waiting queue by priority, arrival)."""
        self.kind = kind if isinstance(kind, EngineKind) else engine_kind(kind)
        self.kv_modes: frozenset[str] = self.kind.kv_modes
        if scheduling_policy not in ("fcfs", "priority"):
            raise ValueError(f"scheduling_policy must be 'fcfs' or 'priority', got {scheduling_policy!r}")
        self.scheduling_policy = scheduling_policy
        self._runs = 0  # priority scheduling: admissions so far (vLLM's running-list order)
        self.clock = clock
        self.profile = profile if profile is not None else LatencyProfile.from_yaml(DEFAULT_PROFILE)
        self.tokenizer: Tokenizer = tokenizer if tokenizer is not None else SimTokenizer()
        self.eos_token_id: int = int(getattr(self.tokenizer, "eos_token_id", 0))
        self.counters = EngineCounters()
        self._bs = self.profile.kv_block_size
        self._pool = _BlockPool(self.profile.kv_capacity_blocks)
        self.scripts = scripts if scripts is not None else Scripts()
        self._scripts = self.scripts.ids
        self._script_pos = self.scripts.pos
        self._seqs: dict[str, _Seq] = {}  # running or waiting (preempted), insertion = admission
        self._suspended: dict[str, _Suspended] = {}
        self._started: set[str] = set()  # gen ids ever added (tokenisation charged once)
        self._known: OrderedDict[str, _Known] = OrderedDict()
        self._heads: dict[tuple[int, ...], _Known] = {}  # first block -> last prompt added with it
        self._host_used = 0
        self._pending_swap_out = 0
        self._order = 0
        self._last_decode_s = 0.0
        self._healthy = True
        self.step_log: list[StepRecord] | None = None  # a list records every iteration

    # --- scripting ----------------------------------------------------------------------------
    def set_script(self, gen_id: str, text: str, notes: Sequence[tuple[int, int]] = (),
                   prompt_len: int | None = None) -> None:
        """What the simulated LLM will generate for gen_id (then EOS).  `notes`: character spans
        of `text` that are result annotations the model writes itself (`Scripts.notes`); each
        piece is tokenised on its own, so a span is whole tokens.  `prompt_len`: the length of
        its prompt; a first add with more ids than that continues the script after them."""
        if not isinstance(text, str):
            raise TypeError(f"script for {gen_id!r} must be a str, got {type(text).__name__}")
        ids: list[int] = []
        spans: list[tuple[int, int]] = []
        done = 0
        for a, b in notes:
            if not done <= a < b <= len(text):
                raise ValueError(f"script note span {(a, b)} of {gen_id!r} is out of order or range")
            ids += self.tokenizer.encode(text[done:a]) if a > done else []
            n = len(ids)
            ids += self.tokenizer.encode(text[a:b])
            spans.append((n, len(ids)))
            done = b
        ids += self.tokenizer.encode(text[done:]) if done < len(text) else []
        if self._script_pos.get(gen_id, 0) > 0 and ids != self._scripts.get(gen_id):
            raise ValueError(f"generation {gen_id!r} already produced tokens of another script")
        self._scripts[gen_id] = ids
        self._script_pos.setdefault(gen_id, 0)
        if spans:
            self.scripts.notes[gen_id] = spans
        else:
            self.scripts.notes.pop(gen_id, None)
        if prompt_len is not None:
            self.scripts.prompt_len[gen_id] = int(prompt_len)

    def _continue(self, gen_id: str, prompt: list[int]) -> None:
        """A first add whose prompt already holds the start of the script after the prompt it was
        told (a planner restarted on its journal resumes from its token record): the script goes
        on after them, as a model continues its context."""
        base = self.scripts.prompt_len.get(gen_id)
        if base is None or len(prompt) <= base or self._script_pos.get(gen_id, 0) or gen_id in self._started:
            return
        done = prompt[base:]
        if done == self._scripts[gen_id][:len(done)]:
            self._script_pos[gen_id] = len(done)
            self.scripts.at[gen_id] = list(range(base, len(prompt)))

    def script_position(self, gen_id: str) -> int:
        """Script tokens already output for gen_id (resumption continues here)."""
        return self._script_pos.get(gen_id, 0)

    def unemit(self, gen_id: str, token: int) -> None:
        """The planner never saw `token`, the last one output for gen_id (an engine pool dropped
        the output of a generation aborted while its step was in flight): its resume must
        generate it again."""
        pos = self._script_pos.get(gen_id, 0)
        if pos > 0 and self._scripts[gen_id][pos - 1] == token:
            self._script_pos[gen_id] = pos - 1
            at = self.scripts.at.get(gen_id)
            if at:
                at.pop()

    def _rewind(self, gen_id: str, prompt: list[int]) -> None:
        """A resume whose prompt no longer holds script tokens this engine output (the planner
        threw them away: a speculated blocking result that was wrong, core/speculation.py) makes
        the script generate them again, as a real model regenerates from the shorter prompt."""
        at = self.scripts.at.get(gen_id)
        if not at:
            return
        script, pos = self._scripts[gen_id], self._script_pos[gen_id]
        was = pos
        while at and pos > 0 and not (at[-1] < len(prompt) and prompt[at[-1]] == script[pos - 1]):
            at.pop()
            pos -= 1
        self._script_pos[gen_id] = pos
        notes = self.scripts.notes.get(gen_id)
        if notes and pos < was:  # rolled back to an annotation the model wrote: the real result replaces it
            for i, (a, b) in enumerate(notes):
                if a == pos:
                    del script[a:b]
                    notes[i:] = [(x - (b - a), y - (b - a)) for x, y in notes[i + 1:]]
                    break

    # --- Engine protocol ----------------------------------------------------------------------
    def add(self, gen_id: str, prompt_ids: Sequence[int], max_tokens: int, priority: int = 0) -> None:
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise ValueError(f"priority must be an int, got {priority!r}")
        if priority and self.scheduling_policy != "priority":  # (VllmEngine: check_priority)
            raise ValueError(f"generation {gen_id!r}: priority {priority} needs scheduling_policy='priority'")
        if gen_id not in self._scripts:
            raise ValueError(f"no script for generation {gen_id!r}: call set_script first")
        if gen_id in self._seqs:
            raise ValueError(f"generation {gen_id!r} is already in the engine")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive int, got {max_tokens!r}")
        prompt = list(prompt_ids)
        if not prompt:
            raise ValueError(f"generation {gen_id!r}: prompt_ids is empty")
        # A resume repeats the prompt already validated for this generation (the planner passes
        # prompt + output so far): only what follows it is checked.  The repeat is recognised by
        # equality, so a value equal to a validated id (True for 1, 5.0 for 5) in that part is not
        # re-checked; it hashes as that id, so the engine's behaviour is the same.
        self._continue(gen_id, prompt)
        self._rewind(gen_id, prompt)
        known = self._known.get(gen_id)
        start = 0
        if known is not None and known.n <= len(prompt) and prompt[:known.n] == known.tokens[:known.n]:
            start = known.n
        rest = prompt[start:] if start else prompt
        # Fast path (C loops): plain non-negative ints.  Anything else (bools, int subclasses, other
        # types, negatives) goes through the per-token check, which names the first bad id.
        if rest and (set(map(type, rest)) != _INT_ONLY or min(rest) < 0):
            for t in rest:
                if isinstance(t, bool) or not isinstance(t, int) or t < 0:
                    raise ValueError(f"generation {gen_id!r}: bad token id {t!r}")
        need_total = self._blocks_for(len(prompt) + max_tokens - 1)
        if need_total > self.profile.kv_capacity_blocks:
            # vLLM refuses prompt + max_tokens beyond max_model_len for the same reason: such a
            # generation could not finish even with the whole cache to itself.
            raise KVCapacityError(
                f"generation {gen_id!r}: {len(prompt)} prompt tokens + max_tokens {max_tokens} need "
                f"{need_total} KV blocks, the engine has {self.profile.kv_capacity_blocks}")
        self._order += 1
        seq = _Seq(gen_id, prompt, len(prompt), max_tokens, self._order,
                   new_request=gen_id not in self._started, priority=priority)
        bs = self._bs
        if start:
            keys = (known.wants, known.hashes, min(len(known.hashes), start // bs))
        else:
            keys = self._shared_keys(prompt)
        if self.scheduling_policy == "priority" and gen_id not in self._suspended:
            # vLLM: add_request puts it in the waiting queue; the next step admits it
            seq.waiting = seq.queued = True
            seq.keys = keys
            self._started.add(gen_id)
            self._seqs[gen_id] = seq
            return
        susp = self._suspended.pop(gen_id, None)
        wants = self._claim_cached(seq, susp, keys)
        try:
            self._allocate_rest(seq, may_preempt=True)
        except KVCapacityError:
            self._release_seq(seq)
            if susp is not None:  # give the suspended KV back untouched
                self._suspended[gen_id] = susp
                self._repin(susp)
            raise
        seq.report_cached = seq.computed
        self.counters.cached_tokens += seq.computed
        self._started.add(gen_id)
        self._seqs[gen_id] = seq
        if self.scheduling_policy == "priority":  # resumed with its suspended KV: running now
            self._runs += 1
            seq.run_order = self._runs
        self._remember(seq, wants)

    def _remember(self, seq: _Seq, wants: list) -> None:
        """What the add of `seq` learnt (its prompt's blocks), for its resume and for later
        prompts with the same head (`_shared_keys`)."""
        gen_id = seq.gen_id  # seq.tokens: the engine's own list, only ever appended to
        kn = self._known[gen_id] = _Known(seq.tokens, seq.num_prompt, wants, list(seq.hashes))
        self._known.move_to_end(gen_id)
        if len(self._known) > _KNOWN_MAX:
            self._known.popitem(last=False)
        if wants:
            head = self._heads
            head.pop(wants[0], None)
            head[wants[0]] = kn
            if len(head) > _HEADS_MAX:
                del head[next(iter(head))]

    def abort(self, gen_id: str, kv: str = "cache") -> None:
        """Suspend gen_id now; its KV is kept according to `kv` (see KV_MODES)."""
        if kv not in KV_MODES:
            raise ValueError(f"unknown kv mode {kv!r}; one of {sorted(KV_MODES)}")
        if kv not in self.kv_modes:  # the engine lacks it: served as "cache" (as VllmEngine.abort)
            self.counters.kv_fallbacks += 1
            kv = "cache"
        if kv == "discard":  # usually the generation's end: forget its prompt (memory)
            self._known.pop(gen_id, None)
            self.scripts.at.pop(gen_id, None)
            if not self.kind.discard_evicts:
                kv = "cache"  # stock vLLM frees the blocks into its prefix cache either way
        seq = self._seqs.pop(gen_id, None)
        if seq is None:
            old = self._suspended.get(gen_id)
            if old is not None and old.mode != kv:
                self._suspended[gen_id] = self._convert(old, kv)
            return
        if seq.waiting:  # preempted: its KV is already back in the prefix cache
            susp = _Suspended("cache", self._chain(seq.tokens[:-1]))
            self._suspended[gen_id] = susp if kv == "cache" else self._convert(susp, kv)
            return
        self._suspended[gen_id] = self._suspend(seq, kv)

    def step(self) -> list[EngineOutput]:
        """One continuous-batching iteration over every running generation."""
        if self.scheduling_policy == "priority":
            # vLLM's order: running first; the waiting queue only if nobody was preempted (or
            # nobody runs any more: vLLM's next, empty-handed step would admit them at no cost)
            if not self._grow_by_priority() or all(s.waiting for s in self._seqs.values()):
                self._admit_by_priority()
        else:
            self._readmit()
            self._grow_for_decode()
        batch = [s for s in self._seqs.values() if not s.waiting]
        for s in batch:
            # vLLM registers blocks when it schedules them: a request prefilled in the same step
            # as an earlier one with the same prefix reuses that prefix instead of computing it.
            if s.prefilling:
                self._upgrade_hits(s)
            self._register_full_blocks(s, len(s.tokens))
        if not batch:
            if any(s.waiting for s in self._seqs.values()):
                raise KVCapacityError(
                    f"no generation can run: {self._pinned_blocks()} KV blocks are pinned by preserved "
                    f"generations and {len(self._seqs)} preempted ones cannot be re-admitted")
            return []
        prefill = sum(len(s.tokens) - s.computed for s in batch if s.prefilling)
        prefill_ctx = sum(s.computed for s in batch if s.prefilling) if prefill else 0
        swap_in = sum(s.swap_in for s in batch)
        swap = swap_in + self._pending_swap_out
        context = sum(len(s.tokens) for s in batch)
        new = sum(1 for s in batch if s.new_request)
        adds = _intake(batch)
        dt = self.profile.step_s(seqs=len(batch), prefill_tokens=prefill, context_tokens=context,
                                 swap_blocks=swap, new_requests=new, prefill_context_tokens=prefill_ctx, adds=adds)
        if self.step_log is not None:  # the intake is host time before the iteration, as vLLM's log has it
            intake = self.profile.intake_s(adds)
            self.step_log.append(StepRecord(
                start_s=self.clock.now() + intake, duration_s=dt - intake, post_s=0.0, seqs=len(batch),
                prefill_tokens=prefill, prefill_context_tokens=prefill_ctx, context_tokens=context,
                adds=adds, output_tokens=len(batch)))
        self.clock.advance(dt)
        self.counters.steps += 1
        self.counters.busy_s += dt
        self.counters.prefill_tokens += prefill
        self.counters.swap_in_blocks += swap_in
        self._pending_swap_out = 0
        if prefill == 0:
            self._last_decode_s = dt
        outputs: list[EngineOutput] = []
        for s in batch:
            s.computed = len(s.tokens)
            s.swap_in = 0
            s.new_request = False
            s.prefilling = False
            outputs.append(self._emit(s))
        self.counters.decode_tokens += len(outputs)
        return outputs

    def has_unfinished(self) -> bool:
        return bool(self._seqs)

    def stats(self) -> EngineStats:
        return EngineStats(
            kv_total_blocks=self.profile.kv_capacity_blocks,
            kv_free_blocks=self._pool.num_free,
            block_size=self._bs,
            running=sum(1 for s in self._seqs.values() if not s.waiting),
            tokens_per_s=(1.0 / self._last_decode_s) if self._last_decode_s > 0 else 0.0,
            healthy=self._healthy,
        )

    def shutdown(self) -> None:
        for gid in list(self._seqs):
            self.abort(gid, "discard")
        for gid in list(self._suspended):
            self.abort(gid, "discard")
        self._suspended.clear()

    # --- extra introspection (metrics, tests) --------------------------------------------------
    @property
    def preempted(self) -> frozenset[str]:
        """Generations the engine preempted for memory and will re-admit by itself."""
        return frozenset(g for g, s in self._seqs.items() if s.waiting)

    @property
    def pinned_blocks(self) -> int:
        return self._pinned_blocks()

    @property
    def host_blocks(self) -> int:
        return self._host_used

    def suspended_mode(self, gen_id: str) -> str | None:
        s = self._suspended.get(gen_id)
        return s.mode if s else None

    def predict_step_s(self) -> float:
        """What the next step would cost if nothing changes before it (for estimators)."""
        batch = [s for s in self._seqs.values() if not s.waiting]
        prefill = sum(len(s.tokens) - s.computed for s in batch if s.prefilling)
        return self.profile.step_s(
            seqs=len(batch), prefill_tokens=prefill, context_tokens=sum(len(s.tokens) for s in batch),
            swap_blocks=sum(s.swap_in for s in batch) + (self._pending_swap_out if batch else 0),
            new_requests=sum(1 for s in batch if s.new_request), adds=_intake(batch))

    # --- internals: output --------------------------------------------------------------------
    def _emit(self, s: _Seq) -> EngineOutput:
        script = self._scripts[s.gen_id]
        pos = self._script_pos[s.gen_id]
        if pos < len(script):
            tok, text = script[pos], self.tokenizer.decode([script[pos]])
            self._script_pos[s.gen_id] = pos + 1
            self.scripts.at.setdefault(s.gen_id, []).append(len(s.tokens))
            reason = ""
        else:
            tok, text, reason = self.eos_token_id, "", "stop"
        s.tokens.append(tok)
        s.generated += 1
        if not reason and s.generated >= s.max_tokens:
            reason = "length"
        cached, s.report_cached = s.report_cached, None
        if reason:
            del self._seqs[s.gen_id]
            self._release_seq(s)  # finished: KV stays in the prefix cache (vLLM)
        return EngineOutput(s.gen_id, (tok,), text, finished=bool(reason), finish_reason=reason,
                            num_cached_tokens=cached)
