"""Per-generation policy terms in numpy arrays, one slot per generation, for vectorised policies.

A scheduling point at 1,000 ready generations leaves ~1 µs per generation; a Python loop that
reads a few attributes of each already costs that.  What a policy derives from a *ready*
generation (its context length, its segments' statistics, its delivery runs...) only changes
when the generation runs, and a run changes its output length: every engine step adds a token
to each running generation, new segments are cut from those tokens, and a suspension drops only
tokens of that run (up to the statement end, which lies in them).  A `SlotTable` keeps those
terms in arrays and refills a generation's slot only when its len(output_ids) differs from what
the slot was filled from, when the policy invalidates it (e.g. LAMPS when it picks a KV handling:
a preemption before the first token changes that and nothing else) or all of them.  Lookups and
staleness checks are C-level maps and numpy comparisons; the Python fill runs for new and changed
generations only.

A policy whose slots hold only a request's constants (``track_output=False``: the default's) skips
that check: a slot is filled once, when its generation is first seen, and a lookup is then an
identity map (a handful of generations cost a few numpy calls, not the per-generation reads).

Generations are found by identity; the table holds them (so their ids are not reused) until it
holds 4x more than the current list (+4,096), when it is rebuilt for the current generations,
carrying the `persistent` fields (e.g. starvation counters) over.
"""

from __future__ import annotations

import operator
from itertools import repeat
from typing import Callable, Sequence

import numpy as np

from ..types import Generation



class SlotTable:
    def __init__(self, fields: dict[str, tuple[type, float | int | bool]], persistent: Sequence[str] = (),
                 track_output: bool = True) -> None:
        """fields: name -> (dtype, initial value); `persistent` ones survive a rebuild;
        `track_output` False: a slot never goes stale by its generation's output (its fill reads
        nothing that changes), only `invalidate` refills it."""
        self.fields = {"_out": (float, -1.0), **fields}
        self.persistent = tuple(persistent)
        self.track_output = bool(track_output)
        self._clear()

    def _clear(self) -> None:
        self._slot_of: dict[int, int] = {}
        self.objs: list[Generation] = []
        self.py: list = []  # one Python object per slot, the policy's (Andes' delivery runs)
        self._last: tuple[list[Generation], np.ndarray] | None = None
        self._dirty = False  # a slot was invalidated since the last lookup
        self.a: dict[str, np.ndarray] = {k: np.full(0, v, dtype=t) for k, (t, v) in self.fields.items()}

    def _grow(self, need: int) -> None:
        size = len(self.a["_out"])
        if need <= size:
            return
        new_size = max(need, 2 * size, 1024)
        for k, (t, v) in self.fields.items():
            arr = np.full(new_size, v, dtype=t)
            arr[:size] = self.a[k]
            self.a[k] = arr

    def invalidate(self, g: Generation | None = None) -> None:
        """g's slot (every slot without g) is refilled at its next lookup."""
        self._dirty = True
        if g is None:
            self.a["_out"][:] = -1.0
        else:
            slot = self._slot_of.get(id(g))
            if slot is not None:
                self.a["_out"][slot] = -1.0

    def slot(self, g: Generation) -> int | None:
        return self._slot_of.get(id(g))

    def lookup(self, gens: Sequence[Generation], fill: Callable[[Generation, int], None],
               before_fill: Callable[[list[Generation]], None] | None = None) -> np.ndarray:
        """Slots of `gens`; `fill(g, slot)` is called for every new or changed generation (after
        the table's arrays have room, and after `before_fill(those generations)`)."""
        n = len(gens)
        if len(self.objs) > 4 * n + 4096:
            self._rebuild(gens)
        last = self._last
        same = last is not None and len(last[0]) == n and all(map(operator.is_, gens, last[0]))
        if same:  # the same generations as at the last lookup (common between points): all have slots
            sl = last[1].copy()
            if not self.track_output and not self._dirty:
                return sl
        else:
            get = self._slot_of.get
            sl = np.fromiter(map(get, map(id, gens), repeat(-1)), dtype=np.intp, count=n)
        self._grow(len(self.objs) + n)
        self._dirty = False  # (an `invalidate` from here on, a fill's included, holds for the next lookup)
        a = self.a
        if self.track_output:
            out = np.array([len(g.output_ids) for g in gens], dtype=float)
            miss = a["_out"][sl] != out
            if not same:
                miss |= sl < 0
            stale = miss.nonzero()[0].tolist()
        else:  # filled once; `invalidate` marks a slot -1 (refilled here)
            out = None
            stale = ((sl < 0) | (a["_out"][sl] < 0.0)).nonzero()[0].tolist() if n else []
        if stale and before_fill is not None:
            before_fill([gens[i] for i in stale])
        for i in stale:
            g = gens[i]
            slot = int(sl[i])
            if slot < 0:
                slot = sl[i] = len(self.objs)
                self._slot_of[id(g)] = slot
                self.objs.append(g)
                self.py.append(None)
            a["_out"][slot] = out[i] if out is not None else 0.0
            fill(g, slot)
        if not same:  # (the same list keeps its slots: no new one was given)
            self._last = (list(gens), sl.copy())
        return sl

    def _rebuild(self, gens: Sequence[Generation]) -> None:
        old_of, old = self._slot_of, self.a
        keep = [(g, old_of.get(id(g))) for g in gens]
        self._clear()
        self._grow(len(keep))
        for g, s in keep:
            slot = len(self.objs)
            self._slot_of[id(g)] = slot
            self.objs.append(g)
            self.py.append(None)
            if s is not None:
                for k in self.persistent:
                    self.a[k][slot] = old[k][s]
