"""Remaining-output-length predictors for Trail (SPRPT with limited preemption).

Three implementations of one small interface:

* ``OraclePredictor``: the simulator knows the reference reply, so the true remaining length.
* ``NoisyOraclePredictor``: true total length + N(0, p·length) drawn once per request (seeded by
  the request id, so every policy run sees the same error), as in prediction-error studies.
* ``LearnedPredictor``: runs here, no oracle.  Trail probes the LLM's layer-11 hidden state after
  every token; stock vLLM does not return hidden states, so the observation is a classifier over
  what the planner *does* have: hashed bag-of-words of the prompt (task, scene, robot type) and of
  the text generated so far, plus the age.  Its bin probabilities p_t feed the paper's Bayesian
  update ``q_t ∝ (Tᵀ q_{t-1}) ⊙ p_t`` where T moves mass from bin i to i−1 (one token consumed:
  T_ii = 1 − 1/|B_i|, T_i,i−1 = 1/|B_i|); prediction = Σ q_t[i]·mid_i.  The model is a one-hidden-
  layer MLP in numpy, trained by ``scripts/train_length_predictor.py``.

All state lives in the generation (``Generation.policy.length``, a `LengthState`), so the predictor is stateless
and one instance can serve many planners.  Pure: no I/O except ``LearnedPredictor.load``.
"""

from __future__ import annotations

import json
import math
import random
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol, Sequence

import numpy as np

from ..paths import data_dir
from .policy_state import LengthState
from .types import Generation, PlanRequest

DEFAULT_MODEL_DIR = data_dir("models") / "length-predictor"


class PredictorError(ValueError):
    """A predictor cannot be built (bad parameters, missing or malformed model files)."""


class LengthPredictor(Protocol):
    name: str

    def initial(self, g: Generation) -> float:
        """r0: predicted total output tokens, from what is known at arrival."""
        ...

    def remaining(self, g: Generation) -> float:
        """Predicted output tokens still to generate now."""
        ...

    def observe(self, g: Generation, n_new: int) -> None:
        """``n_new`` tokens were just generated for g (g.output_ids / g.text already updated)."""
        ...


def age(g: Generation) -> int:
    """Generated tokens so far (Trail's job age, in tokens)."""
    return len(g.output_ids)


# --- oracle ---------------------------------------------------------------------------------------

def _default_counter() -> Callable[[str], int]:
    from .tokenizer import SimTokenizer

    tok = SimTokenizer()
    return tok.count


class OraclePredictor:
    """True remaining length from the request's reference reply (simulator only)."""

    name = "oracle"

    def __init__(self, count_tokens: Callable[[str], int] | None = None) -> None:
        self._count = count_tokens or _default_counter()

    def true_length(self, request: PlanRequest) -> int:
        if request.reference_plan is None:
            raise PredictorError(f"request {request.request_id!r} has no reference_plan: the oracle "
                                 "predictor needs the simulator's reference reply (use 'learned')")
        return self._count(request.reference_plan) + 1  # + EOS

    def total(self, g: Generation) -> float:
        st = g.policy.length
        if st.total is None:
            st.total = float(self.true_length(g.request))
        return st.total

    def initial(self, g: Generation) -> float:
        return self.total(g)

    def remaining(self, g: Generation) -> float:
        return max(1.0, self.total(g) - age(g))

    def observe(self, g: Generation, n_new: int) -> None:
        pass


class NoisyOraclePredictor(OraclePredictor):
    """Oracle length + N(0, p·length), one draw per request, seeded by (seed, request id)."""

    name = "noisy"

    def __init__(self, p: float = 0.3, seed: int = 0, count_tokens: Callable[[str], int] | None = None) -> None:
        if not (isinstance(p, (int, float)) and math.isfinite(p) and p >= 0):
            raise PredictorError(f"noise p must be a finite number >= 0, got {p!r}")
        super().__init__(count_tokens)
        self.p = float(p)
        self.seed = int(seed)

    def total(self, g: Generation) -> float:
        st = g.policy.length
        if st.total is None:
            true = self.true_length(g.request)
            rng = random.Random(zlib.crc32(f"{self.seed}:{g.request.request_id}".encode()))
            st.total = max(1.0, true + rng.gauss(0.0, self.p * true))
        return st.total


