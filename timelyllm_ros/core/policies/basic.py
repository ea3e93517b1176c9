"""Baselines of the paper: segmented FCFS and EDF, and the engine-level vLLM / vLLM-stream."""

from __future__ import annotations

from .base import DispatchMode, Policy


class FCFS(Policy):
    """Segmented first-come first-served; suspended generations keep their initial priority."""

    name = "fcfs"

    def priority(self, g, ctx, now):
        return -g.request.arrival


class EDF(Policy):
    """Segmented earliest-deadline-first, deadline = arrival + ERT (kept for suspended ones)."""

    name = "edf"

    def priority(self, g, ctx, now):
        return -(g.request.arrival + g.request.tuf.ert)


class VLLM(FCFS):
    """vLLM as is: FCFS continuous batching, whole plan generated, then executed."""

    name = "vllm"
    mode = DispatchMode.WHOLE


class VLLMStream(FCFS):
    """vLLM with streaming: each statement is dispatched as soon as generated; never suspends."""

    name = "vllm-stream"
    mode = DispatchMode.STREAM
