"""The Hybrid paper's setting as a discrete-event simulation: PD competition over J client slots.

Each iteration is either one *prefill stage* (every client holding a freshly taken request is
prefilled together; time = prefill_base + per_token * tokens) or one *decode round* (every
decoding client emits one token; time = decode_base + per_token * clients).  A client serves one
request at a time, prefill then decode, with no migration of running work (paper §III-B).

Strategies (any combination of the three switches):

* baseline:  clients take the next request of one shared FIFO queue in dataset order when they
  become free (a benchmark client with J concurrent workers; `assignment="round_robin"` deals the
  requests to clients up front instead), and vLLM's prefill-first rule (a prefill stage whenever
  some client waits for one);
* offline:   the client assignment comes from the P||Cmax planner (`makespan.solve`) on the
  estimated decode rounds T_i = est_output_tokens;
* online requests (Algorithm 1): each client's queue sorted by N_p + N_d descending; a client whose
  queue is empty takes the longest queued request of the busiest client (largest remaining
  tokens: queued plus the running request's rest).  Without an offline plan there are no
  per-client queues: the shared queue is sorted by N_p + N_d descending (longest first);
* online iteration (Eqs. 41-43, "Lagrangian" rule): with clients waiting for a prefill, compare the
  cost of the prefill stage C_p = prefill(tokens waiting) with the decode time C_d accumulated in
  the current decode stage (since the last prefill stage): C_p >= C_d -> one more decode round,
  else a prefill stage.  [our reading: rent-or-buy; with no decoding client a prefill runs at once]
  `iteration_rule="idle"` is a variant of ours in client-seconds: prefill once the idle time of
  the clients waiting for it (summed over the decode rounds they waited) reaches the stall the
  prefill stage imposes on the decoding clients (decoding clients x C_p).

Utilisation = sum over iterations of duration x clients doing work in it, divided by
J x total time (a client stalled by another client's prefill, or without work, is idle).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from .batch import BatchRequest, PDLatency
from .makespan import Assignment, solve


@dataclass(frozen=True, slots=True)
class Strategy:
    offline: bool = False
    online_requests: bool = False
    online_iteration: bool = False

    @property
    def name(self) -> str:
        on = self.online_requests or self.online_iteration
        if self.offline and on:
            return "offline+online"
        if self.offline:
            return "offline"
        if on:
            return "online" if (self.online_requests and self.online_iteration) else (
                "online-requests" if self.online_requests else "online-iteration")
        return "baseline"


STRATEGIES = {
    "baseline": Strategy(),
    "offline": Strategy(offline=True),
    "online": Strategy(online_requests=True, online_iteration=True),
    "offline+online": Strategy(offline=True, online_requests=True, online_iteration=True),
    "online-requests": Strategy(online_requests=True),
    "online-iteration": Strategy(online_iteration=True),
}


@dataclass
class SimResult:
    strategy: str
    total_s: float
    utilisation: float
    prefill_stages: int
    decode_rounds: int
    prefill_s: float
    decode_s: float
    tokens_per_s: float
    finished: int
    requests: int
    steals: int
    start: dict[str, float] = field(default_factory=dict)
    end: dict[str, float] = field(default_factory=dict)
    plan: Assignment | None = None


@dataclass
class LowerBounds:
    """Paper Eq. (31)-(32) and a strict bound under this simulator's latency model."""

    decode_rounds_opt: int  # P||Cmax optimum (or its lower bound) on true output tokens
    rounds_proven: bool
    paper_prefill_s: float  # T_L^p * floor(sum N_p / N_L^cap)
    paper_decode_s: float  # t_d* = rounds * decode round time with all J clients busy
    strict_s: float  # sum of per-token costs + fixed costs of the minimum stage / round counts

    @property
    def paper_s(self) -> float:
        return self.paper_prefill_s + self.paper_decode_s


def lower_bounds(reqs: Sequence[BatchRequest], slots: int, lat: PDLatency) -> LowerBounds:
    rounds = solve([r.output_tokens for r in reqs], slots)
    r_opt = int(round(rounds.makespan if rounds.optimal else rounds.lower_bound))
    total_in = sum(r.input_tokens for r in reqs)
    total_out = sum(r.output_tokens for r in reqs)
    cap = lat.prefill_cap_tokens or max(1, total_in)
    paper_p = lat.prefill(cap) * math.floor(total_in / cap)
    paper_d = r_opt * lat.decode(slots)
    min_stages = max(1, math.ceil(total_in / cap), math.ceil(len(reqs) / slots))
    strict = (lat.prefill_s_per_token * total_in + lat.prefill_base_s * min_stages
              + lat.decode_s_per_token * total_out + lat.decode_base_s * r_opt)
    return LowerBounds(r_opt, rounds.optimal, paper_p, paper_d, strict)