# --- bins and the Bayesian refinement -------------------------------------------------------------

@dataclass(frozen=True)
class Bins:
    """Bins of remaining length; bin i covers [edges[i], edges[i+1]) (the last one is closed)."""

    edges: tuple[float, ...]

    def __post_init__(self) -> None:
        e = self.edges
        if len(e) < 2 or any(b <= a for a, b in zip(e, e[1:])) or e[0] != 0:
            raise PredictorError(f"bin edges must start at 0 and increase strictly, got {e!r}")

    @classmethod
    def equal(cls, k: int = 8, max_len: float = 256.0) -> "Bins":
        if k < 1 or max_len <= 0:
            raise PredictorError("need k >= 1 bins over a positive range")
        return cls(tuple(max_len * i / k for i in range(k + 1)))

    @property
    def k(self) -> int:
        return len(self.edges) - 1

    @property
    def mids(self) -> np.ndarray:
        e = np.asarray(self.edges)
        return (e[:-1] + e[1:]) / 2

    def index(self, length: float) -> int:
        """Bin of a length; lengths past the last edge go to the last bin."""
        for i in range(self.k):
            if length < self.edges[i + 1]:
                return i
        return self.k - 1

    def transition(self) -> np.ndarray:
        """T[i, j]: probability that remaining length in bin i is in bin j after one token.

        Uniform within a bin: it leaves bin i for i−1 with probability 1/|B_i|; bin 0 keeps its
        mass (the generation ends there)."""
        k = self.k
        T = np.zeros((k, k))
        widths = np.diff(np.asarray(self.edges))
        T[0, 0] = 1.0
        for i in range(1, k):
            w = max(1.0, widths[i])
            T[i, i] = 1.0 - 1.0 / w
            T[i, i - 1] = 1.0 / w
        return T


def bayes_update(q: np.ndarray, p: np.ndarray | None, T: np.ndarray, floor: float = 1e-4) -> np.ndarray:
    """One token: q ∝ (Tᵀ q) ⊙ p (p None: no fresh observation, transition only).

    The floor keeps every bin reachable, so one confident wrong observation cannot zero out the
    truth forever (the paper adds a probability floor too)."""
    prior = T.T @ q
    post = prior if p is None else prior * np.maximum(p, floor)
    post = np.maximum(post, floor * 1e-2)
    return post / post.sum()


# --- features -------------------------------------------------------------------------------------

_WORD_RE = re.compile(r"[a-z]+|[0-9]+")


def _h(token: str, dim: int) -> int:
    return zlib.crc32(token.encode()) % dim


def _bow(words: Sequence[str], prefix: str, dim: int, out: np.ndarray, offset: int) -> None:
    if not words:
        return
    idx = [offset + _h(prefix + w, dim) for w in words]
    np.add.at(out, idx, 1.0)
    seg = out[offset:offset + dim]
    norm = np.linalg.norm(seg)
    if norm > 0:
        seg /= norm


@dataclass(frozen=True)
class FeatureSpec:
    """Hashed bag-of-words of the prompt (task + scene, incl. bigrams) and of the generated text,
    robot type, and age features.  Dimensions are part of the saved model."""

    prompt_dim: int = 256
    output_dim: int = 128
    age_scale: float = 64.0  # age features: age/scale, log1p(age)/log1p(4·scale)

    @property
    def dim(self) -> int:
        return self.prompt_dim + self.output_dim + 4

    def vector(self, robot_type: str, task: str, scene: str, output_text: str, age_tokens: int) -> np.ndarray:
        x = np.zeros(self.dim)
        pw = _WORD_RE.findall(f"{task} {scene}".lower())
        words = pw + [a + "_" + b for a, b in zip(pw, pw[1:])] + ["robot=" + robot_type]
        _bow(words, "p:", self.prompt_dim, x, 0)
        ow = _WORD_RE.findall(output_text.lower())
        _bow(ow, "o:", self.output_dim, x, self.prompt_dim)
        o = self.prompt_dim + self.output_dim
        sentences = len(re.findall(r"[.!?;](\s|$)", output_text))
        x[o] = age_tokens / self.age_scale
        x[o + 1] = math.log1p(age_tokens) / math.log1p(4 * self.age_scale)
        x[o + 2] = sentences / 8.0
        x[o + 3] = 1.0  # bias-like constant
        return x


