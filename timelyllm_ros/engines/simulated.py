"""Simulated LLM engine: vLLM-like continuous batching and paged KV memory on a virtual clock.

Why: the scheduling experiments of the paper (RTX 4090, Llama3-8B) cannot run on this machine's
CPU, and a faithful *cost model* is what the scheduler reacts to anyway.  The engine therefore
produces scripted text (`set_script`) but charges each iteration the time a real GPU would take
(`LatencyProfile`, calibrated in profiles/*.yaml and docs/simulator.md), and keeps an exact
account of KV blocks: a prefix cache keyed by chained block hashes (vLLM's automatic prefix
caching: full blocks only), LRU eviction of unreferenced cached blocks, recompute-preemption of
the youngest running generation when memory runs out, and the four context-switch modes of a
suspended generation (cache / preserve / discard / swap, see LAMPS/InferCept).

Pure: no I/O except `LatencyProfile.from_yaml`, and time only from the injected VirtualClock,
which `step()` advances by the modelled iteration latency.
"""

from __future__ import annotations

import math
import operator
from collections import OrderedDict, deque
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from ..core.clock import VirtualClock
from ..sim.tokenizer import SimTokenizer
from .base import EngineError, EngineOutput, EngineStats, StepRecord, Tokenizer

PROFILES_DIR = Path(__file__).resolve().parents[2] / "profiles"
DEFAULT_PROFILE = PROFILES_DIR / "rtx4090_llama3_8b.yaml"
KV_MODES = frozenset({"cache", "preserve", "discard", "swap"})


class ProfileError(ValueError):
    """A latency profile is malformed; the message names the field."""


class KVCapacityError(EngineError):
    """A generation cannot get KV blocks even after evicting and preempting everything allowed."""


