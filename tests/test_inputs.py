"""Bad input on every entry point: one line on stderr naming the argument or file:line, exit 2,
and for `timelyllm demo` before the engine starts.  Same checks for the ROS planner node's
parameters (nodes/wiring.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from timelyllm_ros.cli import main
from timelyllm_ros.core.robots import ROBOTS_DIR, RobotSpecError, load_robots
from timelyllm_ros.engines.vllm_engine import VllmEngine
from timelyllm_ros.inputs import InputError, check_out_file, policy_param_names
from timelyllm_ros.nodes import wiring
from timelyllm_ros.nodes.params import ConfigError

REPO = Path(__file__).resolve().parents[1]
TUF = "tuf:\n  normal: {ert: 1.0, alpha: -2.0, beta: 1.0}\n"


@pytest.fixture()
def files(tmp_path):
    """Bad files of each kind, by name."""
    f = {}
    f["bad_yaml_robot"] = tmp_path / "badrobots"
    f["bad_yaml_robot"].mkdir()
    (f["bad_yaml_robot"] / "r.yaml").write_text("robot_type: x\nlanguage: minispec\nskills: [\n")
    f["dup_robot"] = tmp_path / "duprobots"
    f["dup_robot"].mkdir()
    shutil.copy(ROBOTS_DIR / "tello.yaml", f["dup_robot"] / "my_drone.yaml")
    f["robot_type"] = tmp_path / "rover.yaml"
    f["robot_type"].write_text("name: w\nduration_s: 10\nagents: {rover: 1}\nrequests:\n  - {time: 0.1, task: T1}\n" + TUF)
    f["task"] = tmp_path / "t99.yaml"
    f["task"].write_text("name: w\nduration_s: 10\nagents: {tello: 1}\nrequests:\n  - {time: 0.1, task: T99}\n" + TUF)
    f["yaml"] = tmp_path / "broken.yaml"
    f["yaml"].write_text("name: w\nduration_s: [10\n")
    f["profile"] = tmp_path / "profile.yaml"
    f["profile"].write_text("name: p\ndecode_base_s: [1\n")
    f["afile"] = tmp_path / "afile"
    f["afile"].write_text("x")
    return f


# (case, extra args with {placeholders} from `files`, expected text of the one line)
CASES = [
    ("unknown policy", ["--policy", "nope"], "--policy: unknown policy 'nope'; choose from "),
    ("batch cap 0", ["--max-batch", "0"], "argument --max-batch: must be >= 1, got 0"),
    ("unknown robot type", ["--workload", "{robot_type}"], "{robot_type}:3: agents: agent 'rover0' has robot type 'rover'"),
    ("unknown task", ["--workload", "{task}"], "{task}:5: requests[0].task: unknown task 'T99'"),
    ("malformed workload", ["--workload", "{yaml}"], "{yaml}:3: not valid YAML"),
    ("missing workload", ["--workload", "NOPE"], "cannot read workload 'NOPE'"),
    ("malformed robot YAML", ["--robots-dir", "{bad_yaml_robot}"], "{bad_yaml_robot}/r.yaml:4: not valid YAML"),
    ("duplicate robot_type", ["--robots-dir", "{dup_robot}"],
     "{dup_robot}/my_drone.yaml: robot_type 'tello' is already defined in " + str(ROBOTS_DIR / "tello.yaml")),
    ("unknown --param", ["--policy", "timelyllm", "--param", "foo=1"],
     "--param: bad parameters for policy 'timelyllm': unknown parameter 'foo' (its parameters: min_slack_s, rescue_late)"),
    ("bad --param value", ["--policy", "trail", "--param", "c=-1"], "--param: policy 'trail': c must be > 0"),
    ("malformed profile", ["--profile", "{profile}"], "--profile: {profile}:3: cannot read latency profile: not valid YAML"),
    ("bad --param syntax", ["--param", "novalue"], "argument --param: expected [policy:]name=value"),
]


def _fill(args, files):
    return [a.format(**files) for a in args]


@pytest.fixture()
def no_engine(monkeypatch):
    """The demo must fail before vLLM starts: starting it here is a test failure."""
    def refuse(self, *a, **k):
        raise AssertionError("the engine started before the bad input was reported")
    monkeypatch.setattr(VllmEngine, "__init__", refuse)


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def _run(argv) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # argparse usage errors
        return int(e.code)


@pytest.mark.parametrize("case,args,expected", CASES, ids=[c[0] for c in CASES])
def test_bench_bad_input_one_line_exit_2(case, args, expected, files, tmp_path, capsys):
    args = _fill(args, files)
    if "--policy" not in args:
        args += ["--policy", "timelyllm"]
    out = tmp_path / "r.json"
    rc = _run(["bench", "--workload", "mixed_small", "--out", str(out), "--no-progress", *args])
    line = _one_line(capsys)
    assert rc == 2
    assert line.startswith("timelyllm bench: error: ") and expected.format(**files) in line
    assert not out.exists()


@pytest.mark.parametrize("case,args,expected", CASES, ids=[c[0] for c in CASES])
def test_demo_bad_input_one_line_exit_2_before_the_engine(case, args, expected, files, tmp_path, capsys, no_engine):
    out = tmp_path / "demo"
    rc = _run(["demo", "--out", str(out), *_fill(args, files)])
    line = _one_line(capsys)
    assert rc == 2
    assert line.startswith("timelyllm demo: error: ") and expected.format(**files) in line
    assert not (out / "results.json").exists()


def test_unwritable_out_is_caught_before_any_work(files, tmp_path, capsys, no_engine):
    blocked = files["afile"] / "sub"
    assert _run(["bench", "--workload", "mixed_small", "--policy", "fcfs", "--out", str(blocked / "r.json")]) == 2
    assert f"--out '{blocked / 'r.json'}': '{files['afile']}' is a file, not a folder" in _one_line(capsys)
    assert _run(["bench", "--workload", "mixed_small", "--policy", "fcfs", "--out", str(tmp_path / "r.json"),
                 "--plot", str(blocked / "p.png")]) == 2
    assert "--plot" in _one_line(capsys)
    assert _run(["demo", "--out", str(blocked)]) == 2
    assert f"--out '{blocked}'" in _one_line(capsys)
    with pytest.raises(InputError, match="is a folder, expected a file name"):
        check_out_file(tmp_path)


def test_demo_engine_inputs_checked_before_the_engine(tmp_path, capsys, no_engine):
    cfg = tmp_path / "engine.yaml"
    cfg.write_text("max_num_seq: 4\n")
    for args, expected in ((["--engine-config", str(cfg)], "unknown keys ['max_num_seq']"),
                           (["--engine-config", str(tmp_path / "none.yaml")], "No such file"),
                           (["--model", str(tmp_path / "nomodel")], "--model: model path"),
                           (["--profile", str(tmp_path / "p.yaml")], "--profile"),
                           (["--baseline", "nope"], "--baseline: unknown policy 'nope'"),
                           (["--duration", "0"], "argument --duration: must be > 0"),
                           (["--timeout", "-1"], "argument --timeout: must be > 0")):
        assert _run(["demo", "--out", str(tmp_path / "o"), *args]) == 2
        assert expected in _one_line(capsys)


def test_demo_refuses_another_policys_results(tmp_path, capsys, no_engine):
    out = tmp_path / "demo"
    out.mkdir()
    (out / "results.json").write_text(json.dumps({"policy": "trail"}))
    assert _run(["demo", "--out", str(out), "--policy", "fcfs"]) == 2
    assert "holds results of policy 'trail'" in _one_line(capsys)


def test_duplicate_robot_type_blames_the_added_file(tmp_path):
    extra = tmp_path / "extra"
    extra.mkdir()
    shutil.copy(ROBOTS_DIR / "arm.yaml", extra / "zz_arm.yaml")
    with pytest.raises(RobotSpecError, match=f"^{extra / 'zz_arm.yaml'}: robot_type 'arm' is already defined in"):
        load_robots(ROBOTS_DIR, extra_dirs=[extra])
    # both in one folder (copied into robots/): the newer file is the one blamed, whatever its name
    one = tmp_path / "one"
    shutil.copytree(ROBOTS_DIR, one)
    new = one / "a_arm.yaml"
    shutil.copy(one / "arm.yaml", new)
    os.utime(one / "arm.yaml", (1_000_000, 1_000_000))
    with pytest.raises(RobotSpecError, match=f"^{new}: robot_type 'arm' is already defined in {one / 'arm.yaml'}"):
        load_robots(one)


def test_custom_robots_dir_is_used(tmp_path, capsys):
    extra = tmp_path / "robots"
    extra.mkdir()
    spec = (ROBOTS_DIR / "tello.yaml").read_text().replace("robot_type: tello", "robot_type: mini_drone")
    (extra / "mini.yaml").write_text(spec)
    wl = tmp_path / "w.yaml"
    wl.write_text("name: w\nduration_s: 5\nagents: {mini_drone: 1}\nrequests:\n  - {time: 0.1, task: T1}\n" + TUF)
    # T1 is a tello task: the workload is refused for the custom type with the line of the request
    assert _run(["bench", "--workload", str(wl), "--policy", "fcfs", "--robots-dir", str(extra),
                 "--out", str(tmp_path / "r.json")]) == 2
    assert f"{wl}:5: requests[0].task: task 'T1' needs a 'tello' agent" in _one_line(capsys)  # not: unknown robot type
    assert "mini_drone" in load_robots(ROBOTS_DIR, extra_dirs=[extra])


def test_policy_parameters_come_from_the_registry():
    assert policy_param_names("timelyllm") == ["min_slack_s", "rescue_late"]
    assert "c" in policy_param_names("trail")


def test_version_and_help(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("timelyllm ")
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    text = capsys.readouterr().out
    for opt in ("--policy", "--seed", "--timeout", "--robots-dir", "--baseline", "--param", "--profile"):
        assert opt in text
    assert "timelyllm-lamps" in text  # the policy list comes from the registry
    with pytest.raises(SystemExit):
        main(["plan-offline", "--help"])
    text = capsys.readouterr().out
    assert "``" not in text and "workloads/hybrid_gsm8k.yaml" in text


# ------------------------------------------------------------------------ ROS planner node config

def test_planner_node_config_errors_are_one_line(files, tmp_path):
    cases = [
        ({"policy": "nope"}, "policy: unknown policy 'nope'"),
        ({"max_batch": -1}, "max_batch: must be an integer >= 0"),
        ({"robots_dir": str(files["bad_yaml_robot"])}, "robots_dir: " + str(files["bad_yaml_robot"] / "r.yaml") + ":4"),
        ({"profile": str(tmp_path / "none.yaml")}, "profile: "),
        ({"engine": "vllm", "engine_config": str(tmp_path / "none.yaml")}, "engine_config '"),
        ({"engine": "vllm", "model": str(tmp_path / "nomodel")}, "model: model path"),
        ({"polcy": "fcfs"}, "unknown planner parameters ['polcy']"),
    ]
    dup = tmp_path / "dup"
    shutil.copytree(ROBOTS_DIR, dup)
    shutil.copy(dup / "tello.yaml", dup / "tello2.yaml")
    os.utime(dup / "tello.yaml", (1_000_000, 1_000_000))
    cases.append(({"robots_dir": str(dup)}, f"robots_dir: {dup / 'tello2.yaml'}: robot_type 'tello' is already defined"))
    for params, expected in cases:
        with pytest.raises(ConfigError) as e:
            wiring.build_planner(params)
        assert expected in str(e.value) and "\n" not in str(e.value), (params, str(e.value))


def test_planner_node_exits_2_on_bad_parameter():
    pytest.importorskip("rclpy")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "ros" / "planner_node"), "--ros-args",
                        "-p", "policy:=nope"], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 2, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if "unknown policy 'nope'" in ln]
    assert len(errors) == 1 and "Traceback" not in r.stderr


# ------------------------------------------------------------------------------ the demo's report

def _summary(utilities):
    """A metrics summary (core.metrics.summarize form) with these (utility, max) per request."""
    return {"requests": [{"utility": u, "max_utility": m} for u, m in utilities]}


def test_engine_speed_against_the_profile_and_the_deadline_line():
    from timelyllm_ros.engines.base import StepRecord
    from timelyllm_ros.engines.simulated import LatencyProfile
    from timelyllm_ros.report import deadline_line, engine_speed, speed_line

    prof = LatencyProfile.from_yaml(REPO / "profiles" / "vllm_cpu_tiny.yaml")
    shape = dict(seqs=4, prefill_tokens=0, prefill_context_tokens=0, context_tokens=4000, adds=0, output_tokens=4)
    charged = prof.record_s(StepRecord(start_s=0, duration_s=0, post_s=0, **shape))
    slow = [StepRecord(start_s=i, duration_s=2 * charged, post_s=0.0, **shape) for i in range(10)]
    s = engine_speed(slow, prof)
    assert s.steps == 10 and s.output_tokens == 40 and abs(s.ratio - 2.0) < 1e-9
    assert abs(s.tokens_per_s - 40 / (20 * charged)) < 1e-6
    assert "2.00x the profile's step time" in speed_line(s) and "vllm_cpu_tiny" in speed_line(s)
    real, sim = _summary([(0.5, 1.0), (2.0, 2.0)]), _summary([(1.0, 1.0), (2.0, 2.0)])
    line = deadline_line(real, sim, s)
    assert line.startswith("deadlines: 1 of 2 requests missed their ERT here, 0 in the simulator")
    assert "2.0x slower than the profile" in line and "too slow for the workload's deadlines" in line
    fast = engine_speed([StepRecord(start_s=0, duration_s=charged, post_s=0.0, **shape)], prof)
    assert "not explained by a slow machine" in deadline_line(real, sim, fast)
    assert "too slow" not in deadline_line(sim, sim, s)


def test_engine_speed_tells_stalls_from_steady_steps():
    """A run slower than the profile says where: stalled steps (>= STALL_S and STALL_FACTOR x their
    charge) apart from the steady ones, whose ratio is what the simulator is scaled by."""
    from timelyllm_ros.engines.base import StepRecord
    from timelyllm_ros.engines.simulated import LatencyProfile
    from timelyllm_ros.report import engine_speed, slow_note, speed_line

    prof = LatencyProfile.from_yaml(REPO / "profiles" / "vllm_cpu_tiny.yaml")
    shape = dict(seqs=2, prefill_tokens=0, prefill_context_tokens=0, context_tokens=800, adds=0, output_tokens=2)
    charged = prof.record_s(StepRecord(start_s=0, duration_s=0, post_s=0, **shape))
    steady = [StepRecord(start_s=i, duration_s=1.5 * charged, post_s=0.0, **shape) for i in range(200)]
    stalls = [StepRecord(start_s=300, duration_s=4.0, post_s=0.0, **shape),
              StepRecord(start_s=301, duration_s=6.9, post_s=0.1, **shape)]
    s = engine_speed(steady[:100] + stalls + steady[100:], prof)
    assert s.stalls_s == (7.0, 4.0) and s.steps == 202
    assert s.steady_ratio == pytest.approx(1.5) and s.ratio > 10
    assert s.median_step_s == pytest.approx(1.5 * charged) and s.median_profile_s == pytest.approx(charged)
    note = slow_note(s)
    assert note.startswith(f"engine {s.ratio:.2f}x slower than profile vllm_cpu_tiny: 2 stalls of 7.0 s and 4.0 s")
    assert f"median step {1e3 * 1.5 * charged:.1f} ms vs {1e3 * charged:.1f} ms (steady steps 1.50x)" in note
    assert note in speed_line(s) and s.as_dict()["stalls_s"] == [7.0, 4.0]
    slow = engine_speed(steady, prof)  # slower, no stall
    assert slow.stalls_s == () and "1.50x slower than profile vllm_cpu_tiny: no stalls" in slow_note(slow)
    at_speed = [StepRecord(start_s=0, duration_s=charged, post_s=0.0, **shape)]
    assert slow_note(engine_speed(at_speed, prof)) is None  # at the profile's speed: nothing to explain


def test_demo_compares_policies_at_the_runs_own_engine_speed(tmp_path):
    """The demo's simulated comparison runs at the engine speed the run measured: a run served at
    twice the profile's step time (here: the simulator itself at 2x) is reproduced by the report's
    'simulator at this run's engine speed', and the figure's title says the run was slower."""
    from timelyllm_ros.cli import build_parser
    from timelyllm_ros.demo import at_profile_speed, check_demo_inputs, report
    from timelyllm_ros.report import console

    args = build_parser().parse_args(["demo", "--duration", "26", "--baseline", "vllm", "--out", str(tmp_path / "d")])
    inp = check_demo_inputs(args)
    assert inp.workload.name == "mixed_burst" and inp.max_batch == 4
    assert check_demo_inputs(build_parser().parse_args(["demo", "--max-batch", "none", "--out", str(tmp_path / "n")])
                             ).max_batch is None  # the policy's own batching
    plans = {a.request_id: a.reference_plan for a in inp.arrivals}
    log: list = []
    run = at_profile_speed(inp, inp.policy, plans, step_log=log, exclusive_agents=True, speed=2.0)
    doc = report(console(), inp, metrics=run.metrics, plans=plans, step_records=log, device="cpu", wall_s=1.0,
                 mode="ROS 2 graph", exclusive_agents=True)
    assert doc["simulated_speed_ratio"] == pytest.approx(2.0, rel=0.02)
    sims = doc["simulated_same_arrivals"]
    mine = next(m for k, m in sims.items() if k.startswith(f"{inp.policy} — simulator at this run's engine speed (2.0"))
    assert mine["overall"]["utility_pct_of_max"] == pytest.approx(run.metrics["overall"]["utility_pct_of_max"], abs=0.5)
    # the burst: FCFS (the vllm baseline) keeps the urgent drones waiting behind the chat replies
    base = next(m for k, m in sims.items() if k.startswith("vllm (baseline)"))
    assert base["by_category"]["urgent"]["utility_pct_of_max"] < mine["by_category"]["urgent"]["utility_pct_of_max"]
    assert mine["overall"]["accrued_utility_pct_of_max"] == pytest.approx(
        run.metrics["overall"]["accrued_utility_pct_of_max"], abs=0.5)


def test_demo_comparison_line_names_the_whole_plan_and_the_first_action():
    """The demo's comparison lines say both scores, whole plan (Eq. 3) first; a category without a
    figure shows '-' rather than a number."""
    from timelyllm_ros.demo import score_line

    m = {"overall": {"accrued_utility_pct_of_max": 95.04, "utility_pct_of_max": 89.06},
         "by_category": {"urgent": {"accrued_utility_pct_of_max": 97.8, "utility_pct_of_max": 96.2},
                         "chat": {"accrued_utility_pct_of_max": None, "utility_pct_of_max": 93.4}}}
    assert score_line(m) == ("whole plan 95.0 % of max (chat -, urgent 97.8); "
                             "first action 89.1 % of max (chat 93.4, urgent 96.2)")


def test_demo_figure_says_why_and_cuts_far_negative_bars(tmp_path, monkeypatch):
    """demo.png carries the slow-run note under its title, and a bar far below zero (a request
    answered seconds late: -700 %) is cut at PCT_FLOOR with its value written, the others kept."""
    from timelyllm_ros import plots

    figs = []
    monkeypatch.setattr(plots.plt, "close", figs.append)  # keep the figure to look at it

    def summary(pct):
        agg = {"utility_pct_of_max": pct, "accrued_utility_pct_of_max": pct - 5.0, "response_s": {"mean": 0.1}}
        return {"by_task_type": {"T6": agg, "T9": dict(agg, utility_pct_of_max=-700.0 if pct < 100 else 90.0,
                                                       accrued_utility_pct_of_max=-900.0 if pct < 100 else 80.0)},
                "by_category": {"urgent": agg}, "overall": agg}

    note = "engine 10.65x slower than profile vllm_cpu_tiny: 2 stalls of 7.0 s and 4.0 s (11.0 s in all)"
    out = plots.plot_pct_of_max({"this run": summary(50.0), "simulator": summary(100.0)}, tmp_path / "d.png",
                                title="demo", notes=[note])
    assert out.read_bytes()[:4] == b"\x89PNG"
    fig = figs[0]
    assert fig.get_suptitle() == f"demo\n{note}"
    plan, util = fig.axes[0], fig.axes[1]  # the whole plan (Eq. 3) first, the first action under it
    assert "whole plan" in plan.get_ylabel() and "first action" in util.get_ylabel()
    for ax, kept, far in ((plan, (80.0, 45.0), "-900"), (util, (90.0, 50.0), "-700")):
        assert ax.get_ylim()[0] >= plots.PCT_FLOOR - 20
        heights = sorted(round(b.get_height(), 1) for b in ax.patches)
        assert heights[0] == plots.PCT_FLOOR and all(k in heights for k in kept)
        assert [t.get_text() for t in ax.texts] == [far]


def test_drain_eta_runs_pending_segments_back_to_back():
    from timelyllm_ros.core.tuf import TUF
    from timelyllm_ros.core.types import Generation, PlanRequest, Segment
    from timelyllm_ros.serve import drain_eta

    def seg(i, est, start=None, end=None):
        return Segment(index=i, text="x", calls=(), blocking=False, token_count=1, gen_start=0.0, gen_end=0.0,
                       est_exec_s=est, exec_start=start, exec_end=end)

    req = PlanRequest(request_id="r", robot_id="d", robot_type="tello", task="t", scene="s",
                      tuf=TUF(ert=1.0, alpha=-2.0, beta=1.0), arrival=0.0)
    g = Generation(request=req, segments=[seg(0, 3.0, 0.0, 3.0), seg(1, 4.0, 9.0), seg(2, 5.0)])
    assert drain_eta([g], now=10.0) == pytest.approx(9.0 + 4.0 + 5.0 - 10.0)
    assert drain_eta([], now=10.0) == 0.0
    late = Generation(request=req, segments=[seg(0, 1.0, 2.0)])  # overran its estimate: ends "now"
    assert drain_eta([late, g], now=10.0) == pytest.approx(8.0) and drain_eta([late], now=10.0) == 0.0


def test_bench_catalog_and_plan_offline_files(files, tmp_path, capsys):
    assert _run(["bench", "--workload", "mixed_small", "--policy", "fcfs", "--out", str(tmp_path / "r.json"),
                 "--catalog", str(files["profile"])]) == 2
    assert f"{files['profile']}:3: cannot read task file: not valid YAML" in _one_line(capsys)
    assert _run(["plan-offline", "WID1"]) == 2
    line = _one_line(capsys)
    assert "WID1 is an LRTrace workload for `timelyllm bench`" in line and "workloads/hybrid_gsm8k.yaml" in line


def test_demo_report_from_records_without_an_engine(tmp_path, capsys):
    """The demo's report (table, engine speed, deadline line, results.json, demo.png) needs only a
    run's records.  Records from the simulator with the demo's own profile must measure 1.0x it."""
    from timelyllm_ros.cli import build_parser
    from timelyllm_ros.demo import at_profile_speed, check_demo_inputs, report
    from timelyllm_ros.report import console

    args = build_parser().parse_args(["demo", "--policy", "timelyllm", "--duration", "8", "--out", str(tmp_path / "d")])
    inp = check_demo_inputs(args)
    plans = {a.request_id: a.reference_plan for a in inp.arrivals}
    log: list = []
    sim = at_profile_speed(inp, "timelyllm", plans, step_log=log)
    doc = report(console(), inp, metrics=sim.metrics, plans=plans, step_records=log, device="cpu", wall_s=1.0)
    speed = doc["engine_speed"]
    assert speed["steps"] == len(log) > 0 and speed["ratio"] == pytest.approx(1.0, rel=0.05)
    assert set(doc["simulated_same_arrivals"]) == {
        "timelyllm — simulator at this run's engine speed (1.00x profile vllm_cpu_tiny, steady steps), same arrivals "
        "and plans",
        "vllm-priority (baseline) — simulator at this run's engine speed (1.00x profile vllm_cpu_tiny, steady steps), same "
        "arrivals and plans"}
    assert list(doc["simulated_at_profile_speed"]) == [
        "timelyllm — simulator, fitted profile vllm_cpu_tiny, same arrivals and plans"]
    out = capsys.readouterr().out
    assert "engine speed: " in out and "deadlines: " in out and "T1" in out
    assert "slower than profile" not in out  # a run at the profile's speed needs no note
    # a ROS 2 graph run (one executor node per robot): the comparison runs one goal per robot at a time
    graph = report(console(), inp, metrics=sim.metrics, plans=plans, step_records=log, device="cpu", wall_s=1.0,
                   mode="ROS 2 graph", exclusive_agents=True)
    assert all(k.endswith(", one goal per robot at a time") for k in graph["simulated_same_arrivals"])
    assert len(graph["simulated_same_arrivals"]) == 2
    assert json.loads((inp.out / "results.json").read_text())["policy"] == "timelyllm"
    assert (inp.out / "demo.png").read_bytes()[:4] == b"\x89PNG"
