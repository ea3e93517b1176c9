"""`QoEBatch.at` with projected streams, fused into one compiled loop (numba).

Andes scores every live request at each of up to 8 candidate batch sizes per scheduling point:
~40 numpy passes over an 8 × 1,000 array, ~0.3 ms at 1,000 ready generations (most of its point).
This loop does the same operations on the same float64 values in the same order per element, so
the results are the same bits (IEEE arithmetic, numba's default: no fast-math, no contraction into
fused multiply-adds; tests/test_scheduling_fastpaths.py checks it against `QoEBatch.at` and the
scalar `qoe_of_runs`).  numba comes with vLLM; without it `stream_rows` returns None and callers
use the numpy form.  Compiled at first use (cached in __pycache__ when writable).
"""

from __future__ import annotations

import math

import numpy as np

_EPS = 1e-9  # core/qoe.py's
_kernel = None  # the compiled loop; False when numba is not importable
_ema = None
_at = None


def _qoe_point(e, dli, sai, lai, pni, st, ui, T):  # pragma: no cover - compiled
    """QoE so far at T of one request: `e` tokens expected by then, `dli` delivered, `sai` / `lai`
    its sum of and last delivery times, `pni` its next delivery's time; tokens expected but not
    delivered count as consumed at max(pni, T) (QoEBatch.at's operations, in its order)."""
    missing = e - dli
    if missing > 0:  # expected but not delivered: consumed "at T"
        a1 = pni if pni > T else T
        t = missing * a1
        t += sai
        sai = t
        lai = a1
        nn = e
    else:
        nn = dli
    s_ideal = nn * st
    t = ui * nn
    t *= nn - 1
    t /= 2
    s_ideal += t
    d = sai - s_ideal
    s_delay = d if d > 0.0 else 0.0
    s_whole = nn * lai
    s_whole -= s_ideal
    y = s_delay / s_whole
    y = 1.0 - y
    y = y if y > 0.0 else 0.0
    return 1.0 if (nn == 0 or s_whole <= _EPS) else y


_point = _qoe_point  # compiled by warm() before the loops that call it by this name


def _loop(sa, pn, la, dl, start, u, expected, pending, s, cnt, iv, T, out):  # pragma: no cover - compiled
    """out[r, i] = QoE so far at T of request i with stream r = (s[r], pending[i] + cnt[r], iv[r])
    appended.  Written like QoEBatch.at's general branch per element (its shortcuts give the same
    values where they apply)."""
    k = s.shape[0]
    n = sa.shape[0]
    for r in range(k):
        s_r = s[r]
        iv_r = iv[r]
        started = not (s_r > T + _EPS)
        first = math.floor((T - s_r) / iv_r + _EPS) + 1  # the stream's tokens due by T
        for i in range(n):
            count = pending[i] + cnt[r]
            c = count if count < first else first  # np.minimum (no NaN here)
            p = pn[i]
            a0 = p if p > s_r else s_r  # max(s, prev_next)
            ui = u[i]
            if iv_r <= ui or c == 1:
                ks = c
            else:
                x = math.ceil((a0 - s_r) / (iv_r - ui) - _EPS)
                x = x if x > 0 else 0.0
                ks = c if c < x else x
            sa2 = sa[i] + (ks * a0 + ui * ks * (ks - 1) / 2)
            if ks < c:
                sa2 = sa2 + ((c - ks) * s_r + iv_r * (c * (c - 1) / 2 - ks * (ks - 1) / 2))
                la2 = s_r + (c - 1) * iv_r
            else:
                la2 = a0 + (c - 1) * ui
            if started and count > 0:
                sai, lai, pni, dli = sa2, la2, la2 + ui, dl[i] + c
            else:  # a zero-count or not yet started stream is dropped
                sai, lai, pni, dli = sa[i], la[i], p, dl[i] + 0.0
            out[r, i] = _point(expected[i], dli, sai, lai, pni, start[i], ui, T)


def _at_loop(sa, pn, la, dl, start, u, T, out):  # pragma: no cover - compiled
    """out[i, j] = QoE so far at T[j] of request i, no stream appended: `QoEBatch.at(T[j])`
    per element, its operations in its order (np.floor, not math.floor: NaN and inf stay floats)."""
    n = sa.shape[0]
    m = T.shape[0]
    for i in range(n):
        st = start[i]
        ui = u[i]
        for j in range(m):
            at = T[j]
            if at < st - _EPS:
                e = 0.0
            else:
                e = np.floor((at - st) / ui + _EPS) + 1
            out[i, j] = _point(e, dl[i], sa[i], la[i], pn[i], st, ui, at)


def at_times(sa, pn, la, dl, start, u, times) -> np.ndarray | None:
    """``QoEBatch(sa, pn, la, dl, start, u).at(t)`` for every t of `times`, one column each
    (shape (requests, len(times))), in one compiled loop; None without numba.  At a handful of
    requests numpy's ~35 passes cost ~1 µs each; this is one call."""
    if not warm():
        return None
    f = lambda x: np.ascontiguousarray(x, dtype=np.float64)  # noqa: E731 - one compiled signature
    sa = f(sa)
    out = np.empty((sa.shape[0], len(times)))
    _at(sa, f(pn), f(la), f(dl), f(start), f(u), f(times), out)
    return out


def _ema_loop(t, values, out):  # pragma: no cover - compiled
    """out[0] = t; out[k + 1] = 0.9 · out[k] + 0.1 · values[k] (as Python evaluates it)."""
    out[0] = t
    for k in range(values.shape[0]):
        t = 0.9 * t + 0.1 * values[k]
        out[k + 1] = t


def ema_trail(t: float, values: np.ndarray) -> np.ndarray | None:
    """Andes' running tokens-per-word average after each of `values` in turn (first entry: t),
    or None without numba."""
    if not warm():
        return None
    out = np.empty(len(values) + 1)
    _ema(float(t), np.ascontiguousarray(values, dtype=np.float64), out)
    return out


def warm() -> bool:
    """Import numba and compile (or load from the cache) the loop now, not at the first
    scheduling point that needs it (~0.5 s with a warm cache, a few s without).  False: no numba."""
    global _kernel
    if _kernel is None:
        try:
            import numba
        except ImportError:
            _kernel = False
        else:
            global _ema, _at, _point
            jit = numba.njit(cache=True, error_model="numpy", nogil=True)
            _point = jit(_qoe_point)
            _kernel, _ema, _at = jit(_loop), jit(_ema_loop), jit(_at_loop)
            one = np.ones(1)
            _kernel(one, one, one, one, one, one, one, one, one, one, one, 1.0, np.empty((1, 1)))
            _ema(1.0, one, np.empty(2))
            _at(one, one, one, one, one, one, one, np.empty((1, 1)))
    return _kernel is not False


def stream_rows(qb, T: float, s, pending: np.ndarray, cnt, iv) -> np.ndarray | None:
    """qb.at(T, (s, pending + cnt, iv)) with s, cnt, iv one value per row (shape (k, n)), or None
    when numba is not available."""
    if not warm():
        return None
    f = lambda x: np.ascontiguousarray(x, dtype=np.float64)  # noqa: E731 - one compiled signature
    s, cnt, iv = f(s), f(cnt), f(iv)
    out = np.empty((len(s), len(qb.sa)))
    _kernel(f(qb.sa), f(qb.pn), f(qb.la), f(qb.dl), f(qb.start), f(qb.u), f(qb.expected(T)), f(pending), s, cnt,
            iv, float(T), out)
    return out
