"""`timelyllm profile fit --steps A.json,B.json`: refit the profile from served iterations saved by
`--from-serving --save-steps` (profiling/measure.py's `save_steps`), one or several sessions fitted
as one (`merge_saved`), without an engine (`refit_saved`: the same fit as a live run).
"""

from __future__ import annotations

import statistics
from pathlib import Path

from .fit import draw_groups, fit_serving, make_profile, serving_how, write_profile


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

    from ..core.engine import StepRecord

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

        from ..paths import SOURCE_ROOT as REPO
        from ..engines.vllm_engine import VllmTokenizer
        from .measure import host_costs

        model = REPO / d["which"] if not Path(d["which"]).is_absolute() else Path(d["which"])
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
    write_profile(Path(a.out), prof, d["n_tok"])
    print(f"wrote {a.out}")
