"""The default policy's admission order, ordered only as far as its scheduling point reads it.

`Default.select`'s numpy path hands `Default._finish` the head of the admission order that the
step-time cap can admit (`_head_needed`: the roomy cap's room + 1, ~970 generations on the RTX 4090
profile).  With a deep queue, rule 6's KV budget usually cuts that order first; rule 10's short cap
(`step_ratio`, ~200) then applies, and only that many are admitted.  Ordering ~1,000 generations to
admit ~200 was a quarter of a point in service (benchmarks/bench_scheduling.py).

`LazyHead` orders the first `h` of the head (the short cap's largest room + 1, at least the running
batch) and answers rule 6's question beyond them — does the fitted order hold at least m
generations — from the KV blocks of the *set* of the first m: a partition by priority, the ties
at its boundary ordered by their tie-breakers (ready_since, arrival, id).  That sum does not depend
on the order within the set where no generation's blocks do: every robot type in the head has a
running generation, so none brings its prompt (rule 6) — `Default.select` uses it only then.  The
whole head is ordered only where `_finish` needs more of it than h (the KV budget and the cap both
leave room past it).  The same verdicts and the same order as ordering the whole head
(tests/test_scheduling_fastpaths.py compares both paths with the plain one).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..types import Generation
from .base import ascending_perm_array, priority_head_at


def concat_head(gens: Sequence[Generation], groups: Sequence[np.ndarray], pri: np.ndarray, k: int | None,
                arr: np.ndarray) -> np.ndarray:
    """Indices into `gens` of the first `k` (None: all) of the admission order: each of `groups`
    (indices into `gens`) in priority order (`priority_head_at`), one after the other."""
    parts = []
    left = k
    for grp in groups:
        if left is not None and left <= 0:
            break
        part = priority_head_at(gens, grp, pri, left, arr)
        parts.append(part)
        if left is not None:
            left -= len(part)
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.intp)


class LazyHead:
    """The first `n` of the admission order (`groups` concatenated, each by priority) with rule 6's
    cut, ordered as far as asked.  `blocks`: each of `gens`' KV blocks (rule 6's: output tokens
    plus its type's worst segment, in whole blocks — no prompt: every type runs), `free`: the free
    blocks, `running`: whether the batch holds anyone (an empty engine takes the head anyway).
    Non-finite priorities are the caller's to exclude."""

    def __init__(self, gens: Sequence[Generation], groups: Sequence[np.ndarray], pri: np.ndarray,
                 arr: np.ndarray, n: int, h: int, blocks: np.ndarray, free: int, running: bool) -> None:
        self._gens, self._groups, self._pri, self._arr = gens, groups, pri, arr
        self.n = n
        self._blocks = blocks
        self._free = free
        self._running = running
        self._want = min(h, n)
        self._h = -1  # (not ordered yet: `_ordered`)

    def _ordered(self) -> None:
        if self._h < 0:
            self._order(self._want)

    def _order(self, h: int) -> None:
        idx = concat_head(self._gens, self._groups, self._pri, h, self._arr)
        self._h = len(idx)
        self._list = list(map(self._gens.__getitem__, idx.tolist()))
        used = np.cumsum(self._blocks[idx])
        fit = int(np.searchsorted(used, self._free, side="right"))
        if fit == 0 and not self._running and self._h:
            fit = 1  # an empty engine always takes the head (rule 6's walk)
        self._fit = fit  # the fitted order's length where it is under h (exact), else h

    def head(self) -> list[Generation]:
        """The ordered part's generations that rule 6 admits (all of the fitted order where it
        is shorter than the ordered part)."""
        self._ordered()
        return self._list[:self._fit]

    def fits(self, m: int) -> bool:
        """Whether rule 6 admits at least the first m of the order."""
        self._ordered()
        if m <= self._fit or (m == 1 and not self._running and self.n):
            return True  # (an empty engine takes the head)
        if self._fit < self._h or m > self.n:
            return False  # (cut within the ordered part, or past the head)
        return self._set_blocks(m) <= self._free

    def fitted(self, k: int | None) -> list[Generation]:
        """The first min(k, fitted length) of the order that rule 6 admits (None: all of it)."""
        self._ordered()
        k = self.n if k is None else min(k, self.n)
        if k > self._h and self._fit == self._h:  # more than the ordered part, and all of it fits
            self._order(self.n)
        return self._list[:min(k, self._fit)]

    def set_fits(self, m: int) -> bool:
        """`fits(m)` (1 <= m <= n, a running batch) from the blocks of the first m's set alone,
        before anything is ordered."""
        return self._set_blocks(m) <= self._free

    def _set_blocks(self, m: int) -> float:
        """KV blocks of the first m of the order, from their set: each group's first k by a
        partition of its priorities, the ties at the k-th ordered by their tie-breakers."""
        total = 0.0
        left = m
        for grp in self._groups:
            if left <= 0:
                break
            k = min(left, len(grp))
            left -= k
            if k == len(grp):
                total += float(self._blocks[grp].sum())
                continue
            keys = -self._pri[grp]  # (ascending: the order's key)
            v = np.partition(keys, k - 1)[k - 1]
            below = keys < v
            total += float(self._blocks[grp[below]].sum())
            tied = grp[keys == v]
            t = k - int(np.count_nonzero(below))
            tb = self._blocks[tied]
            if t == len(tied) or tb.min() == tb.max():
                total += float(tb[:t].sum())
            else:
                perm = ascending_perm_array(list(map(self._gens.__getitem__, tied.tolist())),
                                            np.zeros(len(tied)), arrival=self._arr[tied])
                total += float(tb[np.asarray(perm, dtype=np.intp)[:t]].sum())
        return total
