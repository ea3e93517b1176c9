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
_small_q = _small_pack = _small_loss = _fsum_rows = None  # Andes' small-queue path (`Andes._select_small`)
_small_terms = _small_solve = _small_loss_sums = None


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


# --- Andes at a handful of requests: a few compiled calls instead of ~80 numpy calls -----------------
def _small_q_loop(sa, pn, la, dl, start, u, pending, s, cnt, iv, T, q_wait, q_serve):  # pragma: no cover
    """q_wait[i] = `_at_loop`'s value at T; q_serve[r, i] = `_loop`'s (the expected tokens at T
    as `QoEBatch.expected` computes them), both in one call."""
    n = sa.shape[0]
    expected = np.empty(n)
    for i in range(n):
        st = start[i]
        if T < st - _EPS:
            e = 0.0
        else:
            e = np.floor((T - st) / u[i] + _EPS) + 1
        expected[i] = e
        q_wait[i] = _point(e, dl[i], sa[i], la[i], pn[i], st, u[i], T)
    _loop(sa, pn, la, dl, start, u, expected, pending, s, cnt, iv, T, q_serve)


# the rows of Andes' slot table (`SlotTable(matrix=True)`) `_small_terms_loop` reads, in the order of
# its `rows` argument
SMALL_TERM_ROWS = ("fixed", "base", "own", "last_start", "fold_rate", "sa", "pn", "la", "dl", "start", "pending", "l")


def _small_terms_loop(own_tpw, t, P, M, sl, X, F, rows):  # pragma: no cover - compiled
    """Andes' per-request terms of the live requests (slots `sl` of the table F, its rows
    `rows[k]` holding the columns SMALL_TERM_ROWS[k]: one argument, not twelve, ~0.05 µs each per
    call): X[0..6] = the table columns sa, pn, la, dl, start, pending, l gathered, X[7] = u, X[8]
    = last delivered run's start, X[9] = rate, where rate = the fixed rate, else base · tokens per
    word / P (own tokens per word if measured, else the running average t, which own values move
    in item order when `own_tpw`; else t is the fixed value): `Andes.select`'s steps.  Returns
    (ok: every rate finite and non-zero, the average after the last item, refolds needed, min u,
    max rate, max last start, how many l fit M smallest first)."""
    fixed_t, base_t, own_t, last_t, fold_t = F[rows[0]], F[rows[1]], F[rows[2]], F[rows[3]], F[rows[4]]
    sa, pn, la, dl, start = F[rows[5]], F[rows[6]], F[rows[7]], F[rows[8]], F[rows[9]]
    pending, l = F[rows[10]], F[rows[11]]
    n = sl.shape[0]
    nref = 0
    ok = True
    for i in range(n):
        s = sl[i]
        X[0, i] = sa[s]
        X[1, i] = pn[s]
        X[2, i] = la[s]
        X[3, i] = dl[s]
        X[4, i] = start[s]
        X[5, i] = pending[s]
        X[6, i] = l[s]
        f = fixed_t[s]
        if own_tpw:
            o = own_t[s]
            if o == o:
                t = 0.9 * t + 0.1 * o
                tw = o
            else:
                tw = t
        else:
            tw = t
        r = f if f == f else base_t[s] * tw / P
        if not math.isfinite(r) or r == 0.0:
            ok = False
        X[7, i] = 1.0 / r if r != 0.0 else math.inf
        X[8, i] = last_t[s]
        X[9, i] = r
        if last_t[s] > -math.inf and fold_t[s] != r:
            nref += 1
    u_min = math.inf
    r_max = -math.inf
    late = -math.inf
    for i in range(n):
        if X[7, i] < u_min:
            u_min = X[7, i]
        if X[9, i] > r_max:
            r_max = X[9, i]
        if X[8, i] > late:
            late = X[8, i]
    srt = np.sort(X[6])
    used = 0.0
    fit = 0
    for i in range(n):
        used += srt[i]
        if used > M:
            break
        fit += 1
    return ok, t, nref, u_min, r_max, late, fit


