"""Known-batch workloads for the offline planner: a file of requests, or a seeded generator.

File format (YAML or JSON)::

    name: gsm8k_llama65b              # optional
    slots: 200                        # concurrency slots J (clients / max batch)
    latency:                          # optional; PD-competition latency model (paper's fit)
      prefill_ms_per_token: 0.13
      prefill_base_ms: 25
      decode_ms_per_token: 0.21       # per sequence in a decode round
      decode_base_ms: 29
      prefill_cap_tokens: null        # max tokens in one prefill stage (null: unlimited)
    requests:                         # explicit list ...
      - {id: r0, input_tokens: 70, output_tokens: 300}
    generate:                         # ... or generated (seeded), e.g. the paper's GSM8K setting
      n: 1319
      seed: 0
      input: {mean: 68.43, std: 25.04, min: 1}
      output: {mean: 344.83, std: 187.99, min: 1, max: 512}

`output_tokens` is what the simulated LLM will produce; `est_output_tokens` (optional, default
equal) is what the planner is told.  Generated lengths follow a normal distribution clipped to
[min, max] whose parameters are fitted so that the *clipped* lengths have the stated mean and
standard deviation (the paper reports statistics after its 512-token cap).
"""

from __future__ import annotations

import json
import math
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..workloads.format import WORKLOADS_DIR
from .makespan import PlanError

_ID_RE = re.compile(r"^[A-Za-z0-9_.:/-]{1,128}$")
MAX_REQUESTS = 1_000_000


@dataclass(frozen=True, slots=True)
class BatchRequest:
    id: str
    input_tokens: int
    output_tokens: int
    est_output_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


@dataclass(frozen=True, slots=True)
class PDLatency:
    """Iteration latency under PD competition (paper §V-A fit on LLaMA-65B / 8 Ascend NPUs)."""

    prefill_s_per_token: float = 0.13e-3
    prefill_base_s: float = 0.025
    decode_s_per_token: float = 0.21e-3
    decode_base_s: float = 0.029
    prefill_cap_tokens: int | None = None

    def prefill(self, tokens: int) -> float:
        return self.prefill_base_s + self.prefill_s_per_token * tokens

    def decode(self, sequences: int) -> float:
        return self.decode_base_s + self.decode_s_per_token * sequences


@dataclass(frozen=True, slots=True)
class Batch:
    name: str
    slots: int
    latency: PDLatency
    requests: tuple[BatchRequest, ...]


def _clipped_normal_moments(mu: float, s: float, lo: float, hi: float) -> tuple[float, float]:
    """Mean and variance of clip(N(mu, s^2), lo, hi)."""
    a, b = (lo - mu) / s, (hi - mu) / s
    Phi = lambda x: 0.5 * (1 + math.erf(x / math.sqrt(2)))  # noqa: E731
    phi = lambda x: math.exp(-x * x / 2) / math.sqrt(2 * math.pi)  # noqa: E731
    pa, pb = Phi(a), Phi(b)
    mid = pb - pa
    m1 = lo * pa + hi * (1 - pb) + mu * mid + s * (phi(a) - phi(b))
    m2 = (lo * lo * pa + hi * hi * (1 - pb) + (mu * mu + s * s) * mid + 2 * mu * s * (phi(a) - phi(b))
          + s * s * (a * phi(a) - b * phi(b)))
    return m1, max(0.0, m2 - m1 * m1)


def fit_clipped_normal(mean: float, std: float, lo: float, hi: float) -> tuple[float, float]:
    """(mu, sigma) of a normal whose clip to [lo, hi] has the given mean and std."""
    if not (lo < mean < hi) or std <= 0:
        raise PlanError(f"cannot fit mean {mean} / std {std} inside [{lo}, {hi}]")
    if std * std >= (mean - lo) * (hi - mean):
        raise PlanError(f"std {std} too large for mean {mean} inside [{lo}, {hi}]")
    mu, s = mean, std
    for _ in range(500):
        m, v = _clipped_normal_moments(mu, s, lo, hi)
        sd = math.sqrt(v)
        if abs(m - mean) < 1e-6 and abs(sd - std) < 1e-6:
            break
        mu += mean - m
        s *= std / sd if sd > 0 else 2.0
    return mu, s


def generate_requests(n: int, seed: int, inp: dict, out: dict) -> list[BatchRequest]:
    """Seeded GSM8K-like batch: clipped normal input and output lengths (integers)."""
    rng = random.Random(seed)
    dists = []
    for d in (inp, out):
        lo = float(d.get("min", 1))
        hi = float(d.get("max", 1e9))
        if hi < 1e9:
            mu, s = fit_clipped_normal(float(d["mean"]), float(d["std"]), lo, hi)
        else:
            mu, s = float(d["mean"]), float(d["std"])
        dists.append((mu, s, lo, hi))
    reqs = []
    for i in range(n):
        vals = []
        for mu, s, lo, hi in dists:
            vals.append(int(round(min(hi, max(lo, rng.gauss(mu, s))))))
        reqs.append(BatchRequest(f"r{i}", vals[0], vals[1], vals[1]))
    return reqs


