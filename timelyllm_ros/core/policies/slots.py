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
staleness checks are C-level maps and numpy comparisons — or, for the same generations as at the
last lookup (the common case between points), a comparison of Python lists of output lengths; the
Python fill runs for new and changed generations only (one `fill_many` call for all of them, if
the policy gives one).

A policy whose slots hold only a request's constants (``track_output=False``: the default's) skips
that check: a slot is filled once, when its generation is first seen, and a lookup is then an
identity map (a handful of generations cost a few numpy calls, not the per-generation reads).

Generations are found by identity; the table holds them (so their ids are not reused) until it
holds 4x more than the current list (+4,096), when it is rebuilt for the current generations,
carrying the `persistent` fields (e.g. starvation counters) over.
"""

from __future__ import annotations

import operator
from itertools import compress, repeat
from typing import Callable, Sequence

import numpy as np

from ..types import Generation



class SlotTable:
    def __init__(self, fields: dict[str, tuple[type, float | int | bool]], persistent: Sequence[str] = (),
                 track_output: bool = True, matrix: bool = False) -> None:
        """fields: name -> (dtype, initial value); `persistent` ones survive a rebuild;
        `track_output` False: a slot never goes stale by its generation's output (its fill reads
        nothing that changes), only `invalidate` refills it; `matrix`: the fields (all float) are
        the rows of one 2-D array `m`, in `fields` order after "_out" (row 0), and a[k] is a view
        of its row — one argument for a compiled loop that reads them all."""
        self.fields = {"_out": (float, -1.0), **fields}
        self.persistent = tuple(persistent)
        self.track_output = bool(track_output)
        self.matrix = bool(matrix)
        if self.matrix and any(t is not float for t, _ in self.fields.values()):
            raise ValueError("a matrix SlotTable holds float fields only")
        self._clear()

    def _clear(self) -> None:
        self._slot_of: dict[int, int] = {}
        self.objs: list[Generation] = []
        self.py: list = []  # one Python object per slot, the policy's (Andes' delivery runs)
        # the last lookup's generations and their slots (an array and a list); with `track_output`
        # also the output lengths those slots were filled from (a["_out"] there: `_lookup_same`)
        self._last: tuple[list[Generation], np.ndarray, list[int]] | None = None
        self._last_out: list[int] = []
        self._dirty = False  # a slot was invalidated since the last lookup
        self.m: np.ndarray | None = None  # (`matrix`: the fields' rows)
        self.a: dict[str, np.ndarray] = {}
        self._alloc(0, None)

    def _grow(self, need: int) -> None:
        size = len(self.a["_out"])
        if need <= size:
            return
        self._alloc(max(need, 2 * size, 1024), size)

    def _alloc(self, new_size: int, keep: int | None) -> None:
        """New arrays of `new_size` slots, at the fields' initial values but for the first `keep`
        slots, copied from the current arrays."""
        old = dict(self.a)
        if self.matrix:
            self.m = np.empty((len(self.fields), new_size))
            for i, (k, (_, v)) in enumerate(self.fields.items()):
                self.m[i] = v
                if keep:
                    self.m[i, :keep] = old[k][:keep]
                self.a[k] = self.m[i]
        else:
            for k, (t, v) in self.fields.items():
                arr = np.full(new_size, v, dtype=t)
                if keep:
                    arr[:keep] = old[k][:keep]
                self.a[k] = arr
        self._out_mv = memoryview(self.a["_out"])  # (`_lookup_same` writes through it: cheaper than numpy's setitem)

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

    def lookup(self, gens: Sequence[Generation], fill: Callable[[Generation, int], None] | None,
               before_fill: Callable[[list[Generation]], None] | None = None, *,
               fill_many: Callable[[list[Generation], list[int], list[int] | None], None] | None = None
               ) -> np.ndarray:
        """Slots of `gens`; `fill(g, slot)` is called for every new or changed generation (after
        the table's arrays have room, and after `before_fill(those generations)`).  Or, instead of
        `fill` (then None), `fill_many(those generations, their slots, their len(output_ids) as
        read here (None without `track_output`))` once, in `gens` order, after all of them have
        their slots: it must leave the table as `fill` on each in turn would (one call instead of
        one per generation: the running ones change at every point)."""
        if (fill is None) == (fill_many is None):
            raise TypeError("lookup takes one of fill and fill_many")
        n = len(gens)
        if len(self.objs) > 4 * n + 4096:
            self._rebuild(gens)
        last = self._last
        same = last is not None and len(last[0]) == n and all(map(operator.is_, gens, last[0]))
        if same:  # the same generations as at the last lookup (common between points): all have slots
            sl = last[1].copy()
            if not self._dirty:
                if not self.track_output:
                    return sl
                return self._lookup_same(gens, sl, last[2], fill, before_fill, fill_many)
        else:
            get = self._slot_of.get
            sl = np.fromiter(map(get, map(id, gens), repeat(-1)), dtype=np.intp, count=n)
        self._grow(len(self.objs) + n)
        self._dirty = False  # (an `invalidate` from here on, a fill's included, holds for the next lookup)
        a = self.a
        if self.track_output:
            outs = [len(g.output_ids) for g in gens]
            out = np.array(outs, dtype=float)
            miss = a["_out"][sl] != out
            if not same:
                miss |= sl < 0
            stale = miss.nonzero()[0].tolist()
        else:  # filled once; `invalidate` marks a slot -1 (refilled here)
            out = None
            stale = ((sl < 0) | (a["_out"][sl] < 0.0)).nonzero()[0].tolist() if n else []
        if stale and before_fill is not None:
            before_fill([gens[i] for i in stale])
        todo: list[int] = []  # (their slots, for fill_many)
        for i in stale:
            g = gens[i]
            slot = int(sl[i])
            if slot < 0:
                slot = sl[i] = len(self.objs)
                self._slot_of[id(g)] = slot
                self.objs.append(g)
                self.py.append(None)
            a["_out"][slot] = out[i] if out is not None else 0.0
            if fill_many is None:
                fill(g, slot)
            else:
                todo.append(slot)
        if todo:
            fill_many([gens[i] for i in stale], todo, [outs[i] for i in stale] if self.track_output else None)
        if not same:  # (the same list keeps its slots: no new one was given)
            self._last = (list(gens), sl.copy(), sl.tolist())
        if self.track_output:
            self._last_out = outs  # (what every slot of `gens` holds now)
        return sl

    def _lookup_same(self, gens: Sequence[Generation], sl: np.ndarray, sl_l: list[int],
                     fill: Callable[[Generation, int], None] | None,
                     before_fill: Callable[[list[Generation]], None] | None,
                     fill_many: Callable[[list[Generation], list[int], list[int] | None], None] | None
                     ) -> np.ndarray:
        """`lookup` of the last lookup's generations again (`sl`, `sl_l`: their slots), with
        `track_output` and no slot invalidated since: the general path's steps on Python lists.
        Every slot of those generations holds a["_out"] = `_last_out` (a lookup leaves each slot it
        looked up filled from its generation's output length then, and only `invalidate`, which
        marks the table dirty, changes a slot otherwise), so the stale slots are those whose
        generation's output length differs from it: no numpy call unless one changed."""
        self._grow(len(self.objs) + len(gens))  # (as the general path: the arrays grow at the same points)
        outs = [len(g.output_ids) for g in gens]
        prev = self._last_out
        if outs == prev:
            return sl
        stale = list(compress(range(len(outs)), map(operator.ne, outs, prev)))
        if before_fill is not None:
            before_fill([gens[i] for i in stale])
        col = self._out_mv
        if fill_many is None:
            for i in stale:
                slot = sl_l[i]
                col[slot] = outs[i]
                fill(gens[i], slot)
        else:
            slots = [sl_l[i] for i in stale]
            stale_outs = [outs[i] for i in stale]
            for slot, out in zip(slots, stale_outs):
                col[slot] = out
            fill_many([gens[i] for i in stale], slots, stale_outs)
        self._last_out = outs
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