def simulate(reqs: Sequence[BatchRequest], slots: int, lat: PDLatency, strategy: Strategy,
             plan: Assignment | None = None, assignment: str = "shared", iteration_rule: str = "paper",
             max_iterations: int = 50_000_000) -> SimResult:
    """Run the batch to completion under `strategy`; every request ends (finished == requests)."""
    n = len(reqs)
    if slots < 1:
        raise ValueError("need at least one slot")
    if assignment not in ("shared", "round_robin"):
        raise ValueError(f"assignment must be 'shared' or 'round_robin', got {assignment!r}")
    if iteration_rule not in ("paper", "idle"):
        raise ValueError(f"iteration_rule must be 'paper' or 'idle', got {iteration_rule!r}")
    # --- assignment to client queues (shared: one queue every client takes from)
    shared = not strategy.offline and assignment == "shared"
    if strategy.offline:
        plan = plan or solve([r.est_output_tokens for r in reqs], slots)
        queues = plan.queues()
    else:
        plan = None
        queues = [[] for _ in range(1 if shared else slots)]
        for i in range(n):
            queues[0 if shared else i % slots].append(i)
    if strategy.online_requests:
        for q in queues:
            q.sort(key=lambda i: (reqs[i].input_tokens + reqs[i].output_tokens, -i))  # pop() = longest
    else:
        for q in queues:
            q.reverse()  # pop() = first in dataset order
    queued_tokens = [sum(reqs[i].total_tokens for i in q) for q in queues]
    cur: list[int | None] = [None] * slots
    rest = [0] * slots  # decode tokens left of the running request (0 while awaiting prefill)
    awaiting: list[int] = []  # clients whose current request waits for a prefill stage
    t = 0.0
    busy = 0.0
    prefill_s = decode_s = 0.0
    stages = rounds = steals = 0
    stage_decode = 0.0  # C_d: decode time accumulated since the last prefill stage
    waited = 0.0  # "idle" rule: client-seconds spent waiting for a prefill since the last one
    start: dict[str, float] = {}
    end: dict[str, float] = {}
    done = 0

    def take(j: int) -> None:
        nonlocal steals
        q = 0 if shared else j
        if queues[q]:
            i = queues[q].pop()
            queued_tokens[q] -= reqs[i].total_tokens
        elif strategy.online_requests and not shared:
            best, best_rem = -1, 0
            for k in range(len(queues)):
                if queues[k]:
                    rem = queued_tokens[k] + rest[k]
                    if rem > best_rem:
                        best, best_rem = k, rem
            if best < 0:
                return
            i = queues[best].pop()  # its longest queued request
            queued_tokens[best] -= reqs[i].total_tokens
            steals += 1
        else:
            return
        cur[j] = i
        rest[j] = 0
        awaiting.append(j)

    for j in range(slots):
        take(j)
    it = 0
    while done < n:
        it += 1
        if it > max_iterations:
            raise RuntimeError("simulation did not converge")
        decoding = [j for j in range(slots) if cur[j] is not None and rest[j] > 0]
        run_prefill = False
        if awaiting:
            if not decoding or not strategy.online_iteration:
                run_prefill = True
            else:
                c_p = lat.prefill(_stage_tokens(awaiting, cur, reqs, lat.prefill_cap_tokens)[1])
                if iteration_rule == "paper":
                    run_prefill = c_p < stage_decode
                else:
                    run_prefill = waited >= len(decoding) * c_p
        if run_prefill:
            members, tokens = _stage_tokens(awaiting, cur, reqs, lat.prefill_cap_tokens)
            dt = lat.prefill(tokens)
            for j in members:
                i = cur[j]
                start[reqs[i].id] = t
                rest[j] = reqs[i].output_tokens
            awaiting[:] = [j for j in awaiting if j not in set(members)]
            busy += dt * len(members)
            prefill_s += dt
            stages += 1
            stage_decode = 0.0
            waited = 0.0
            t += dt
            continue
        if not decoding:
            raise RuntimeError("no work although requests remain")  # cannot happen
        dt = lat.decode(len(decoding))
        t += dt
        busy += dt * len(decoding)
        decode_s += dt
        stage_decode += dt
        waited += dt * len(awaiting)
        rounds += 1
        for j in decoding:
            rest[j] -= 1
            if rest[j] == 0:
                end[reqs[cur[j]].id] = t
                done += 1
                cur[j] = None
                take(j)
    total_out = sum(r.output_tokens for r in reqs)
    name = strategy.name + ("" if iteration_rule == "paper" or not strategy.online_iteration else "[idle]")
    if assignment == "round_robin" and not strategy.offline:
        name += "[rr]"
    return SimResult(strategy=name, total_s=t, utilisation=busy / (slots * t) if t > 0 else 0.0,
                     prefill_stages=stages, decode_rounds=rounds, prefill_s=prefill_s, decode_s=decode_s,
                     tokens_per_s=total_out / t if t > 0 else 0.0, finished=done, requests=n, steals=steals,
                     start=start, end=end, plan=plan)


def _stage_tokens(awaiting: list[int], cur: list[int | None], reqs: Sequence[BatchRequest],
                  cap: int | None) -> tuple[list[int], int]:
    """Clients in the next prefill stage (in waiting order, within the level capacity) and tokens."""
    members, tokens = [], 0
    for j in awaiting:
        n_in = reqs[cur[j]].input_tokens
        if cap is not None and members and tokens + n_in > cap:
            break
        members.append(j)
        tokens += n_in
    return members, tokens
