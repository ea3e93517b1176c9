"""The profile-fitting helpers of `timelyllm profile fit` and `timelyllm profile check` (timelyllm_ros/profiling/;
no engine), and benchmarks/spot_check.py's."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # spot_check

from timelyllm_ros.engines.base import StepRecord, host_gaps  # noqa: E402
from timelyllm_ros.profiling.fit import nonneg_lstsq  # noqa: E402


def test_nonneg_lstsq_recovers_costs_and_never_goes_negative():
    rows = [[1.0, b - 1, c, 0.0] for b in (1, 2, 3, 4) for c in (100, 400, 900)]
    ys = [0.010 + 0.002 * r[1] + 1e-6 * r[2] for r in rows]
    f = nonneg_lstsq(rows, ys, ["base", "seq", "ctx", "unused"])
    assert f["base"] == pytest.approx(0.010, rel=1e-6)
    assert f["seq"] == pytest.approx(0.002, rel=1e-6)
    assert f["ctx"] == pytest.approx(1e-6, rel=1e-6)
    assert f["unused"] == 0.0
    # data that a negative slope would fit best: that term is dropped, the rest refitted
    rows = [[1.0, x] for x in range(1, 9)]
    f = nonneg_lstsq(rows, [0.02 - 0.001 * x for x in range(1, 9)], ["base", "slope"])
    assert f["slope"] == 0.0 and f["base"] > 0


def rec(start, dur, post=0.0):
    return StepRecord(start_s=start, duration_s=dur, post_s=post, seqs=1, prefill_tokens=0,
                      prefill_context_tokens=0, context_tokens=10, adds=0, output_tokens=1)


def test_host_gaps_skip_idle_periods():
    recs = [rec(0.0, 0.010, 0.001), rec(0.012, 0.010), rec(0.5, 0.010), rec(0.5105, 0.01)]
    assert host_gaps(recs) == pytest.approx([0.001, 0.0005])


def _served(n: int = 400, base: float = 0.008, host_per_seq: float = 0.0, t: float = 0.0) -> list[StepRecord]:
    """Synthetic serving iterations with known costs: decode `base` (8 ms) + 0.3 ms/extra seq + 0.2 us/
    context token; a prefill adds 0.15 ms/uncached token + 2 us/cached token; 1 us/output token;
    0.1 ms (+ `host_per_seq` per extra sequence) of host work between iterations, and before a
    step that takes in A new or resumed sequences 0.8 ms + 0.3 ms x A more."""
    import random

    rng = random.Random(3)
    out = []
    for i in range(n):
        seqs = rng.randint(1, 12)
        ctx = seqs * rng.randint(100, 1300)
        pre, prectx = (rng.randint(10, 300), rng.randint(0, 4000)) if i % 5 == 0 else (0, 0)
        adds = min(seqs, rng.randint(1, 4)) if pre else 0
        t += 1e-4 + host_per_seq * (seqs - 1) + (8e-4 + 3e-4 * adds if adds else 0.0)  # host work before it
        dur = base + 0.0003 * (seqs - 1) + 2e-7 * ctx + (1.5e-4 * pre + 2e-6 * prectx if pre else 0.0)
        out.append(StepRecord(start_s=t, duration_s=dur, post_s=1e-6 * seqs, seqs=seqs, prefill_tokens=pre,
                              prefill_context_tokens=prectx, context_tokens=ctx, adds=adds,
                              output_tokens=seqs))
        t += dur + 1e-6 * seqs
    return out


def test_saved_steps_refit_offline_recovers_the_costs_and_is_reproducible(tmp_path):
    """--save-steps / --steps: the served iterations are kept and the profile refitted from them
    without an engine; the same file gives the same profile byte for byte."""
    import argparse

    import yaml

    from timelyllm_ros.core.latency_profile import LatencyProfile
    from timelyllm_ros.profiling.measure import save_steps
    from timelyllm_ros.profiling.refit import refit_saved

    recs = _served()
    a = argparse.Namespace(fit_workloads=["mixed_small", "WID2"], fit_seed=101, fit_runs=2, fit_duration=40.0)
    steps = tmp_path / "steps.json"
    save_steps(steps, a, recs=recs, gaps=host_gaps(recs), loads=[[1.0, 1.1]], tokenize_s=4e-5, detokenize_s=1e-6,
               n_tok=36, which="models/tiny-planner", dtype="bfloat16", kv_block_size=32, kv_capacity_blocks=8191)
    outs = []
    for name in ("p1.yaml", "p2.yaml"):
        refit_saved(argparse.Namespace(steps=str(steps), out=str(tmp_path / name)))
        outs.append((tmp_path / name).read_text())
    assert outs[0] == outs[1]
    prof = LatencyProfile.from_yaml(tmp_path / "p1.yaml")
    assert prof.decode_base_s == pytest.approx(0.008 + 1e-4, rel=1e-3)  # + the median host gap
    assert prof.decode_s_per_extra_seq == pytest.approx(0.0003, rel=1e-3)
    assert prof.decode_s_per_context_token == pytest.approx(2e-7, rel=1e-3)
    assert prof.prefill_s_per_token == pytest.approx(1.5e-4, rel=1e-3)
    assert prof.prefill_s_per_context_token == pytest.approx(2e-6, rel=1e-3)
    assert prof.add_base_s == pytest.approx(8e-4, rel=1e-3) and prof.add_s_per_seq == pytest.approx(3e-4, rel=1e-3)
    assert (prof.tokenize_s, prof.detokenize_s, prof.kv_capacity_blocks) == (4e-5, 1e-6, 8191)
    assert "mixed_small, WID2" in yaml.safe_load(outs[0])["description"]


def test_every_fit_workload_weighs_the_same_and_host_work_grows_per_sequence(tmp_path, capsys):
    """A workload with 9x the iterations must not set the terms alone: with the per-draw counts
    saved, the fit lands midway between two workloads' step costs (8 and 12 ms), not next to the
    bigger one; a file without them (saved before) weighs every iteration the same.  The host
    time between steps that grows with the batch goes into decode_s_per_extra_seq."""
    import argparse

    from timelyllm_ros.core.latency_profile import LatencyProfile
    from timelyllm_ros.profiling.measure import save_steps
    from timelyllm_ros.profiling.refit import refit_saved

    many = _served(900, base=0.008, host_per_seq=5e-5)
    few = _served(100, base=0.012, host_per_seq=5e-5, t=many[-1].start_s + 10.0)  # 10 s later: idle between
    a = argparse.Namespace(fit_workloads=["chat_poisson", "WID2"], fit_seed=101, fit_runs=1, fit_duration=40.0)
    meta = dict(gaps=host_gaps(many + few), loads=[[1.0, 1.1]] * 2, tokenize_s=4e-5, detokenize_s=1e-6, n_tok=36,
                which="models/tiny-planner", dtype="bfloat16", kv_block_size=32, kv_capacity_blocks=8191)
    fitted = {}
    for name, draws in (("equal", [["chat_poisson", 101, 900], ["WID2", 101, 100]]), ("old", None)):
        steps = tmp_path / f"{name}.json"
        save_steps(steps, a, recs=many + few, **meta, **({"draws": draws} if draws else {}))
        refit_saved(argparse.Namespace(steps=str(steps), out=str(tmp_path / f"{name}.yaml")))
        fitted[name] = LatencyProfile.from_yaml(tmp_path / f"{name}.yaml")
    out = capsys.readouterr().out
    assert "every fit workload weighs the same" in out and "without per-draw counts" in out
    assert fitted["equal"].decode_base_s == pytest.approx(0.010 + 1e-4, rel=0.02)  # (8 + 12) / 2 + host
    assert fitted["old"].decode_base_s == pytest.approx(0.0084 + 1e-4, rel=0.02)  # 0.9 x 8 + 0.1 x 12
    for prof in fitted.values():
        assert prof.decode_s_per_extra_seq == pytest.approx(0.0003 + 5e-5, rel=0.02)
    # counts that do not add up to the saved iterations: a clear error, nothing fitted
    steps = tmp_path / "bad.json"
    save_steps(steps, a, recs=many + few, **meta, draws=[["chat_poisson", 101, 900]])
    with pytest.raises(SystemExit, match="add up to 900 iterations, the file holds 1000"):
        refit_saved(argparse.Namespace(steps=str(steps), out=str(tmp_path / "bad.yaml")))


def test_saved_sessions_fit_together_as_one(tmp_path, capsys):
    """`--steps A,B`: two sessions' iterations (each on its own clock) fit as one: every workload
    still weighs the same (a session at 8 ms and one at 12 ms land at 10 ms + host), no gap
    between the sessions is taken for host work, the description names both sessions' seeds,
    and sessions of another KV geometry are refused."""
    import argparse
    import json

    from timelyllm_ros.core.latency_profile import LatencyProfile
    from timelyllm_ros.profiling.measure import save_steps
    from timelyllm_ros.profiling.refit import refit_saved

    meta = dict(loads=[[1.0, 1.1]], tokenize_s=4e-5, detokenize_s=1e-6, n_tok=36,
                which="models/tiny-planner", dtype="bfloat16", kv_block_size=32, kv_capacity_blocks=8191)
    files = []
    for name, base, runs in (("s1", 0.008, 2), ("s2", 0.012, 1)):
        recs = _served(500, base=base, host_per_seq=5e-5)  # both sessions' clocks start at 0
        a = argparse.Namespace(fit_workloads=["chat_poisson", "WID2"], fit_seed=101, fit_runs=runs, fit_duration=40.0)
        save_steps(tmp_path / f"{name}.json", a, recs=recs, gaps=host_gaps(recs), **meta,
                   draws=[["chat_poisson", 101, 250], ["WID2", 101, 250]])
        files.append(str(tmp_path / f"{name}.json"))
    refit_saved(argparse.Namespace(steps=",".join(files), out=str(tmp_path / "both.yaml")))
    prof = LatencyProfile.from_yaml(tmp_path / "both.yaml")
    assert prof.decode_base_s == pytest.approx(0.010 + 1e-4, rel=0.02)
    assert prof.decode_s_per_extra_seq == pytest.approx(0.0003 + 5e-5, rel=0.02)
    assert "seeds 101..102 / 101..101 each in 2 sessions" in (tmp_path / "both.yaml").read_text()
    assert "1000 iterations" in capsys.readouterr().out
    from timelyllm_ros.core.engine import gaps_before
    from timelyllm_ros.profiling.refit import merge_saved

    merged = [StepRecord(*r) for r in merge_saved([json.loads(Path(f).read_text()) for f in files])["records"]]
    between = gaps_before(merged)[499][0]  # the first step of session 2 after the last of session 1
    assert between == pytest.approx(1.0) and all(g > 0 for g, _ in gaps_before(merged))  # an idle second: no host gap
    other = json.loads(Path(files[1]).read_text()) | {"kv_block_size": 16}
    (tmp_path / "other.json").write_text(json.dumps(other))
    with pytest.raises(SystemExit, match="differ in \\['kv_block_size'\\]"):
        refit_saved(argparse.Namespace(steps=f"{files[0]},{tmp_path / 'other.json'}", out=str(tmp_path / "x.yaml")))
    (tmp_path / "seed.json").write_text(json.dumps(json.loads(Path(files[1]).read_text()) | {"fit_seed": 201}))
    with pytest.raises(SystemExit, match="differ in \\['fit_seed'\\]"):
        refit_saved(argparse.Namespace(steps=f"{files[0]},{tmp_path / 'seed.json'}", out=str(tmp_path / "x.yaml")))
    # not a saved-steps file: a clear error naming it, nothing written
    (tmp_path / "broken.json").write_text("{bad")
    (tmp_path / "other_kind.json").write_text('{"records": []}')
    for bad, why in (("broken.json", "Expecting property name"), ("other_kind.json", "lacks cpus")):
        with pytest.raises(SystemExit, match=f"--steps .*{bad}: not a file written by --save-steps \\({why}"):
            refit_saved(argparse.Namespace(steps=f"{files[0]},{tmp_path / bad}", out=str(tmp_path / "x.yaml")))
    assert not (tmp_path / "x.yaml").exists()


def test_host_costs_time_the_request_text_not_the_whole_prompt():
    """The planner tokenises a request's own text; the robot type's prompt prefix once
    (PromptBuilder.prefix_ids).  tokenize_s must be timed on what is tokenised per request."""
    from timelyllm_ros.profiling.measure import host_costs
    from timelyllm_ros.prompts import TokenizerFile, request_text

    tok = TokenizerFile()
    seen: list[str] = []

    class Counting:
        def encode(self, text):
            seen.append(text)
            return tok.encode(text)

        def decode(self, ids):
            return tok.decode(ids)

    tokenize_s, detokenize_s, n = host_costs(Counting())
    req = request_text("look for the cat", "living room with a sofa and a cat")
    assert n == len(tok.encode(req)) and tokenize_s > 0 and detokenize_s > 0
    assert seen.count(req) >= 50  # the timed calls; the one whole-prompt encode feeds the detokenizer
    assert sum(1 for s in seen if s != req) == 1


def test_spot_check_order_relation_ties_and_best_other():
    from spot_check import best_other, figures, relation

    rows = {"default": {"total_pct": 91.4}, "edf": {"total_pct": 24.5}, "andes": {"total_pct": 91.42}}
    assert relation(rows, ["andes", "default", "edf"], "total_pct") == "andes = default > edf"
    assert relation(rows, ["default", "andes", "edf"], "total_pct") == "andes = default > edf"
    assert relation({"a": {"k": 2.0}, "b": {"k": 1.0}}, ["a", "b"], "k") == "a > b"
    sim = {"default": {"total_pct": 90.0, "urgent_pct": 80.0}, "edf": {"total_pct": 95.0, "urgent_pct": 70.0},
           "andes": {"total_pct": 95.0, "urgent_pct": 75.0}, "fcfs": {"total_pct": 95.0, "urgent_pct": 75.0}}
    assert best_other(sim, ["default"]) == "andes"  # total, then urgent, then the alphabetically first
    assert best_other(sim, ["default", "andes"]) == "fcfs"
    r = [["a", "urgent", "finished", 1.0, 2.0], ["b", "normal", "finished", 1.0, 1.0], ["c", "urgent", "failed", 0.0, 2.0]]
    f = figures(r)
    assert f["total_pct"] == pytest.approx(40.0) and f["urgent_pct"] == pytest.approx(25.0)
    assert f["finished"] == 2 and f["requests"] == 3
    assert figures(r, {"a", "b"})["total_pct"] == pytest.approx(200 / 3)


def test_spot_check_contradictions_at_the_acceptance_resolution_hand_computed():
    """A pair disagrees only where both gaps exceed 1 point (completion: 5 %) in opposite directions."""
    from spot_check import contradictions

    real = {"a": {"k": 99.3, "completion_mean_s": 18.4}, "b": {"k": 99.7, "completion_mean_s": 18.6},
            "c": {"k": 90.0, "completion_mean_s": 20.0}}
    # a-b: real -0.4 (tie), sim +3.0 -> nothing; a-c / b-c: same direction beyond 1 point on both sides
    sim = {"a": {"k": 95.0, "completion_mean_s": 19.0}, "b": {"k": 92.0, "completion_mean_s": 18.7},
           "c": {"k": 80.0, "completion_mean_s": 25.0}}
    assert contradictions(real, sim, "k") == []
    assert contradictions(real, sim, "completion_mean_s") == []  # 18.4 vs 18.6 and 19.0 vs 18.7: both within 5 %
    sim["c"]["k"] = 96.5  # c over a by 1.5 and over b by 4.5 in the simulator, under both by > 1 point in reality
    assert contradictions(real, sim, "k") == ["a vs c: real +9.3, sim -1.5", "b vs c: real +9.7, sim -4.5"]
    sim["c"]["completion_mean_s"] = 17.0  # c sooner than a by 2.0 s (> 5 %) in the simulator; later by 1.6 s in reality
    assert contradictions(real, sim, "completion_mean_s") == ["a vs c: real +1.6, sim -2.0", "b vs c: real +1.4, sim -1.7"]
    sim["c"]["k"] = None  # a score missing on one side orders nothing
    assert contradictions(real, sim, "k") == []


@pytest.mark.parametrize("extra, message", [
    (["--fit-workload", "WID1", "--fit-out", "p.yaml", "--save-steps", "s.json"], "is also checked"),
    (["--fit-workload", "mixed_small"], "needs --fit-out"),
])
def test_profile_check_interleaved_fit_refuses_in_sample_or_incomplete_requests(extra, message):
    import subprocess

    root = Path(__file__).resolve().parents[1]
    p = subprocess.run([sys.executable, "-m", "timelyllm_ros.cli", "profile", "check", "--workload", "WID1", *extra],
                       capture_output=True, text=True, cwd=root)
    assert p.returncode == 2 and message in p.stderr


@pytest.mark.parametrize("extra, message", [
    (["--calibrate", "WID1"], "is also checked"),
    (["--calibrate", "mixed_small,WID2"], "name one workload"),
    (["--calibrate", "no_such_workload"], "--calibrate:"),
    (["--calibrate", "mixed_small", "--calibrate-duration", "0"], "--calibrate-duration must be > 0"),
])
def test_profile_check_calibration_refuses_in_sample_or_bad_probes(extra, message):
    import subprocess

    root = Path(__file__).resolve().parents[1]
    p = subprocess.run([sys.executable, "-m", "timelyllm_ros.cli", "profile", "check", "--workload", "WID1", *extra],
                       capture_output=True, text=True, cwd=root)
    assert p.returncode == 2 and message in p.stderr


def test_speed_calibration_brackets_a_workloads_runs_and_scales_the_profile():
    """The probes before each of a workload's runs and the one after the last give its speed:
    measured / charged time over exactly those probes; the scaled profile then charges the probes'
    iterations what they measured, in sum."""
    from timelyllm_ros.engines.simulated import LatencyProfile
    from timelyllm_ros.profiling.check_report import bracket_speed

    prof = LatencyProfile(prefill_s_per_token=1e-4, decode_base_s=0.006, kv_block_size=32, kv_capacity_blocks=100,
                          decode_s_per_extra_seq=2e-4)

    import dataclasses

    base = [StepRecord(0.0, 0.0, 0.0, seqs, pre, 0, 100 * seqs, 1 if pre else 0, seqs)
            for seqs, pre in ((1, 0), (4, 0), (2, 300))]  # three iterations of each probe
    probes = [[dataclasses.replace(r, duration_s=s * prof.record_s(r)) for r in base]  # s x what is charged
              for s in (0.5, 0.5, 0.6, 2.0, 2.0)]
    first = bracket_speed(probes, prof, 0, 2)  # workload 1 of two, 2 runs each: probes 0, 1, 2
    assert first.ratio == pytest.approx((0.5 + 0.5 + 0.6) / 3) and first.steps == 9
    assert bracket_speed(probes, prof, 2, 4).ratio == pytest.approx((0.6 + 2.0 + 2.0) / 3)
    cal = prof.scaled(first.ratio)
    recs = [r for p in probes[:3] for r in p]
    assert sum(cal.record_s(r) for r in recs) == pytest.approx(sum(r.duration_s + r.post_s for r in recs))


def test_profile_check_policy_defaults_to_default_and_saved_runs_keep_theirs():
    """The check serves and simulates `default` (the fit's policy) unless told otherwise; saved
    runs are re-simulated under the policy they were served under, never another one, and a file
    that does not say which needs --policy."""
    from timelyllm_ros.profiling.check import resolve_policy

    assert resolve_policy(None, None, False) == "default"
    assert resolve_policy("timelyllm", None, False) == "timelyllm"
    assert resolve_policy(None, "timelyllm", True) == "timelyllm"
    assert resolve_policy("timelyllm", "timelyllm", True) == "timelyllm"
    assert resolve_policy("timelyllm", None, True) == "timelyllm"  # an older file: the caller says
    with pytest.raises(ValueError, match="served under --policy default, not timelyllm"):
        resolve_policy("timelyllm", "default", True)
    with pytest.raises(ValueError, match="name it with --policy"):
        resolve_policy(None, None, True)


def test_run_spread_is_the_real_runs_distance_from_each_other():
    """The real engine's reproducibility next to the simulator's error: each run's mean over the
    compared requests, (max - min) / median of those means, and the task type whose run means
    differ most relative to its real figure."""
    from timelyllm_ros.profiling.check_report import run_spread

    rows = [{"task_type": "A", "real_s": 0.10, "real_runs_s": [0.09, 0.11]},
            {"task_type": "B", "real_s": 0.20, "real_runs_s": [0.20, 0.20]},
            {"task_type": "C", "real_s": 0.05, "real_runs_s": [0.05]}]  # one run: no spread
    f = run_spread(rows, [[0.1, 0.2, 0.3], [0.2, 0.2, 0.5], [0.3, 0.3, 0.3]])
    assert f["run_means_s"] == pytest.approx([0.2, 0.3, 0.3])
    assert f["run_spread"] == pytest.approx((0.3 - 0.2) / 0.3)
    assert f["worst_type_spread"] == pytest.approx(0.2) and f["worst_spread_type"] == "A"
    one = run_spread(rows[2:], [[0.05]])
    assert one["run_spread"] == 0.0 and one["worst_type_spread"] == 0.0 and one["worst_spread_type"] == ""


def test_checked_runs_and_fit_draws_are_served_in_turn():
    """Every checked workload and every fit workload samples the whole session (the machine's
    speed drifts over minutes): run 1 of each, then run 2, ...; grouped only for --calibrate,
    whose probes bracket one workload's runs."""
    from timelyllm_ros.profiling.check import run_order
    from timelyllm_ros.profiling.fit import fit_draws

    assert run_order(["WID1", "WID3"], 2, in_turn=True) == [(0, "WID1"), (0, "WID3"), (1, "WID1"), (1, "WID3")]
    assert run_order(["WID1", "WID3"], 2, in_turn=False) == [(0, "WID1"), (1, "WID1"), (0, "WID3"), (1, "WID3")]
    assert fit_draws(["mixed_small", "WID2"], 101, 2) == [("mixed_small", 101), ("WID2", 101),
                                                          ("mixed_small", 102), ("WID2", 102)]


def test_spot_check_replays_each_policy_with_the_plans_of_its_generation_kind():
    """Segmented runs (results in the context) and streamed runs write some plans differently;
    a policy replays the plans of the first real run of its own kind, else the union's."""
    from spot_check import generation_kind, plans_for, union_plans

    assert generation_kind("default") == "segmented" and generation_kind("edf") == "segmented"
    assert generation_kind("vllm-stream") == "whole" and generation_kind("vllm") == "whole"
    assert generation_kind("vllm-priority") == "whole"
    saved = {"runs": {
        "default": {"plans": {"r1": "seg1", "r2": "seg2"}},
        "vllm-stream": {"plans": {"r1": "whole1", "r3": "whole3"}},
        "vllm-priority": {"plans": {"r1": "other1", "r2": "whole2"}},
    }}
    assert union_plans(saved) == {"r1": "seg1", "r2": "seg2", "r3": "whole3"}
    # the first run of the kind wins; a request no run of the kind finished keeps the union's plan
    assert plans_for(saved, "vllm-priority") == {"r1": "whole1", "r2": "whole2", "r3": "whole3"}
    assert plans_for(saved, "vllm") == plans_for(saved, "vllm-priority")
    assert plans_for(saved, "default") == {"r1": "seg1", "r2": "seg2", "r3": "whole3"}
    assert plans_for(saved, "edf") == plans_for(saved, "default")  # a segmented policy not served


def test_spot_check_time_split_and_decode_speed_hand_computed(tmp_path):
    """A real run's serving time split into decode / prefill steps and host gaps, each next to
    the profile's charge; the run's speed from its plain decode steps only."""
    from spot_check import decode_speed, time_split

    prof = tmp_path / "p.yaml"
    prof.write_text("prefill_s_per_token: 0.001\ndecode_base_s: 0.01\nkv_block_size: 16\nkv_capacity_blocks: 100\n"
                    "add_base_s: 0.001\nadd_s_per_seq: 0.0005\n")

    def r(start, dur, post=0.0, prefill=0, adds=0):
        return [start, dur, post, 1, prefill, 0, 50, adds, 1]

    steps = [r(0.0, 0.012, 0.001), r(0.015, 0.030, prefill=10, adds=1), r(0.5, 0.028)]
    t = time_split(steps, prof)
    assert t["decode_s"] == pytest.approx(0.013 + 0.028) and t["decode_charged_s"] == pytest.approx(0.02)
    assert t["prefill_s"] == pytest.approx(0.030) and t["prefill_charged_s"] == pytest.approx(0.02)
    # 0.002 s before the prefill step (intake charged 0.001 + 0.0005); the 0.455 s gap is idle
    assert t["host_s"] == pytest.approx(0.002) and t["intake_charged_s"] == pytest.approx(0.0015)
    assert t["host_gaps"] == 1 and t["adds"] == 1
    assert decode_speed(steps, prof) == pytest.approx((0.013 + 0.028) / 0.02)  # the prefill step is left out
    assert decode_speed([], prof) is None and time_split([], prof) is None


def test_spot_check_saves_gzipped_where_the_name_says_so(tmp_path):
    """`--save F.json.gz` writes gzip (a stored run's name says what it holds), `--save F.json`
    plain JSON; `--real` reads both back to the same runs."""
    from spot_check import load_saved, save_real
    saved = {"runs": {"default": {"plans": ["tp;"], "steps": [[0.1, 2]]}}, "model": "m"}
    gz, plain = str(tmp_path / "r.json.gz"), str(tmp_path / "r.json")
    save_real(gz, saved)
    save_real(plain, saved)
    assert Path(gz).read_bytes()[:2] == b"\x1f\x8b"
    assert Path(plain).read_bytes()[:1] == b"{"
    assert load_saved(gz) == saved == load_saved(plain)
