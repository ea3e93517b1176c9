"""The engine port: what the planner needs from an LLM engine, and nothing more.

Lives in core because the planner, the policies and the batch-size controllers use it; the
adapters (timelyllm_ros/engines/) implement it.

Modelled on vLLM's step-level LLMEngine: the planner owns admission (which generations run),
the engine only runs what it was given.  Requests are added by token ids (never re-tokenised
text) so a suspended generation resumes from `prompt ids + generated ids` and the engine's
prefix cache reuses its KV.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Protocol, Sequence


class EngineError(RuntimeError):
    """The engine failed (crash, bad model, dead core process); the message says why."""


@dataclass(frozen=True, slots=True)
class EngineOutput:
    """New tokens of one generation from one engine step (DELTA semantics)."""

    gen_id: str
    token_ids: tuple[int, ...]
    text: str  # detokenised text of token_ids (may lag for multi-byte characters)
    finished: bool = False  # EOS / max_tokens: the engine will produce no more for this id
    finish_reason: str = ""
    num_cached_tokens: int | None = None  # set on the first output after add(): prefix-cache hits


@dataclass(frozen=True, slots=True)
class StepRecord:
    """What one engine iteration did and how long it took: the simulator's cost-model inputs
    (`LatencyProfile.step_s`) next to the measured time, so a profile can be fitted on, and
    checked against, real serving steps (`timelyllm profile fit --from-serving`)."""

    start_s: float  # engine clock (perf_counter for vLLM, virtual for the simulator)
    duration_s: float  # the engine iteration
    post_s: float  # after it, inside the adapter: detokenising and bookkeeping
    seqs: int
    prefill_tokens: int  # uncached prompt tokens computed in this step
    prefill_context_tokens: int  # cached tokens those prefills attend to
    context_tokens: int  # all sequences' lengths
    adds: int  # generations in their first step after add() (new or resumed)
    output_tokens: int


def gaps_before(records: Sequence[StepRecord]) -> list[tuple[float, StepRecord]]:
    """(time from the end of the previous iteration to its start, the iteration) for every
    iteration after the first."""
    return [(b.start_s - (a.start_s + a.duration_s + a.post_s), b) for a, b in zip(records, records[1:])]


def host_gaps(records: Sequence[StepRecord], idle_s: float = 0.004) -> list[float]:
    """Time from the end of one iteration to the start of the next when the serving loop did not
    idle in between (it sleeps up to 5 ms when it has nothing to run): the planner's host work."""
    return [g for g, _ in gaps_before(records) if 0 <= g < idle_s]


@dataclass(frozen=True, slots=True)
class EngineStats:
    """What the batch-size controller reads: KV capacity/usage and recent decode speed."""

    kv_total_blocks: int
    kv_free_blocks: int
    block_size: int
    running: int
    tokens_per_s: float  # recent decode speed of one sequence (tokens / s), 0 if unknown
    healthy: bool = True


class Tokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class Engine(Protocol):
    """Step-level LLM engine.  KV handling on abort: "cache" (vLLM: freed, stays in the prefix
    cache until evicted), "discard" (freed and not expected back soon), "preserve" (kept resident),
    "swap" (moved to host memory).  Engines that cannot honour a mode fall back to "cache" and
    say so in `kv_modes`."""

    tokenizer: Tokenizer
    kv_modes: frozenset[str]  # the KV modes `abort` honours (the others are served as "cache")
    # how the engine orders what it holds: "fcfs" or "priority" (vLLM's priority scheduling: `add`
    # takes `priority=`); None: it cannot say (a pool of engines that disagree).  The planner
    # refuses a policy that needs "priority" on an engine that says otherwise.
    scheduling_policy: str | None

    def add(self, gen_id: str, prompt_ids: Sequence[int], max_tokens: int) -> None:
        """Start (or resume) a generation from these token ids.  Engines started with priority
        scheduling (vLLM's `scheduling_policy="priority"`) also take `priority=` (an int, lower
        first); the planner passes it only when its policy asks for that scheduling."""
        ...

    def abort(self, gen_id: str, kv: str = "cache") -> None:
        """Stop a generation now (suspend); tokens after this are not reported."""
        ...

    def step(self) -> list[EngineOutput]:
        """Run one engine iteration over the generations it holds; returns their new tokens."""
        ...

    def has_unfinished(self) -> bool:
        """Whether any generation it holds has tokens left to produce."""
        ...

    def stats(self) -> EngineStats:
        """KV capacity and usage now, recent decode speed, health (`healthy` False: it failed)."""
        ...

    def shutdown(self) -> None:
        """Release the engine (processes, memory); no call follows."""
        ...


class EngineFleet(abc.ABC):
    """An `Engine` made of several member engines (an engine pool): the planner asks it where a
    generation may run and checks the batch-size controller per member.  A member that fails
    is dropped; the generations it was running come back from `take_lost` and are re-queued
    (they resume from their token records on another member, re-prefilling).

    A pool declares itself by subclassing this (the planner admits per member only for an
    engine that is an `EngineFleet`: `core.planner_engine.as_fleet`) and implements `Engine` as well."""

    @abc.abstractmethod
    def members(self) -> list[str]:
        """Names of the members that are still usable, in a fixed order."""
        ...

    @abc.abstractmethod
    def member_of(self, gen_id: str) -> str | None:
        """The member running gen_id, or None."""
        ...

    @abc.abstractmethod
    def member_stats(self, member: str) -> EngineStats:
        """That member's `Engine.stats()` (the batch-size controller admits per member)."""
        ...

    @abc.abstractmethod
    def preference(self, gen_id: str, prompt_ids: Sequence[int]) -> list[str]:
        """Usable members for this generation, best first (KV affinity, then load and prefix)."""
        ...

    @abc.abstractmethod
    def assign(self, gen_id: str, member: str) -> None:
        """The next `add` of gen_id goes to this member."""
        ...

    @abc.abstractmethod
    def member_steps(self) -> list[tuple[float, int]]:
        """(duration s, outputs) of each member iteration that ended in the last `step` (the
        policy's step-time model learns one engine's step from these, not from the pool's)."""
        ...

    @abc.abstractmethod
    def take_lost(self) -> list[tuple[str, str]]:
        """(gen_id, reason) of running generations whose member failed since the last call."""
        ...