def _fsum(xs, m, p):  # pragma: no cover - compiled
    """math.fsum(xs[:m]) for finite xs (CPython's algorithm: Shewchuk's partials, then the
    correctly rounded sum of them; `p`: room for m + 1 partials); NaN when an input or a partial
    is not finite (the caller then calls math.fsum, which raises or returns what it does)."""
    n = 0
    for k in range(m):
        x = xs[k]
        if not math.isfinite(x):
            return math.nan
        i = 0
        for j in range(n):
            y = p[j]
            if abs(x) < abs(y):
                x, y = y, x
            hi = x + y
            lo = y - (hi - x)
            if lo != 0.0:
                p[i] = lo
                i += 1
            x = hi
        n = i
        if x != 0.0:
            if not math.isfinite(x):
                return math.nan
            p[n] = x
            n += 1
    hi = 0.0
    if n > 0:
        n -= 1
        hi = p[n]
        lo = 0.0
        while n > 0:
            x = hi
            n -= 1
            y = p[n]
            hi = x + y
            yr = hi - x
            lo = y - yr
            if lo != 0.0:
                break
        if n > 0 and ((lo < 0.0 and p[n - 1] < 0.0) or (lo > 0.0 and p[n - 1] > 0.0)):
            y = lo * 2.0
            x = hi + y
            yr = x - hi
            if y == yr:
                hi = x
    return hi


def _fsum_rows_loop(x, m, out):  # pragma: no cover - compiled
    """out[r] = `_fsum`(x[r], m[r])."""
    p = np.empty(x.shape[1] + 1)
    for r in range(x.shape[0]):
        out[r] = _fsum(x[r], m[r], p)


def _small_pack_loop(q_wait, q_serve, mem, M, gains, pri, heads, fits, head_gains):  # pragma: no cover
    """Per row r (a candidate batch size): gains = q_serve[r] - q_wait, pri = gains / mem, the
    first k = heads.shape[1] indices of the stable ascending argsort of -pri (NaN last, as numpy
    sorts), their gains, and fits[r] = how many of them the memory M takes (the first index
    where the running sum of their mem exceeds M, else k): `Andes.select`'s numpy steps."""
    rows, n = q_serve.shape
    k = heads.shape[1]
    idx = np.empty(n, dtype=np.intp)
    key = np.empty(n)
    for r in range(rows):
        for i in range(n):
            g = q_serve[r, i] - q_wait[i]
            p = g / mem[i]
            gains[r, i] = g
            pri[r, i] = p
            key[i] = -p
        for i in range(n):  # insertion sort: stable; NaN after every number
            x = key[i]
            j = i
            while j > 0:
                y = key[idx[j - 1]]
                if x < y or (y != y and x == x):
                    idx[j] = idx[j - 1]
                    j -= 1
                else:
                    break
            idx[j] = i
        used = 0.0
        f = k
        for j in range(k):
            h = idx[j]
            heads[r, j] = h
            head_gains[r, j] = gains[r, h]
            used += mem[h]
            if f == k and used > M:
                f = j
        fits[r] = f


def _small_solve_loop(X, S, C, heads, G, order, T, M, compute_q, now, net, n_run, refine,
                      pf):  # pragma: no cover - compiled (few arrays: each array argument costs ~0.1 µs per call)
    """Q_wait and Q_serve (unless given: `compute_q` False), the packing of every candidate B
    (`_small_pack_loop`) and the math.fsum of each row's first min(B, fits) gains; then the best
    row where no rounding decides it (`_small_best`) and its proposal and refiner walk
    (`_small_tail`), in one call.  X: the per-request terms (`_small_terms_loop`'s rows 0-9),
    X[10] = Q_wait, X[11, :na] = the admissions' stall losses; per candidate row r: C[0, r] = B,
    C[1, r] = fits, S[0, r] = the projected stream's start (now + S[2, r] + net), S[1, r] its
    token count, S[2, r] its token interval (the token latency of B), S[3, r] = the sum;
    heads[r] = the first K by priority; G[0, r] = Q_serve, G[1, r] = gains, G[2, r] =
    priorities, G[3, r, :K] = the heads' gains; order: the proposal.  Returns (best row, or -1:
    the caller's rule; then `_small_tail`'s (na, nv, npay, ok), else (0, 0, 0, False))."""
    s, cnt, iv, sums = S[0], S[1], S[2], S[3]
    cands, fits = C[0], C[1]
    head_gains = G[3, :, :heads.shape[1]]
    for r in range(s.shape[0]):
        s[r] = now + iv[r] + net
    if compute_q:
        _small_q_loop(X[0], X[1], X[2], X[3], X[4], X[7], X[5], s, cnt, iv, T, X[10], G[0])
    _small_pack_loop(X[10], G[0], X[6], M, G[1], G[2], heads, fits, head_gains)
    p = np.empty(head_gains.shape[1] + 1)
    for r in range(head_gains.shape[0]):
        m = cands[r] if cands[r] < fits[r] else fits[r]
        sums[r] = _fsum(head_gains[r], m, p)
    r = _small_best(sums, cands, n_run)
    if r < 0:
        return r, 0, 0, 0, False
    m = cands[r] if cands[r] < fits[r] else fits[r]
    na, nv, npay, ok = _small_tail(heads[r, :m], n_run, G[1, r], G[2, r], X, pf, now, refine, order, X[11])
    return r, na, nv, npay, ok