# --- the learned model ----------------------------------------------------------------------------

@dataclass
class MLP:
    """x -> ReLU(x W1 + b1) W2 + b2 -> softmax over bins (Trail's probe shape, smaller)."""

    W1: np.ndarray
    b1: np.ndarray
    W2: np.ndarray
    b2: np.ndarray

    def proba(self, X: np.ndarray) -> np.ndarray:
        X = np.atleast_2d(X)
        h = np.maximum(0.0, X @ self.W1 + self.b1)
        z = h @ self.W2 + self.b2
        z -= z.max(axis=1, keepdims=True)
        e = np.exp(z)
        return e / e.sum(axis=1, keepdims=True)

    @classmethod
    def train(cls, X: np.ndarray, y: np.ndarray, k: int, hidden: int = 64, epochs: int = 30,
              batch: int = 64, lr: float = 0.01, weight_decay: float = 1e-4, seed: int = 0) -> "MLP":
        """AdamW + cosine learning rate, cross-entropy (the paper's recipe, at toy scale)."""
        rng = np.random.default_rng(seed)
        n, d = X.shape
        params = [rng.normal(0, math.sqrt(2.0 / d), (d, hidden)), np.zeros(hidden),
                  rng.normal(0, math.sqrt(1.0 / hidden), (hidden, k)), np.zeros(k)]
        m = [np.zeros_like(p) for p in params]
        v = [np.zeros_like(p) for p in params]
        b1_, b2_, eps = 0.9, 0.999, 1e-8
        steps = epochs * math.ceil(n / batch)
        t = 0
        for _ in range(epochs):
            order = rng.permutation(n)
            for s in range(0, n, batch):
                idx = order[s:s + batch]
                xb, yb = X[idx], y[idx]
                W1, b1, W2, b2 = params
                hpre = xb @ W1 + b1
                h = np.maximum(0.0, hpre)
                z = h @ W2 + b2
                z -= z.max(axis=1, keepdims=True)
                pr = np.exp(z)
                pr /= pr.sum(axis=1, keepdims=True)
                pr[np.arange(len(yb)), yb] -= 1.0
                dz = pr / len(yb)
                gW2 = h.T @ dz
                gb2 = dz.sum(0)
                dh = (dz @ W2.T) * (hpre > 0)
                gW1 = xb.T @ dh
                gb1 = dh.sum(0)
                t += 1
                lr_t = lr * 0.5 * (1 + math.cos(math.pi * t / steps))
                for i, g in enumerate((gW1, gb1, gW2, gb2)):
                    m[i] = b1_ * m[i] + (1 - b1_) * g
                    v[i] = b2_ * v[i] + (1 - b2_) * g * g
                    mh = m[i] / (1 - b1_ ** t)
                    vh = v[i] / (1 - b2_ ** t)
                    params[i] -= lr_t * (mh / (np.sqrt(vh) + eps) + weight_decay * params[i])
        return cls(*params)


