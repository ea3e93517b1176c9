"""Latency profiles: the cost model of one engine iteration and the KV memory it runs in.

A profile (profiles/*.yaml) says what a GPU/model pair charges per iteration (core: LAMPS prices KV
handlings with it, core/policies/lamps.py); the simulated engine
(engines/simulated.py) advances its virtual clock by it, and `timelyllm profile fit` fits
one on real serving steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Mapping

from ..paths import data_dir
from .engine import StepRecord

PROFILES_DIR = data_dir("profiles")
DEFAULT_PROFILE = PROFILES_DIR / "rtx4090_llama3_8b.yaml"


class ProfileError(ValueError):
    """A latency profile is malformed; the message names the field."""


@dataclass(frozen=True, slots=True)
class LatencyProfile:
    """Cost model of one engine iteration (seconds) and the KV memory it runs in.

    step time = decode_base_s + decode_s_per_extra_seq * (seqs - 1)
                + decode_s_per_context_token * (context tokens of all seqs in the step)
                + [prefill_base_s + prefill_s_per_token * P   if P > 0 uncached prompt tokens
                   + prefill_s_per_context_token * (cached tokens those prefills attend to)]
                + swap_s_per_block * (blocks copied host<->GPU for this step)
                + tokenize_s * (new requests) + detokenize_s * (tokens output)
                + [add_base_s + add_s_per_seq * A   if A > 0 sequences join the batch in this step]
    The add terms are host time before the step (the engine's request intake: vLLM's input
    processing of a new or resumed prompt, and the planner's resume work), measured as the gap
    between back-to-back iterations; ``record_s`` leaves them out, like tokenising, because a
    measured StepRecord's duration does not contain them.
    Every sequence in the step yields one token (a prefill yields the first token, as in
    Table 1's "Decoding 0 token").
    """

    prefill_s_per_token: float
    decode_base_s: float  # one decode iteration at batch 1, context excluded
    kv_block_size: int  # tokens per KV block
    kv_capacity_blocks: int  # GPU KV blocks
    prefill_base_s: float = 0.0  # fixed cost of an iteration that prefills (launch, scheduling)
    prefill_s_per_context_token: float = 0.0  # a prefill's attention over its cached prefix
    decode_s_per_extra_seq: float = 0.0  # batch scaling: each extra sequence in the iteration
    decode_s_per_context_token: float = 0.0  # attention: KV read per context token per sequence
    swap_s_per_block: float = 0.0  # host<->GPU copy of one block (either direction)
    host_capacity_blocks: int | None = None  # host (CPU) blocks for swapped KV; None = unbounded
    network_latency_s: float = 0.0  # per dispatched segment (used by robots/runner, not here)
    tokenize_s: float = 0.0  # tokenising one new request's prompt (charged once per request)
    add_base_s: float = 0.0  # host time before a step that takes in new or resumed sequences
    add_s_per_seq: float = 0.0  # ... and per such sequence (new request or resumed segment)
    detokenize_s: float = 0.0  # per output token
    name: str = ""
    description: str = ""

    _REQUIRED = ("prefill_s_per_token", "decode_base_s", "kv_block_size", "kv_capacity_blocks")

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in ("name", "description"):
                if not isinstance(v, str):
                    raise ProfileError(f"profile {f.name} must be a string, got {v!r}")
                continue
            if f.name in ("kv_block_size", "kv_capacity_blocks", "host_capacity_blocks"):
                if v is None and f.name == "host_capacity_blocks":
                    continue
                if isinstance(v, bool) or not isinstance(v, int) or v < (0 if f.name == "host_capacity_blocks" else 1):
                    raise ProfileError(f"profile {f.name} must be a positive integer, got {v!r}")
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ProfileError(f"profile {f.name} must be a finite number >= 0, got {v!r}")
        if self.decode_base_s <= 0:
            raise ProfileError("profile decode_base_s must be > 0 (a step must take time)")

    # --- loading --------------------------------------------------------------------------
    @classmethod
    def from_mapping(cls, data: Any, source: str = "<profile>") -> "LatencyProfile":
        if not isinstance(data, Mapping):
            raise ProfileError(f"{source}: a latency profile must be a mapping, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ProfileError(f"{source}: unknown profile keys {unknown}; known: {sorted(known)}")
        missing = [k for k in cls._REQUIRED if k not in data]
        if missing:
            raise ProfileError(f"{source}: missing required profile keys {missing}")
        try:
            return cls(**dict(data))
        except ProfileError as e:
            raise ProfileError(f"{source}: {e}") from None

    @classmethod
    def from_yaml(cls, path: str | Path = DEFAULT_PROFILE) -> "LatencyProfile":
        path = Path(path)
        from .robots import read_yaml_file

        data = read_yaml_file(path, "latency profile", ProfileError)
        return cls.from_mapping(data, str(path))

    # the terms that are time on the engine's machine (``scaled`` multiplies these; the network
    # and the KV geometry are not the engine's speed)
    TIME_TERMS = ("prefill_s_per_token", "decode_base_s", "prefill_base_s", "prefill_s_per_context_token",
                  "decode_s_per_extra_seq", "decode_s_per_context_token", "swap_s_per_block", "tokenize_s",
                  "detokenize_s", "add_base_s", "add_s_per_seq")

    def scaled(self, speed: float) -> "LatencyProfile":
        """This profile on a machine whose iterations take ``speed`` times as long (0.5: twice as
        fast): every engine time term is multiplied by it; network latency and KV memory stay.
        Fidelity checks calibrate a fitted profile's speed with it (`report.engine_speed` of a
        probe served in the same minutes gives ``speed``)."""
        if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not (math.isfinite(speed) and speed > 0):
            raise ProfileError(f"profile speed factor must be a finite number > 0, got {speed!r}")
        return replace(self, **{k: getattr(self, k) * speed for k in self.TIME_TERMS})

    # --- cost model -------------------------------------------------------------------------
    def record_s(self, r: StepRecord, *, new_requests: int = 0) -> float:
        """What this profile charges for the iteration a StepRecord describes (profile fitting
        and fidelity checks compare it with the measured time)."""
        return self.step_s(seqs=r.seqs, prefill_tokens=r.prefill_tokens, context_tokens=r.context_tokens,
                           new_requests=new_requests, output_tokens=r.output_tokens,
                           prefill_context_tokens=r.prefill_context_tokens)

    def intake_s(self, adds: int) -> float:
        """Host time before a step that takes in ``adds`` new or resumed sequences (0 for none)."""
        return self.add_base_s + self.add_s_per_seq * adds if adds > 0 else 0.0

    def step_s(self, *, seqs: int, prefill_tokens: int = 0, context_tokens: int = 0,
               swap_blocks: int = 0, new_requests: int = 0, output_tokens: int | None = None,
               prefill_context_tokens: int = 0, adds: int = 0) -> float:
        """Modelled duration of one iteration (see the class docstring)."""
        if seqs <= 0 and prefill_tokens <= 0 and swap_blocks <= 0:
            return 0.0
        t = 0.0
        if seqs > 0:
            t += self.decode_base_s + self.decode_s_per_extra_seq * (seqs - 1)
            t += self.decode_s_per_context_token * context_tokens
        if prefill_tokens > 0:
            t += self.prefill_base_s + self.prefill_s_per_token * prefill_tokens
            t += self.prefill_s_per_context_token * prefill_context_tokens
        t += self.swap_s_per_block * swap_blocks
        t += self.tokenize_s * new_requests
        t += self.intake_s(adds)
        t += self.detokenize_s * (seqs if output_tokens is None else output_tokens)
        return t