def _small_best(sums, cands, n_run):  # pragma: no cover - compiled
    """`Andes._select_small`'s best row — the largest round(sum, 12), then the batch size closest
    to the running batch, the first row on ties — where rounding cannot change it: every row within
    1e-11 of the largest sum holds that very sum (round moves a value by at most 0.5e-12, so a row
    further below cannot round to the largest rounded value; equal sums round alike).  -1 where it
    could: a NaN sum, a largest sum outside (-1e6, 1e6), or different sums within 1e-11 of it."""
    top = -math.inf
    for r in range(sums.shape[0]):
        v = sums[r]
        if v != v:
            return -1
        if v > top:
            top = v
    if not (-1e6 < top < 1e6):
        return -1
    cut = top - 1e-11
    best = -1
    dist = 0
    for r in range(sums.shape[0]):
        v = sums[r]
        if v < cut:
            continue
        if v != top:
            return -1
        d = abs(cands[r] - n_run)
        if best < 0 or d < dist:
            best = r
            dist = d
    return best


def _small_tail(chosen, n_run, gains, pri, X, pf, now, refine, order, lsum):  # pragma: no cover - compiled
    """`Andes._select_small`'s proposal from the chosen requests (0..n_run-1 run; `gains`, `pri`:
    the chosen row's): order[:na] = the chosen ready requests by priority descending (`chosen`'s
    order, the packing's, which is the Python sort's as long as no two of them tie), order[na:na +
    nv] = the running requests not chosen by priority ascending (a stable insertion sort over
    ascending indices: the Python sort's without NaN); with `refine`, lsum[k] = the k-th
    admission's stall loss summed over the kept running requests (`_small_loss_sums_loop`; none
    where nothing is kept or admitted) and npay = how many admit/victim pairs the refiner keeps
    (`andes._paying_pairs`' walk; na without `refine`).  Returns (na, nv, npay, ok); ok False (the
    caller's Python steps then): two admissions tie, a priority is NaN, a kept request has a
    delivered run after now (the scalar formula prices it), or a loss sum is not finite."""
    taken = np.zeros(pri.shape[0], dtype=np.bool_)
    na = 0
    for h in chosen:
        taken[h] = True
        if h >= n_run:
            x = pri[h]
            if x != x or (na > 0 and x == pri[order[na - 1]]):
                return 0, 0, 0, False
            order[na] = h
            na += 1
    nv = 0
    for i in range(n_run):
        x = pri[i]
        if x != x:
            return 0, 0, 0, False
        if taken[i]:
            continue
        j = na + nv
        while j > na and pri[order[j - 1]] > x:
            order[j] = order[j - 1]
            j -= 1
        order[j] = i
        nv += 1
    if not refine:
        return na, nv, na, True
    nk = n_run - nv
    losses = nk > 0 and na > 0
    if losses:
        kept = np.empty(nk, dtype=np.intp)
        k = 0
        for i in range(n_run):
            if taken[i]:
                if X[8, i] > now + _EPS:
                    return 0, 0, 0, False
                kept[k] = i
                k += 1
        _small_loss_sums_loop(X, kept, order[:na], pf, now, np.empty((na, nk)), lsum)
        for k in range(na):
            if lsum[k] != lsum[k]:
                return 0, 0, 0, False
    npay = 0
    while npay < na:  # gain(admit) - gain(victim) - the kept requests' stall loss > 0
        if gains[order[npay]] - (gains[order[na + npay]] if npay < nv else 0.0) - (lsum[npay] if losses else 0.0) <= 0:
            break
        npay += 1
    return na, nv, npay, True


def _small_loss_sums_loop(X, kept, admit, pf, now, loss, sums):  # pragma: no cover - compiled
    """`_small_loss_loop` on X's columns with over[j] = pf · X[6, admit[j]] (the stall of
    admitting admit[j]), times = now, then now + over[j]; then sums[j] = math.fsum(loss[j])."""
    m = admit.shape[0]
    over = np.empty(m)
    times = np.empty(m + 1)
    times[0] = now
    for j in range(m):
        over[j] = pf * X[6, admit[j]]
        times[j + 1] = now + over[j]
    _small_loss_loop(X[0], X[1], X[2], X[3], X[4], X[7], kept, times, over, loss)
    p = np.empty(loss.shape[1] + 1)
    for j in range(loss.shape[0]):
        sums[j] = _fsum(loss[j], loss.shape[1], p)


