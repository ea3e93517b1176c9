"""Hybrid offline-online scheduling (Pang et al.) as a planner policy: its two online rules.

* **Request order** (paper Algorithm 1): longest total length first, N_p + N_d, where N_p is the
  generation's context (prompt + output so far) and N_d its predicted remaining output (mean of
  its past segments, else the robot's max_segment_tokens).  With one ready queue this is the
  paper's per-client sort; the offline P||Cmax assignment itself is `timelyllm plan-offline`
  (timelyllm_ros/offline), since the planner has no fixed client slots.
* **Prefill vs decode** (Eqs. 41-43, rent-or-buy reading): admitting new generations costs a
  prefill stage C_p = T_fwd(uncached tokens of the waiting new generations) during which the
  running batch stalls.  While the decode time accumulated since the last admission of new
  generations, C_d, is below C_p, new generations are held back (resumed ones, whose KV or prefix
  is cached, are not); once C_d > C_p they are all admitted together.  With nothing running they
  are admitted at once.

This is a throughput (makespan) policy for known batches; it ignores TUFs on purpose.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..kv_handling import KVCostModel, SharedPrefix, cost_model, private_context
from ..types import Generation, GenState
from .base import Policy, PolicyContext, Selection, ascending_perm_array, set_priorities
from .slots import SlotTable


class Hybrid(Policy):
    name = "hybrid"

    def __init__(self, *, cost: Any = None, profile: Any = None, pd_rule: bool = True) -> None:
        self.cost: KVCostModel = cost_model(cost, profile)
        self.pd_rule = pd_rule
        self.prefix = SharedPrefix(self.cost.block_size)
        self._last_now: float | None = None
        self.decode_since_prefill = 0.0  # C_d
        self.held = 0  # iterations in which new generations were held back (for reports/tests)

    def predict_remaining(self, g: Generation, ctx: PolicyContext) -> float:
        done = [s.token_count for s in g.segments if s.token_count > 0]
        if done:
            return sum(done) / len(done)
        robot = ctx.robots.get(g.request.robot_type)
        return float(robot.max_segment_tokens) if robot else 16.0

    def total_length(self, g: Generation, ctx: PolicyContext) -> float:
        return len(g.prompt_ids) + len(g.output_ids) + self.predict_remaining(g, ctx)

    def priority(self, g, ctx, now):
        return self.total_length(g, ctx)

    def _fill(self, g: Generation, slot: int, ctx: PolicyContext) -> None:
        """g's total length (priority) and private (uncached) tokens: fixed while it is ready."""
        a = self._table.a
        a["pri"][slot] = self.total_length(g, ctx)
        a["own"][slot] = private_context(g, self.prefix)
        a["arrival"][slot] = g.request.arrival

    def select(self, ready: Sequence[Generation], running: Sequence[Generation], ctx: PolicyContext,
               now: float) -> Selection:
        self.prefix.observe_all(list(running) + list(ready))
        if self._last_now is not None and running:
            self.decode_since_prefill += max(0.0, now - self._last_now)
        self._last_now = now
        # On arrays: a ready generation's total length and private tokens only change when it
        # runs (SlotTable), or, for the private tokens, when a shared prompt prefix changes (every
        # slot refilled); C_p = T_fwd(the new generations' private tokens).  The rules written out
        # per generation are the oracle of tests/test_scheduling_fastpaths.py (tests/policy_oracles.py).
        table = self.__dict__.get("_table")
        sig = (self.prefix.signature(), id(ctx.robots))
        if table is None:
            table = self._table = SlotTable({"pri": (float, 0.0), "own": (float, 0.0), "arrival": (float, 0.0)})
        if sig != self.__dict__.get("_sig"):
            table.invalidate()
            self._sig = sig
        if not ready:
            return Selection(order=[])
        sl = table.lookup(ready, lambda g, slot: self._fill(g, slot, ctx))
        pri = table.a["pri"][sl]
        set_priorities(ready, pri.tolist())
        perm = np.asarray(ascending_perm_array(ready, -pri, ready_since=False, arrival=table.a["arrival"][sl]),
                          dtype=np.intp)  # (-priority, arrival, id)
        queued_state = GenState.QUEUED
        queued = np.array([g.state is queued_state for g in ready], dtype=bool)
        order = list(map(ready.__getitem__, perm.tolist()))
        if not queued.any():
            return Selection(order=order)
        if self.pd_rule and running:
            c_p = self.cost.t_fwd(int(table.a["own"][sl][queued].sum()))  # C_p over the new generations
            if c_p >= self.decode_since_prefill:
                self.held += 1
                return Selection(order=list(map(ready.__getitem__, perm[~queued[perm]].tolist())))
        self.decode_since_prefill = 0.0
        return Selection(order=order)

    def params(self) -> dict:
        return {"pd_rule": self.pd_rule}