# --------------------------------------------------------------------------------------------
# Latency profile
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class LatencyProfile:
    """Cost model of one engine iteration (seconds) and the KV memory it runs in.

    step time = decode_base_s + decode_s_per_extra_seq * (seqs - 1)
                + decode_s_per_context_token * (context tokens of all seqs in the step)
                + [prefill_base_s + prefill_s_per_token * P   if P > 0 uncached prompt tokens
                   + prefill_s_per_context_token * (cached tokens those prefills attend to)]
                + swap_s_per_block * (blocks copied host<->GPU for this step)
                + tokenize_s * (new requests) + detokenize_s * (tokens output)
    Every sequence in the step yields one token (a prefill yields the first token, as in
    Table 1's "Decoding 0 token").
    """

    prefill_s_per_token: float
    decode_base_s: float  # one decode iteration at batch 1, context excluded
    kv_block_size: int  # tokens per KV block
    kv_capacity_blocks: int  # GPU KV blocks
    prefill_base_s: float = 0.0  # fixed cost of an iteration that prefills (launch, scheduling)
    prefill_s_per_context_token: float = 0.0  # a prefill's attention over its cached prefix
    decode_s_per_extra_seq: float = 0.0  # batch scaling: each extra sequence in the iteration
    decode_s_per_context_token: float = 0.0  # attention: KV read per context token per sequence
    swap_s_per_block: float = 0.0  # host<->GPU copy of one block (either direction)
    host_capacity_blocks: int | None = None  # host (CPU) blocks for swapped KV; None = unbounded
    network_latency_s: float = 0.0  # per dispatched segment (used by robots/runner, not here)
    tokenize_s: float = 0.0  # tokenising one new request's prompt (charged once per request)
    detokenize_s: float = 0.0  # per output token
    name: str = ""
    description: str = ""

    _REQUIRED = ("prefill_s_per_token", "decode_base_s", "kv_block_size", "kv_capacity_blocks")

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in ("name", "description"):
                if not isinstance(v, str):
                    raise ProfileError(f"profile {f.name} must be a string, got {v!r}")
                continue
            if f.name in ("kv_block_size", "kv_capacity_blocks", "host_capacity_blocks"):
                if v is None and f.name == "host_capacity_blocks":
                    continue
                if isinstance(v, bool) or not isinstance(v, int) or v < (0 if f.name == "host_capacity_blocks" else 1):
                    raise ProfileError(f"profile {f.name} must be a positive integer, got {v!r}")
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ProfileError(f"profile {f.name} must be a finite number >= 0, got {v!r}")
        if self.decode_base_s <= 0:
            raise ProfileError("profile decode_base_s must be > 0 (a step must take time)")

    # --- loading --------------------------------------------------------------------------
    @classmethod
    def from_mapping(cls, data: Any, source: str = "<profile>") -> "LatencyProfile":
        if not isinstance(data, Mapping):
            raise ProfileError(f"{source}: a latency profile must be a mapping, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ProfileError(f"{source}: unknown profile keys {unknown}; known: {sorted(known)}")
        missing = [k for k in cls._REQUIRED if k not in data]
        if missing:
            raise ProfileError(f"{source}: missing required profile keys {missing}")
        try:
            return cls(**dict(data))
        except ProfileError as e:
            raise ProfileError(f"{source}: {e}") from None

    @classmethod
    def from_yaml(cls, path: str | Path = DEFAULT_PROFILE) -> "LatencyProfile":
        path = Path(path)
        try:
            data = yaml.safe_load(path.read_text())
        except OSError as e:
            raise ProfileError(f"{path}: cannot read latency profile: {e.strerror or e}") from e
        except yaml.YAMLError as e:
            from ..core.robots import yaml_error_line

            raise ProfileError(f"{path}{yaml_error_line(e, 'cannot read latency profile: not valid YAML')}") from e
        return cls.from_mapping(data, str(path))

    # --- cost model -------------------------------------------------------------------------
    def record_s(self, r: StepRecord, *, new_requests: int = 0) -> float:
        """What this profile charges for the iteration a StepRecord describes (profile fitting
        and fidelity checks compare it with the measured time)."""
        return self.step_s(seqs=r.seqs, prefill_tokens=r.prefill_tokens, context_tokens=r.context_tokens,
                           new_requests=new_requests, output_tokens=r.output_tokens,
                           prefill_context_tokens=r.prefill_context_tokens)

    def step_s(self, *, seqs: int, prefill_tokens: int = 0, context_tokens: int = 0,
               swap_blocks: int = 0, new_requests: int = 0, output_tokens: int | None = None,
               prefill_context_tokens: int = 0) -> float:
        """Modelled duration of one iteration (see the class docstring)."""
        if seqs <= 0 and prefill_tokens <= 0 and swap_blocks <= 0:
            return 0.0
        t = 0.0
        if seqs > 0:
            t += self.decode_base_s + self.decode_s_per_extra_seq * (seqs - 1)
            t += self.decode_s_per_context_token * context_tokens
        if prefill_tokens > 0:
            t += self.prefill_base_s + self.prefill_s_per_token * prefill_tokens
            t += self.prefill_s_per_context_token * prefill_context_tokens
        t += self.swap_s_per_block * swap_blocks
        t += self.tokenize_s * new_requests
        t += self.detokenize_s * (seqs if output_tokens is None else output_tokens)
        return t


# --------------------------------------------------------------------------------------------
# KV block pool with a prefix cache
# --------------------------------------------------------------------------------------------

_ROOT_HASH = 0x7131E11  # parent "hash" of the first block of every sequence
_INT_ONLY = {int}
_BLOCK_TOKENS = operator.attrgetter("tokens")
_BLOCK_PARENT = operator.attrgetter("parent")


def block_hash(parent: int, tokens: Sequence[int]) -> int:
    """Chained hash of a full block (vLLM: hash(parent_hash, block token ids)).

    Python's hash of a tuple of ints is stable across processes (PYTHONHASHSEED only salts
    str/bytes), so runs are reproducible.
    """
    return hash((parent, tuple(tokens)))


@dataclass(slots=True)
class _Block:
    bid: int
    ref: int = 0
    hash: int | None = None  # registered in the prefix cache
    parent: int = 0
    tokens: tuple[int, ...] = ()  # content of a registered block (guards against hash collisions)


class _BlockPool:
    """Fixed pool of KV blocks: free unhashed blocks, an LRU of free cached blocks, refcounts."""

    def __init__(self, n: int) -> None:
        self.blocks = [_Block(i) for i in range(n)]
        self.free_plain: deque[int] = deque(range(n))
        self.free_cached: OrderedDict[int, None] = OrderedDict()  # oldest first
        self.by_hash: dict[int, int] = {}
        self.evictions = 0

    @property
    def num_free(self) -> int:
        return len(self.free_plain) + len(self.free_cached)

    def lookup(self, parent: int, tokens: tuple[int, ...]) -> int | None:
        h = block_hash(parent, tokens)
        bid = self.by_hash.get(h)
        if bid is None:
            return None
        b = self.blocks[bid]
        return bid if (b.parent == parent and b.tokens == tokens) else None

    def take(self, bid: int) -> None:
        """Reference a block (a cache hit or a block kept by its owner)."""
        b = self.blocks[bid]
        if b.ref == 0:
            if b.hash is not None:
                self.free_cached.pop(bid, None)
            else:  # a private block given back and taken again (undo of a failed add)
                self.free_plain.remove(bid)
        b.ref += 1

    def allocate(self) -> int | None:
        """A fresh block: an unhashed free one first, else evict the least recently used cached one."""
        if self.free_plain:
            bid = self.free_plain.popleft()
        elif self.free_cached:
            bid, _ = self.free_cached.popitem(last=False)
            self._unregister(self.blocks[bid])
            self.evictions += 1
        else:
            return None
        self.blocks[bid].ref = 1
        return bid

    def release(self, bid: int, *, drop: bool = False) -> None:
        """Drop one reference; an unreferenced block stays cached (LRU) unless `drop` or unhashed."""
        b = self.blocks[bid]
        if b.ref <= 0:
            raise EngineError(f"KV block {bid} released more often than taken")
        b.ref -= 1
        if b.ref:
            return
        if drop and b.hash is not None:
            self._unregister(b)
        if b.hash is not None:
            self.free_cached[bid] = None
            self.free_cached.move_to_end(bid)
        else:
            self.free_plain.append(bid)

    def release_all(self, bids: Sequence[int], *, drop: bool = False) -> None:
        """`release` of each block in order (the loop inlined: a suspension releases ~180)."""
        blocks, free_cached = self.blocks, self.free_cached
        for bid in bids:
            b = blocks[bid]
            ref = b.ref
            if ref <= 0:
                raise EngineError(f"KV block {bid} released more often than taken")
            b.ref = ref - 1
            if ref > 1:
                continue
            if b.hash is not None:
                if drop:
                    self._unregister(b)
                    self.free_plain.append(bid)
                else:
                    free_cached[bid] = None
                    free_cached.move_to_end(bid)
            else:
                self.free_plain.append(bid)

    def register(self, bid: int, parent: int, tokens: tuple[int, ...]) -> None:
        """Publish a full, computed block in the prefix cache (first writer wins, like vLLM)."""
        b = self.blocks[bid]
        if b.hash is not None:
            return
        h = block_hash(parent, tokens)
        if h in self.by_hash:
            return
        b.hash, b.parent, b.tokens = h, parent, tokens
        self.by_hash[h] = bid

    def drop(self, bid: int) -> None:
        """Remove an unreferenced block from the prefix cache (its content is no longer wanted)."""
        b = self.blocks[bid]
        if b.ref == 0 and b.hash is not None:
            self.free_cached.pop(bid, None)
            self._unregister(b)
            self.free_plain.append(bid)

    def _unregister(self, b: _Block) -> None:
        if b.hash is not None and self.by_hash.get(b.hash) == b.bid:
            del self.by_hash[b.hash]
        b.hash, b.parent, b.tokens = None, 0, ()


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
    readmissions: int = 0  # preempted generations brought back


@dataclass(slots=True)
class _Seq:
    gen_id: str
    tokens: list[int]  # prompt (as given to add) + tokens generated since
    num_prompt: int
    max_tokens: int
    order: int  # admission order; the largest is the youngest
    blocks: list[int] = field(default_factory=list)
    hashes: list[int] = field(default_factory=list)  # chained hashes of full computed blocks
    registered: int = 0  # leading full blocks already offered to the prefix cache
    computed: int = 0  # tokens whose KV is in `blocks`
    generated: int = 0  # tokens output since add
    report_cached: int | None = None  # num_cached_tokens for the first output
    new_request: bool = False  # first add of this gen id: charge tokenisation
    swap_in: int = 0  # blocks to copy from host in the next step
    prefilling: bool = True  # the next step computes its uncached prompt tokens
    waiting: bool = False  # preempted by the engine, waiting to be re-admitted


@dataclass(slots=True)
class _Suspended:
    """KV left behind by an aborted generation."""

    mode: str
    hashes: list[int]  # chain hashes of its full blocks (to drop them from the cache on discard)
    tokens: list[int] = field(default_factory=list)  # preserve: tokens covered by `pinned`
    pinned: list[int] = field(default_factory=list)  # preserve: block ids still referenced
    host: dict[int, tuple[int, ...]] = field(default_factory=dict)  # swap: block index -> tokens


@dataclass(slots=True)
class _Known:
    """What add() learnt about a generation's last prompt, so that its resume (the same prompt
    plus a few tokens) neither re-validates nor re-hashes the shared part: `tokens[:n]` passed
    validation, and `wants`/`hashes` are the contents and chain hashes of its leading full blocks
    (`tokens` is the engine's own token list, which is only ever appended to)."""

    tokens: list[int]
    n: int
    wants: list[tuple[int, ...]]
    hashes: list[int]


_KNOWN_MAX = 1024  # generations remembered (LRU); a forgotten one is validated and hashed in full


class SimulatedEngine:
    """Engine protocol implementation that scripts its text and models its time and memory.

    Admission is the planner's job; the engine only guards memory: an `add` that cannot get
    blocks evicts cached blocks, then preempts (recompute) the youngest running generation, and
    raises KVCapacityError (changing nothing) if even that cannot make room.
    """

    kv_modes = KV_MODES

    def __init__(self, clock: VirtualClock, profile: LatencyProfile | None = None,
                 tokenizer: Tokenizer | None = None) -> None:
        self.clock = clock
        self.profile = profile if profile is not None else LatencyProfile.from_yaml(DEFAULT_PROFILE)
        self.tokenizer: Tokenizer = tokenizer if tokenizer is not None else SimTokenizer()
        self.eos_token_id: int = int(getattr(self.tokenizer, "eos_token_id", 0))
        self.counters = EngineCounters()
        self._bs = self.profile.kv_block_size
        self._pool = _BlockPool(self.profile.kv_capacity_blocks)
        self._scripts: dict[str, list[int]] = {}
        self._script_pos: dict[str, int] = {}
        self._seqs: dict[str, _Seq] = {}  # running or waiting (preempted), insertion = admission
        self._suspended: dict[str, _Suspended] = {}
        self._started: set[str] = set()  # gen ids ever added (tokenisation charged once)
        self._known: OrderedDict[str, _Known] = OrderedDict()
        self._host_used = 0
        self._pending_swap_out = 0
        self._order = 0
        self._last_decode_s = 0.0
        self._healthy = True
        self.step_log: list[StepRecord] | None = None  # a list records every iteration

    # --- scripting ----------------------------------------------------------------------------
    def set_script(self, gen_id: str, text: str) -> None:
        """What the simulated LLM will generate for gen_id (then EOS)."""
        if not isinstance(text, str):
            raise TypeError(f"script for {gen_id!r} must be a str, got {type(text).__name__}")
        ids = self.tokenizer.encode(text)
        if self._script_pos.get(gen_id, 0) > 0 and ids != self._scripts.get(gen_id):
            raise ValueError(f"generation {gen_id!r} already produced tokens of another script")
        self._scripts[gen_id] = ids
        self._script_pos.setdefault(gen_id, 0)

    def script_position(self, gen_id: str) -> int:
        """Script tokens already output for gen_id (resumption continues here)."""
        return self._script_pos.get(gen_id, 0)

    # --- Engine protocol ----------------------------------------------------------------------
    def add(self, gen_id: str, prompt_ids: Sequence[int], max_tokens: int) -> None:
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
                   new_request=gen_id not in self._started)
        susp = self._suspended.pop(gen_id, None)
        keys = (known.wants, known.hashes, min(len(known.hashes), start // self._bs)) if start else None
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
        self._known[gen_id] = _Known(prompt, len(prompt), wants, list(seq.hashes))
        self._known.move_to_end(gen_id)
        if len(self._known) > _KNOWN_MAX:
            self._known.popitem(last=False)

    def abort(self, gen_id: str, kv: str = "cache") -> None:
        """Suspend gen_id now; its KV is kept according to `kv` (see KV_MODES)."""
        if kv not in KV_MODES:
            raise ValueError(f"unknown kv mode {kv!r}; one of {sorted(KV_MODES)}")
        if kv == "discard":  # usually the generation's end: forget its prompt (memory)
            self._known.pop(gen_id, None)
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
        dt = self.profile.step_s(seqs=len(batch), prefill_tokens=prefill, context_tokens=context,
                                 swap_blocks=swap, new_requests=new, prefill_context_tokens=prefill_ctx)
        if self.step_log is not None:
            self.step_log.append(StepRecord(
                start_s=self.clock.now(), duration_s=dt, post_s=0.0, seqs=len(batch),
                prefill_tokens=prefill, prefill_context_tokens=prefill_ctx, context_tokens=context,
                adds=sum(1 for s in batch if s.prefilling), output_tokens=len(batch)))
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

    def check_invariants(self) -> None:
        """Raise AssertionError if the block accounting is inconsistent (tests, debugging)."""
        pool = self._pool
        holders: dict[int, int] = {}
        for s in self._seqs.values():
            assert not (s.waiting and s.blocks), f"{s.gen_id}: preempted but holds blocks"
            assert len(s.blocks) >= self._blocks_for(s.computed), f"{s.gen_id}: KV without blocks"
            for bid in s.blocks:
                holders[bid] = holders.get(bid, 0) + 1
        for susp in self._suspended.values():
            for bid in susp.pinned:
                holders[bid] = holders.get(bid, 0) + 1
        plain, cached = set(pool.free_plain), set(pool.free_cached)
        assert len(plain) == len(pool.free_plain), "a block is twice in the free list"
        assert not plain & cached, "a block is in both free lists"
        for b in pool.blocks:
            assert b.ref == holders.get(b.bid, 0), f"block {b.bid}: ref {b.ref} != holders {holders.get(b.bid, 0)}"
            free = b.bid in plain or b.bid in cached
            assert free == (b.ref == 0), f"block {b.bid}: ref {b.ref} but free={free}"
            assert (b.bid in cached) == (b.ref == 0 and b.hash is not None), f"block {b.bid}: wrong free list"
            if b.hash is not None:
                assert pool.by_hash.get(b.hash) == b.bid, f"block {b.bid}: hash not indexed"
        assert len(pool.by_hash) == sum(1 for b in pool.blocks if b.hash is not None)
        assert self._host_used == sum(len(x.host) for x in self._suspended.values())

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
            new_requests=sum(1 for s in batch if s.new_request))

    # --- internals: output --------------------------------------------------------------------
    def _emit(self, s: _Seq) -> EngineOutput:
        script = self._scripts[s.gen_id]
        pos = self._script_pos[s.gen_id]
        if pos < len(script):
            tok, text = script[pos], self.tokenizer.decode([script[pos]])
            self._script_pos[s.gen_id] = pos + 1
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

    # --- internals: blocks --------------------------------------------------------------------
    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self._bs)

    def _pinned_blocks(self) -> int:
        return sum(len(s.pinned) for s in self._suspended.values())

    def _claim_cached(self, seq: _Seq, susp: _Suspended | None,
                      keys: tuple[list[tuple[int, ...]], list[int], int] | None = None) -> list[tuple[int, ...]]:
        """Reuse what KV exists for seq.tokens: preserved blocks, prefix-cache hits, host copies.

        At most len(tokens) - 1 tokens are reused: the last prompt token must be computed to get
        the next token's logits (vLLM does the same).  `keys` = (contents, chain hashes, k): the
        first k full blocks of seq.tokens are known to have these (a resume's shared part).
        Returns the contents of the full blocks whose hashes were appended to seq.hashes.
        """
        known_w, known_h, k = keys if keys is not None else ((), (), 0)
        wants: list[tuple[int, ...]] = []
        bs, toks, pool = self._bs, seq.tokens, self._pool
        limit = len(toks) - 1
        pinned = list(susp.pinned) if susp and susp.mode == "preserve" else []
        host = susp.host if susp and susp.mode == "swap" else {}
        old = susp.tokens if susp else []
        parent = _ROOT_HASH
        j = 0
        # 1. the generation's own preserved blocks (a prefix of its KV)
        while j < len(pinned) and j * bs < limit:
            lo, hi = j * bs, min((j + 1) * bs, limit)
            want = tuple(toks[lo:(j + 1) * bs])
            full = len(want) == bs and (j + 1) * bs <= limit
            have = len(old) - lo
            n = min(have, hi - lo)
            if n > 0 and old[lo:lo + n] == list(toks[lo:lo + n]):
                b = pool.blocks[pinned[j]]
                if not (n < bs and (b.hash is not None or b.ref > 1)):  # else: a shared block, recompute
                    seq.blocks.append(pinned[j])
                    pinned[j] = -1  # ownership moves to seq (its reference is reused)
                    seq.computed = lo + n
                    if full:
                        seq.hashes.append(block_hash(parent, want))
                        wants.append(want)
                        parent = seq.hashes[-1]
                    if n < hi - lo or not full:
                        break
                    j += 1
                    continue
            break
        else:
            # 2. the prefix cache (full blocks only), else 3. the generation's host copy (swap).
            # The hot loop of every add/resume (a ~175-block shared prompt prefix): one hash per
            # block, pool.lookup and pool.take inlined.
            by_hash, pblocks = pool.by_hash, pool.blocks
            free_cached = pool.free_cached
            blocks, hashes = seq.blocks, seq.hashes
            from_root = not blocks  # no preserved block taken: hits below start at block 0
            kk = min(k, limit // bs)  # known blocks that are full
            if j < kk:
                # Bulk form of the loop below over the known blocks (C-level maps): lookups,
                # the collision guard, then the references; it stops at the first miss, where
                # the loop takes over (host copy or the end).
                hs = known_h[j:kk]
                bids = list(map(by_hash.get, hs))
                m = bids.index(None) if None in bids else len(bids)
                objs = list(map(pblocks.__getitem__, bids[:m]))
                regs = list(map(_BLOCK_TOKENS, objs))
                ok = list(map(operator.and_, map(operator.eq, map(_BLOCK_PARENT, objs), [parent] + hs[:m - 1]),
                              map(operator.eq, regs, known_w[j:j + m])))
                if False in ok:
                    m = ok.index(False)
                for b in objs[:m]:  # pool.take
                    if b.ref == 0:
                        if b.hash is not None:
                            free_cached.pop(b.bid, None)
                        else:
                            pool.free_plain.remove(b.bid)
                    b.ref += 1
                if m:
                    blocks.extend(bids[:m])
                    hashes.extend(hs[:m])
                    wants.extend(regs[:m])
                    j += m
                    seq.computed = j * bs
                    parent = hs[m - 1]
            # Leading blocks that are prefix-cache hits are hashed and published, and stay so
            # while seq references them: _register_full_blocks may start after them.
            lead = j if from_root else -1
            while j * bs < limit:
                lo = j * bs
                end = lo + bs
                full = end <= limit  # then the block has bs tokens, as limit < len(toks)
                if j < k and full:
                    want, h = known_w[j], known_h[j]  # same content, same chain: same key
                else:
                    want = tuple(toks[lo:end])
                    h = hash((parent, want)) if full else 0  # block_hash(parent, want)
                if full:
                    bid = by_hash.get(h)
                    if bid is not None:
                        b = pblocks[bid]
                        # pool.lookup's collision guard
                        if b.parent == parent and (b.tokens is want or b.tokens == want):
                            if b.ref == 0:  # pool.take
                                if b.hash is not None:
                                    free_cached.pop(bid, None)
                                else:
                                    pool.free_plain.remove(bid)
                            b.ref += 1
                            blocks.append(bid)
                            seq.computed = end
                            parent = h
                            hashes.append(h)
                            wants.append(b.tokens)  # the registered tuple: equal, and shared
                            if lead == j:
                                lead += 1
                            j += 1
                            continue
                hv = host.get(j)
                if hv is not None:
                    hi = min(end, limit)
                    n = min(len(hv), hi - lo)
                    if n > 0 and list(hv[:n]) == list(toks[lo:lo + n]):
                        bid = self._alloc(seq, may_preempt=False)
                        if bid is None:
                            break  # no room to swap in: recompute instead
                        blocks.append(bid)
                        seq.swap_in += 1
                        seq.computed = lo + n
                        if full and n == bs:
                            parent = h
                            hashes.append(parent)
                            wants.append(want)
                            j += 1
                            continue
                break
            if lead > 0:
                seq.registered = lead
        # whatever of the suspended KV was not reused is let go now
        for bid in reversed(pinned):
            if bid >= 0:
                pool.release(bid)
        if susp is not None and susp.mode == "swap":
            self._host_used -= len(susp.host)
        return wants

    def _allocate_rest(self, seq: _Seq, *, may_preempt: bool) -> None:
        """Blocks for all of seq.tokens (what the next step computes)."""
        need = self._blocks_for(len(seq.tokens)) - len(seq.blocks)
        if need <= 0:
            return
        if need > self._pool.num_free and may_preempt:
            reclaimable = self._reclaimable_by_preemption(exclude=seq.gen_id)
            if need > self._pool.num_free + reclaimable:
                raise KVCapacityError(
                    f"generation {seq.gen_id!r} needs {need} more KV blocks; free {self._pool.num_free}, "
                    f"reclaimable by preempting running generations {reclaimable}, "
                    f"pinned by preserved generations {self._pinned_blocks()}")
        for _ in range(need):
            bid = self._alloc(seq, may_preempt=may_preempt)
            if bid is None:
                raise KVCapacityError(f"generation {seq.gen_id!r}: out of KV blocks")
            seq.blocks.append(bid)

    def _alloc(self, seq: _Seq, *, may_preempt: bool) -> int | None:
        while True:
            bid = self._pool.allocate()
            if bid is not None:
                self.counters.evictions = self._pool.evictions
                return bid
            if not may_preempt:
                return None
            victim = self._youngest_running(exclude=seq.gen_id)
            if victim is None:
                return None
            self._preempt(victim)

    def _reclaimable_by_preemption(self, exclude: str) -> int:
        """Blocks that would become free if every running generation but `exclude` were preempted."""
        refs: dict[int, int] = {}
        for s in self._seqs.values():
            if s.waiting or s.gen_id == exclude:
                continue
            for bid in s.blocks:
                refs[bid] = refs.get(bid, 0) + 1
        return sum(1 for bid, n in refs.items() if self._pool.blocks[bid].ref == n)

    def _youngest_running(self, exclude: str | None = None) -> _Seq | None:
        best = None
        for s in self._seqs.values():
            if s.waiting or s.gen_id == exclude:
                continue
            if best is None or s.order > best.order:
                best = s
        return best

    def _preempt(self, s: _Seq) -> None:
        """vLLM recompute preemption: free its KV (it stays cached), re-prefill when re-admitted."""
        self._release_seq(s)
        s.waiting = True
        s.prefilling = True
        s.swap_in = 0
        self.counters.preemptions += 1

    def _readmit(self) -> None:
        """Bring back preempted generations (oldest first) while blocks allow, without preempting."""
        for s in list(self._seqs.values()):
            if not s.waiting:
                continue
            if self._blocks_for(len(s.tokens)) > self._pool.num_free + self._cached_prefix_blocks(s):
                break
            self._claim_cached(s, None)
            try:
                self._allocate_rest(s, may_preempt=False)
            except KVCapacityError:
                self._release_seq(s)
                break
            s.waiting = False
            self.counters.cached_tokens += s.computed
            self.counters.readmissions += 1
            # keep admission order: it is the oldest again only if it was; order is unchanged

    def _cached_prefix_blocks(self, s: _Seq) -> int:
        """Referenced (in-use) cached blocks that s would hit: they need no free block."""
        bs, parent, n = self._bs, _ROOT_HASH, 0
        limit = len(s.tokens) - 1
        for j in range(limit // bs):
            want = tuple(s.tokens[j * bs:(j + 1) * bs])
            bid = self._pool.lookup(parent, want)
            if bid is None:
                break
            if self._pool.blocks[bid].ref > 0:
                n += 1
            parent = block_hash(parent, want)
        return n

    def _grow_for_decode(self) -> None:
        """Every running generation needs a slot for the token it computes this step."""
        for s in sorted((s for s in self._seqs.values() if not s.waiting), key=lambda s: s.order):
            if s.waiting:  # preempted while an older one grew
                continue
            need = self._blocks_for(len(s.tokens)) - len(s.blocks)
            while need > 0:
                bid = self._pool.allocate()
                if bid is None:
                    victim = self._youngest_running()
                    if victim is None:
                        break
                    self._preempt(victim)
                    if victim is s:
                        break
                    continue
                s.blocks.append(bid)
                need -= 1
            self.counters.evictions = self._pool.evictions

    def _register_full_blocks(self, s: _Seq, upto: int) -> None:
        """Offer the full blocks of the first `upto` tokens to the prefix cache (decode blocks
        too, as vLLM).  Called only inside step() for tokens that step computes."""
        bs, pool = self._bs, self._pool
        pblocks, hashes, toks, sblocks = pool.blocks, s.hashes, s.tokens, s.blocks
        for j in range(s.registered, upto // bs):
            if j < len(hashes) and pblocks[sblocks[j]].hash is not None:
                continue  # hash known and block already published: register() would do nothing
            want = tuple(toks[j * bs:(j + 1) * bs])
            parent = hashes[j - 1] if j else _ROOT_HASH
            if j == len(hashes):
                hashes.append(block_hash(parent, want))
            pool.register(sblocks[j], parent, want)
        s.registered = max(s.registered, upto // bs)

    def _upgrade_hits(self, s: _Seq) -> None:
        """Swap freshly allocated blocks for blocks registered since add() (same-step sharing)."""
        bs, pool = self._bs, self._pool
        limit = len(s.tokens) - 1
        while s.computed % bs == 0 and s.computed + bs <= limit:
            j = s.computed // bs
            if j >= len(s.blocks) or len(s.hashes) != j:
                return
            parent = s.hashes[j - 1] if j else _ROOT_HASH
            want = tuple(s.tokens[j * bs:(j + 1) * bs])
            bid = pool.lookup(parent, want)
            if bid is None or bid == s.blocks[j]:
                return
            own, s.blocks[j] = s.blocks[j], bid
            pool.take(bid)
            pool.release(own)
            s.hashes.append(block_hash(parent, want))
            s.computed += bs
            self.counters.cached_tokens += bs
            if s.report_cached is not None:
                s.report_cached += bs

    def _release_seq(self, s: _Seq, *, drop: bool = False) -> None:
        # Tail first, as vLLM: the LRU then evicts a sequence's last blocks before its prefix,
        # which keeps the shared prefix reachable (lookups stop at the first missing block).
        self._pool.release_all(s.blocks[::-1], drop=drop)
        s.blocks.clear()
        s.hashes.clear()
        s.registered = 0
        s.computed = 0

    def _suspend(self, s: _Seq, kv: str) -> _Suspended:
        pool, bs = self._pool, self._bs
        hashes = s.hashes[:s.computed // bs]
        covered = self._blocks_for(s.computed)
        pool.release_all(s.blocks[covered:][::-1])  # allocated for tokens never computed
        blocks = s.blocks[:covered]
        s.blocks = []
        if kv == "preserve":
            return _Suspended("preserve", hashes, tokens=list(s.tokens[:s.computed]), pinned=blocks)
        if kv == "swap":
            kept = s.tokens[:s.computed]
            host: dict[int, tuple[int, ...]] = {}
            room = (self.profile.host_capacity_blocks - self._host_used
                    if self.profile.host_capacity_blocks is not None else len(blocks))
            for j, bid in enumerate(blocks):
                private = pool.blocks[bid].ref == 1
                if private and len(host) < room:
                    host[j] = tuple(kept[j * bs:(j + 1) * bs])
            self._host_used += len(host)
            self._pending_swap_out += len(host)
            self.counters.swap_out_blocks += len(host)
            pool.release_all(blocks[::-1])  # the GPU copies stay in the prefix cache until evicted
            return _Suspended("swap", hashes, host=host)
        pool.release_all(blocks[::-1], drop=(kv == "discard"))
        return _Suspended(kv, hashes)

    def _repin(self, susp: _Suspended) -> None:
        """Undo _claim_cached's release of a preserved/swapped record after a failed add."""
        if susp.mode == "preserve":
            for bid in susp.pinned:
                self._pool.take(bid)
        elif susp.mode == "swap":
            self._host_used += len(susp.host)

    def _convert(self, old: _Suspended, kv: str) -> _Suspended:
        """Change how an already-suspended generation's KV is kept (e.g. cancel -> discard)."""
        pool = self._pool
        if old.mode == "preserve":
            for bid in reversed(old.pinned):
                pool.release(bid, drop=(kv == "discard"))
        elif old.mode == "swap":
            self._host_used -= len(old.host)
        if kv == "discard":  # drop whatever of its blocks is still cached and unreferenced
            for h in old.hashes:
                bid = pool.by_hash.get(h)
                if bid is not None:
                    pool.drop(bid)
        # preserve/swap cannot be re-created after the fact: what is left is cached KV
        return _Suspended("cache" if kv in ("preserve", "swap") else kv, old.hashes)

    def _chain(self, tokens: Sequence[int]) -> list[int]:
        """Chain hashes of the full blocks of `tokens`."""
        out, parent, bs = [], _ROOT_HASH, self._bs
        for j in range(len(tokens) // bs):
            parent = block_hash(parent, tokens[j * bs:(j + 1) * bs])
            out.append(parent)
        return out