def _small_loss_loop(sa, pn, la, dl, start, u, kept, times, over, out):  # pragma: no cover
    """out[j, row] = the QoE request kept[row] loses when the batch stalls over[j] s: Q at
    times[0] minus Q at times[j + 1], floored at 0 (0 where over[j] <= 0), as `_refine_fast`."""
    m = over.shape[0]
    q = np.empty(m + 1)  # (each row's Q at every time)
    for row in range(kept.shape[0]):
        i = kept[row]
        st = start[i]
        ui = u[i]
        for j in range(m + 1):
            at = times[j]
            if at < st - _EPS:
                e = 0.0
            else:
                e = np.floor((at - st) / ui + _EPS) + 1
            q[j] = _point(e, dl[i], sa[i], la[i], pn[i], st, ui, at)
        for j in range(m):
            d = q[0] - q[j + 1]
            out[j, row] = (d if d > 0.0 else 0.0) if over[j] > 0 else 0.0


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
            global _ema, _at, _point, _loop, _small_q, _small_pack, _small_loss, _fsum, _fsum_rows
            global _small_q_loop, _small_pack_loop, _small_loss_loop, _small_terms, _small_solve, _small_loss_sums
            global _small_best, _small_tail, _small_loss_sums_loop
            jit = numba.njit(cache=True, error_model="numpy", nogil=True)
            _point = jit(_qoe_point)
            _fsum = jit(_fsum)
            _fsum_rows = jit(_fsum_rows_loop)
            _kernel, _ema, _at = jit(_loop), jit(_ema_loop), jit(_at_loop)
            _loop = _kernel  # (called by name from _small_q_loop)
            _small_q, _small_pack, _small_loss = jit(_small_q_loop), jit(_small_pack_loop), jit(_small_loss_loop)
            _small_q_loop, _small_pack_loop, _small_loss_loop = _small_q, _small_pack, _small_loss  # (by name)
            _small_loss_sums = _small_loss_sums_loop = jit(_small_loss_sums_loop)  # (by name, from _small_tail)
            _small_best, _small_tail = jit(_small_best), jit(_small_tail)  # (by name, from _small_solve_loop)
            _small_terms, _small_solve = jit(_small_terms_loop), jit(_small_solve_loop)
            one = np.ones(1)
            _kernel(one, one, one, one, one, one, one, one, one, one, one, 1.0, np.empty((1, 1)))
            _ema(1.0, one, np.empty(2))
            _at(one, one, one, one, one, one, one, np.empty((1, 1)))
            _small_q(one, one, one, one, one, one, one, one, one, one, 1.0, np.empty(1), np.empty((1, 1)))
            _small_pack(one, np.ones((1, 1)), one, 1.0, np.empty((1, 1)), np.empty((1, 1)),
                        np.empty((1, 1), dtype=np.intp), np.empty(1, dtype=np.intp), np.empty((1, 1)))
            _small_loss(one, one, one, one, one, one, np.zeros(1, dtype=np.intp), np.ones(2), one,
                        np.empty((1, 1)))
            _fsum_rows(np.ones((1, 1)), np.ones(1, dtype=np.intp), np.empty(1))
            one_i = np.zeros(1, dtype=np.intp)
            X, G = np.ones((12, 1)), np.ones((4, 1, 1))
            _small_terms(True, 1.0, 1.3, 1.0, one_i, X, np.ones((13, 1)), np.arange(1, 13, dtype=np.intp))
            _small_solve(X, np.ones((4, 1)), np.ones((2, 1), dtype=np.intp), np.zeros((1, 1), dtype=np.intp), G,
                         np.empty(1, dtype=np.intp), 1.0, 1.0, True, 0.0, 0.0, 0, True, 1.0)
            _small_loss_sums(X, one_i, one_i, 1.0, 0.0, np.empty((1, 1)), np.empty(1))
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


def fsum_rows(x: np.ndarray, m) -> list[float] | None:
    """[math.fsum(x[r, :m[r]]) for each row r] in one compiled call (the same values: the sum is
    correctly rounded either way; non-finite rows by math.fsum itself), or None without numba."""
    if not warm():
        return None
    out = np.empty(x.shape[0])
    _fsum_rows(x, np.asarray(m, dtype=np.intp), out)
    res = out.tolist()
    for r, v in enumerate(res):
        if v != v:
            res[r] = math.fsum(x[r, : int(m[r])].tolist())
    return res
