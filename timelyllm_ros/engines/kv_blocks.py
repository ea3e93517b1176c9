"""Paged KV memory with vLLM's automatic prefix cache, as the simulated engine keeps it: a fixed
pool of blocks, refcounts, full blocks keyed by chained hashes, an LRU of free cached blocks."""

from __future__ import annotations

import operator
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Sequence

from ..core.engine import EngineError

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
