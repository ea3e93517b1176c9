"""Measurements the batch-size controller reads from a real vLLM engine.

Kept apart from the adapter so the arithmetic (EWMA of per-sequence decode speed, KV blocks from
vLLM's usage fraction) is importable and testable without vLLM installed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class DecodeSpeed:
    """EWMA of one sequence's decode speed (tokens/s), from measured engine-step durations.

    A step that gives `seqs` running sequences `tokens` new tokens in `dt` seconds means each
    sequence advanced tokens/seqs tokens in dt: that per-sequence rate is what a WCET estimate
    "(tokens left) / (tokens per second)" needs, batch interference included.
    """

    alpha: float = 0.2
    value: float = 0.0
    samples: int = 0

    def update(self, tokens: int, seqs: int, dt: float) -> None:
        if tokens <= 0 or seqs <= 0 or dt <= 0:
            return
        rate = tokens / seqs / dt
        self.value = rate if self.samples == 0 else self.alpha * rate + (1 - self.alpha) * self.value
        self.samples += 1


def free_blocks_from_usage(usage: float, usable_blocks: int) -> int:
    """vLLM reports usage = 1 - free / (num_gpu_blocks - 1); invert it (free includes cached,
    evictable blocks: exactly what a new request can claim)."""
    usage = min(max(float(usage), 0.0), 1.0)
    return int(round((1.0 - usage) * usable_blocks))


class KvUsageSink:
    """Latest scheduler stats as seen by vLLM's stat-logger hook (works in every vLLM mode,
    including a separate engine-core process where the scheduler is not reachable)."""

    def __init__(self) -> None:
        self.kv_cache_usage: float | None = None
        self.num_running: int = 0
        self.num_waiting: int = 0
        self.prefix_queries: int = 0
        self.prefix_hits: int = 0
        self.records: int = 0

    def update(self, scheduler_stats: Any) -> None:
        if scheduler_stats is None:
            return
        self.kv_cache_usage = float(scheduler_stats.kv_cache_usage)
        self.num_running = int(scheduler_stats.num_running_reqs)
        self.num_waiting = int(scheduler_stats.num_waiting_reqs)
        pcs = getattr(scheduler_stats, "prefix_cache_stats", None)
        if pcs is not None:
            self.prefix_queries += int(getattr(pcs, "queries", 0))
            self.prefix_hits += int(getattr(pcs, "hits", 0))
        self.records += 1


def make_stat_logger_factory(sink: KvUsageSink):
    """A vLLM per-engine StatLoggerFactory (callable (vllm_config, engine_index) -> logger) whose
    loggers write into `sink`.  vLLM is imported lazily: this module must import without it."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class _SinkLogger(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self.engine_index = engine_index

        def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None,
                   engine_idx: int = 0) -> None:
            sink.update(scheduler_stats)

        def log_engine_initialized(self) -> None:
            pass

    def factory(vllm_config: Any, engine_index: int = 0) -> StatLoggerBase:
        return _SinkLogger(vllm_config, engine_index)

    return factory
