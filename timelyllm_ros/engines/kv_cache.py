"""The simulated engine's KV memory per generation: which blocks of the pool (kv_blocks.py) each
generation holds, and what happens to them.

`KVAccounting` is mixed into `SimulatedEngine` (simulated.py); it keeps an exact account of KV
blocks as vLLM does: a prefix cache keyed by chained block hashes (automatic prefix caching: full
blocks only) that `add` claims hits from, blocks registered as a step computes them, LRU eviction
of unreferenced cached blocks (the pool), recompute-preemption of the youngest running
generation when memory runs out and its re-admission, and the four context-switch modes of a
suspended generation (cache / preserve / discard / swap, see LAMPS/InferCept).

Pure: no I/O, no clock.  Why ~600 lines in one file: the block account is one invariant (every
block held, cached or free exactly once) kept by every operation here; split, each part would
reach into the others' state.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any, Sequence

from ..core.engine import EngineError
from .kv_blocks import _BLOCK_PARENT, _BLOCK_TOKENS, _ROOT_HASH, _BlockPool, block_hash
from ..core.latency_profile import LatencyProfile

KV_MODES = frozenset({"cache", "preserve", "discard", "swap"})


@dataclass(frozen=True, slots=True)
class EngineKind:
    """What an engine can do with a suspended generation's KV (the regime map's capability
    columns, issue 25):

    * ``stock`` — vLLM as users run it, in-process (`VllmEngine`) or ``vllm serve``
      (`OpenAIRemoteEngine`): ``kv_modes`` {cache, discard}.  Abort frees the request's KV; its
      full blocks stay in the prefix cache (LRU) until memory pressure evicts them, and a resume
      re-adds prompt + generated ids and reuses what is still cached.  vLLM has no per-request
      eviction, so "discard" keeps the blocks cached exactly like "cache" (``discard_evicts``
      False), and a mode it lacks (preserve, swap) is served as "cache", as `VllmEngine.abort` does.
    * ``preserve`` — an InferCept / LAMPS-style engine that also pins a paused request's KV in
      place (preserve), swaps it to host memory (swap) and evicts it on request (discard).
    """

    name: str
    kv_modes: frozenset[str]
    discard_evicts: bool  # "discard" drops the blocks from the prefix cache (False: kept like "cache")


ENGINE_KINDS: dict[str, EngineKind] = {
    "stock": EngineKind("stock", frozenset({"cache", "discard"}), discard_evicts=False),
    "preserve": EngineKind("preserve", KV_MODES, discard_evicts=True),
}


def engine_kind(name: str) -> EngineKind:
    """``stock`` | ``preserve``; a ValueError naming the known ones otherwise."""
    try:
        return ENGINE_KINDS[name]
    except (KeyError, TypeError):
        raise ValueError(f"engine kind {name!r}: expected one of {', '.join(ENGINE_KINDS)}") from None


class KVCapacityError(EngineError):
    """A generation cannot get KV blocks even after evicting and preempting everything allowed."""



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
    priority: int = 0  # priority scheduling: lower first (vLLM's Request.priority)
    queued: bool = False  # priority scheduling: added, not yet admitted (vLLM's waiting queue)
    keys: Any = None  # queued: the shared-prefix keys found at add (for `_claim_cached`)
    run_order: int = 0  # priority scheduling: position in vLLM's `running` list (admission)


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
_HEADS_MAX = 64  # distinct first blocks remembered for `_shared_keys`


class KVAccounting:
    """The simulated engine's KV bookkeeping, mixed into `SimulatedEngine`: per-generation block
    tables over the `_BlockPool`, prefix-cache claims on add, allocation and recompute
    preemption, re-admission, registration of computed blocks, and the suspension modes.

    Uses the engine's `profile` (KV capacity, host blocks), `counters` (KV figures) and the state
    below, which `SimulatedEngine.__init__` sets up."""

    profile: LatencyProfile
    counters: Any
    _bs: int  # tokens per KV block
    _pool: _BlockPool
    _seqs: dict[str, _Seq]  # running or waiting (preempted), insertion = admission
    _suspended: dict[str, _Suspended]
    _heads: dict[tuple[int, ...], _Known]  # first block -> last prompt added with it
    _host_used: int  # host blocks held by swapped-out generations
    _pending_swap_out: int  # blocks swapped out since the last step (charged to it)

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

    def _shared_keys(self, prompt: list[int]) -> tuple[list[tuple[int, ...]], list[int], int] | None:
        """Block contents and chain hashes of the leading full blocks `prompt` shares with the
        last prompt added that starts with the same block (the robot type's shared prompt prefix:
        a new request then looks its prefix up without hashing it again)."""
        bs = self._bs
        if len(prompt) <= bs:
            return None
        ref = self._heads.get(tuple(prompt[:bs]))
        if ref is None:
            return None
        other = ref.tokens
        hi = min(len(ref.hashes), len(prompt) // bs, ref.n // bs)
        if prompt[:hi * bs] != other[:hi * bs]:
            lo = 1  # blocks known equal (the first: same key); hi: known to differ
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if prompt[lo * bs:mid * bs] == other[lo * bs:mid * bs]:
                    lo = mid
                else:
                    hi = mid
            hi = lo
        return (ref.wants, ref.hashes, hi)

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

    # --- vLLM's priority scheduling (`scheduling_policy="priority"`) --------------------------
    # vllm/v1/core/sched/scheduler.py `Scheduler.schedule` of vLLM 0.32: the running requests are
    # served first, in `self.running` order; one that cannot get a block preempts
    # max(running, key=(priority, arrival_time)) (recompute; itself: it stops there); then, only
    # if nothing was preempted in this step, the waiting queue (a heap by priority, arrival,
    # request id: request_queue.py `PriorityRequestQueue`, request.py `Request.__lt__`) is
    # admitted in order until one does not fit (break).  Adds and preempted requests both wait
    # there.  Here arrival is the add order (`_Seq.order`), which vLLM's arrival_time follows.

    def _grow_by_priority(self) -> bool:
        """The running loop: a slot for each running generation's next token; True if any was
        preempted for it."""
        preempted = False
        running = sorted((s for s in self._seqs.values() if not s.waiting), key=lambda s: s.run_order)
        for s in running:
            if s.waiting:  # preempted while an earlier one grew
                continue
            need = self._blocks_for(len(s.tokens)) - len(s.blocks)
            while need > 0:
                bid = self._pool.allocate()
                if bid is None:
                    victim = self._lowest_priority_running()
                    if victim is None:
                        break
                    self._preempt(victim)
                    preempted = True
                    if victim is s:
                        break
                    continue
                s.blocks.append(bid)
                need -= 1
            self.counters.evictions = self._pool.evictions
        return preempted

    def _lowest_priority_running(self) -> _Seq | None:
        """vLLM's victim: max(running, key=lambda r: (r.priority, r.arrival_time))."""
        best = None
        for s in self._seqs.values():
            if not s.waiting and (best is None or (s.priority, s.order) > (best.priority, best.order)):
                best = s
        return best

    def _admit_by_priority(self) -> None:
        """The waiting loop: admit waiting generations by (priority, arrival) while blocks allow;
        the first that does not fit stops it (nobody overtakes it)."""
        waiting = sorted((s for s in self._seqs.values() if s.waiting), key=lambda s: (s.priority, s.order))
        for s in waiting:
            if self._blocks_for(len(s.tokens)) > self._pool.num_free + self._cached_prefix_blocks(s):
                break
            wants = self._claim_cached(s, None, s.keys)
            try:
                self._allocate_rest(s, may_preempt=False)
            except KVCapacityError:
                self._release_seq(s)
                break
            s.waiting = False
            self._runs += 1
            s.run_order = self._runs
            self.counters.cached_tokens += s.computed
            if s.queued:  # first admission after add: reports its cache hits, as an add does
                s.queued, s.keys = False, None
                s.report_cached = s.computed
                self._remember(s, wants)
            else:
                self.counters.readmissions += 1

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