def _pos_int(v: Any, where: str, *, zero: bool = False) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < (0 if zero else 1):
        raise PlanError(f"{where} must be an integer >= {0 if zero else 1}, got {v!r}")
    return v


def _pos_num(v: Any, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise PlanError(f"{where} must be a number >= 0, got {v!r}")
    return float(v)


def parse_batch(data: Any, source: str = "<batch>") -> Batch:
    """Validate an (untrusted) batch mapping."""
    if not isinstance(data, dict):
        raise PlanError(f"{source}: top level must be a mapping")
    extra = set(data) - {"name", "description", "slots", "latency", "requests", "generate"}
    if extra:
        raise PlanError(f"{source}: unknown keys {sorted(extra)}")
    slots = _pos_int(data.get("slots"), f"{source}: slots")
    lat = data.get("latency") or {}
    if not isinstance(lat, dict):
        raise PlanError(f"{source}: latency must be a mapping")
    known = {"prefill_ms_per_token", "prefill_base_ms", "decode_ms_per_token", "decode_base_ms",
             "prefill_cap_tokens"}
    if set(lat) - known:
        raise PlanError(f"{source}: latency has unknown keys {sorted(set(lat) - known)}")
    cap = lat.get("prefill_cap_tokens")
    latency = PDLatency(
        prefill_s_per_token=_pos_num(lat.get("prefill_ms_per_token", 0.13), "prefill_ms_per_token") / 1e3,
        prefill_base_s=_pos_num(lat.get("prefill_base_ms", 25), "prefill_base_ms") / 1e3,
        decode_s_per_token=_pos_num(lat.get("decode_ms_per_token", 0.21), "decode_ms_per_token") / 1e3,
        decode_base_s=_pos_num(lat.get("decode_base_ms", 29), "decode_base_ms") / 1e3,
        prefill_cap_tokens=None if cap is None else _pos_int(cap, f"{source}: prefill_cap_tokens"),
    )
    has_list, has_gen = "requests" in data, "generate" in data
    if has_list == has_gen:
        raise PlanError(f"{source}: give exactly one of 'requests' or 'generate'")
    if has_list:
        raw = data["requests"]
        if not isinstance(raw, list) or not raw:
            raise PlanError(f"{source}: requests must be a non-empty list")
        if len(raw) > MAX_REQUESTS:
            raise PlanError(f"{source}: more than {MAX_REQUESTS} requests")
        reqs, seen = [], set()
        for k, r in enumerate(raw):
            where = f"{source}: requests[{k}]"
            if not isinstance(r, dict):
                raise PlanError(f"{where} must be a mapping")
            if set(r) - {"id", "input_tokens", "output_tokens", "est_output_tokens"}:
                raise PlanError(f"{where} has unknown keys")
            rid = str(r.get("id", f"r{k}"))
            if not _ID_RE.match(rid) or rid in seen:
                raise PlanError(f"{where}: id {rid!r} is invalid or duplicate")
            seen.add(rid)
            n_in = _pos_int(r.get("input_tokens"), f"{where}.input_tokens")
            n_out = _pos_int(r.get("output_tokens"), f"{where}.output_tokens")
            est = _pos_int(r.get("est_output_tokens", n_out), f"{where}.est_output_tokens")
            reqs.append(BatchRequest(rid, n_in, n_out, est))
    else:
        g = data["generate"]
        if not isinstance(g, dict):
            raise PlanError(f"{source}: generate must be a mapping")
        n = _pos_int(g.get("n"), f"{source}: generate.n")
        if n > MAX_REQUESTS:
            raise PlanError(f"{source}: generate.n above {MAX_REQUESTS}")
        seed = _pos_int(g.get("seed", 0), f"{source}: generate.seed", zero=True)
        dists = []
        for key in ("input", "output"):
            d = g.get(key)
            if not isinstance(d, dict) or "mean" not in d or "std" not in d:
                raise PlanError(f"{source}: generate.{key} needs mean and std")
            for f in ("mean", "std", "min", "max"):
                if f in d:
                    _pos_num(d[f], f"{source}: generate.{key}.{f}")
            dists.append(d)
        reqs = generate_requests(n, seed, dists[0], dists[1])
    return Batch(name=str(data.get("name", Path(source).stem)), slots=slots, latency=latency,
                 requests=tuple(reqs))


def load_batch(path: str | Path) -> Batch:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        hint = (f" ({path} is an LRTrace workload for `timelyllm bench`; plan-offline takes a batch file such "
                f"as workloads/hybrid_gsm8k.yaml)" if (WORKLOADS_DIR / f"{path}.yaml").is_file() else "")
        raise PlanError(f"{path}: cannot read batch workload: {e.strerror or e}{hint}") from e
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except ValueError as e:
        raise PlanError(f"{path}: cannot read batch workload: not valid JSON: {e}") from e
    except yaml.YAMLError as e:
        from ..core.robots import yaml_error_line

        raise PlanError(f"{path}{yaml_error_line(e, 'cannot read batch workload: not valid YAML')}") from e
    return parse_batch(data, str(path))