class LearnedPredictor:
    """Prompt + generated-text classifier refined by Trail's Bayesian bin update (runs here)."""

    name = "learned"

    def __init__(self, model: MLP, bins: Bins, features: FeatureSpec = FeatureSpec(),
                 refresh_every: int = 1, floor: float = 1e-4) -> None:
        if refresh_every < 1:
            raise PredictorError(f"refresh_every must be >= 1, got {refresh_every}")
        if model.W1.shape[0] != features.dim or model.W2.shape[1] != bins.k:
            raise PredictorError(f"model shape {model.W1.shape}->{model.W2.shape} does not match "
                                 f"{features.dim} features / {bins.k} bins")
        self.model, self.bins, self.features = model, bins, features
        self.refresh_every = refresh_every
        self.floor = floor
        self._T = bins.transition()
        self._mids = bins.mids

    # persistence ----------------------------------------------------------------------------------
    @classmethod
    def load(cls, model_dir: str | Path = DEFAULT_MODEL_DIR, **kw) -> "LearnedPredictor":
        d = Path(model_dir)
        try:
            meta = json.loads((d / "meta.json").read_text())
            with np.load(d / "weights.npz") as w:
                model = MLP(w["W1"], w["b1"], w["W2"], w["b2"])
            bins = Bins(tuple(float(e) for e in meta["bins"]))
            feats = FeatureSpec(**meta["features"])
        except (OSError, KeyError, ValueError, TypeError) as e:
            raise PredictorError(f"cannot load length predictor from {d}: {e}") from e
        return cls(model, bins, feats, **kw)

    def save(self, model_dir: str | Path, extra_meta: dict | None = None) -> None:
        d = Path(model_dir)
        d.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(d / "weights.npz", W1=self.model.W1.astype(np.float32),
                            b1=self.model.b1.astype(np.float32), W2=self.model.W2.astype(np.float32),
                            b2=self.model.b2.astype(np.float32))
        f = self.features
        meta = {"bins": list(self.bins.edges),
                "features": {"prompt_dim": f.prompt_dim, "output_dim": f.output_dim, "age_scale": f.age_scale}}
        meta.update(extra_meta or {})
        (d / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")

    # prediction -----------------------------------------------------------------------------------
    def features_of(self, request: PlanRequest, output_text: str, age_tokens: int) -> np.ndarray:
        return self.features.vector(request.robot_type, request.task, request.scene, output_text, age_tokens)

    def observe_proba(self, request: PlanRequest, output_text: str, age_tokens: int) -> np.ndarray:
        return self.model.proba(self.features_of(request, output_text, age_tokens))[0]

    def _st(self, g: Generation) -> LengthState:
        st = g.policy.length
        if st.q is None:
            p0 = self.observe_proba(g.request, "", 0)
            st.q = p0
            st.r0 = float(self._mids[int(np.argmax(p0))])  # Trail: midpoint of the predicted bin
            st.seen = 0
        return st

    def initial(self, g: Generation) -> float:
        return self._st(g).r0

    def remaining(self, g: Generation) -> float:
        st = self._st(g)
        self._catch_up(g, st)
        return max(1.0, float(st.q @ self._mids))

    def observe(self, g: Generation, n_new: int) -> None:
        self._catch_up(g, self._st(g))

    def _catch_up(self, g: Generation, st: LengthState) -> None:
        """One Bayesian step per generated token not yet seen.  The classifier observes the latest
        text when at least ``refresh_every`` tokens passed since its last observation (skipped
        tokens get the transition only: their text is gone)."""
        a = age(g)
        seen = st.seen
        if a <= seen:
            return
        q = st.q
        for t in range(seen + 1, a + 1):
            p = None
            if t == a and t - st.last_obs >= self.refresh_every:
                p = self.observe_proba(g.request, g.text, t)
                st.last_obs = t
            q = bayes_update(q, p, self._T, self.floor)
        st.q, st.seen = q, a

    def predict_trajectory(self, request: PlanRequest, texts: Sequence[str]) -> list[float]:
        """Remaining-length predictions at ages 0..len(texts)-1 (texts[a] = output text after a
        tokens) — the offline evaluation path of the training script."""
        obs_ages = [0] + [a for a in range(self.refresh_every, len(texts), self.refresh_every)]
        X = np.stack([self.features_of(request, texts[a] if a else "", a) for a in obs_ages])
        P = dict(zip(obs_ages, self.model.proba(X)))
        q = P[0]
        out = [float(q @ self._mids)]
        for a in range(1, len(texts)):
            q = bayes_update(q, P.get(a), self._T, self.floor)
            out.append(float(q @ self._mids))
        return out


def make_predictor(kind: str = "learned", **params) -> LengthPredictor:
    """By name: oracle | noisy (p, seed) | learned (model_dir, refresh_every)."""
    if kind == "oracle":
        return OraclePredictor(**params)
    if kind == "noisy":
        return NoisyOraclePredictor(**params)
    if kind == "learned":
        model_dir = params.pop("model_dir", DEFAULT_MODEL_DIR)
        return LearnedPredictor.load(model_dir, **params)
    raise PredictorError(f"unknown length predictor {kind!r}; choose oracle, noisy or learned")
