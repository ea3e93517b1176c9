"""`timelyllm bench` smoke tests: JSON + PNGs, byte-identical reruns, clear errors with exit 2."""

from __future__ import annotations

import json
import math

import pytest

from timelyllm_ros.cli import build_parser, main

WL = """name: clitest
duration_s: 8
seed: 3
events: {rate_per_s: 0.5, max_tasks_per_event: 3}
agents: {tello: 4}
traces: [1, 6]
tuf:
  normal: {ert: 1.0, alpha: -2.0, beta: 1.0}
  urgent: {ert: 0.2, alpha: -6.67, beta: 2.0}
requests:
  - {time: 0.2, task: T6}
  - {time: 0.2, task: T1}
"""


@pytest.fixture()
def wl(tmp_path):
    p = tmp_path / "w.yaml"
    p.write_text(WL)
    return p


def test_bench_writes_json_table_and_plots(wl, tmp_path, capsys):
    out, fig, tl = tmp_path / "r.json", tmp_path / "f.png", tmp_path / "t.png"
    rc = main(["bench", "--workload", str(wl), "--policy", "timelyllm", "--policy", "vllm", "--out", str(out),
               "--plot", str(fig), "--timeline", str(tl), "--no-progress"])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert set(doc["policies"]) == {"timelyllm", "vllm"}
    for name, res in doc["policies"].items():
        assert res["policy"] == name
        n = res["metrics"]["overall"]["count"]
        assert n >= 2 and len(res["timeline"]) == n
        assert res["metrics"]["overall"]["states"] == {"finished": n}
        # issue 25: the whole plan's figures beside the existing ones, where outside tools read them
        m = res["metrics"]
        for agg in [m["overall"], *m["by_category"].values(), *m["by_task_type"].values()]:
            assert -1e3 < agg["accrued_utility_pct_of_max"] <= 100.0 + 1e-9
            assert agg["utility_pct_of_max"] <= 100.0 + 1e-9
            assert agg["completion_s"]["mean"] > 0 and agg["completion_s"]["p99"] >= agg["completion_s"]["mean"] - 1e-9
            cw = agg["continuation_wait_s"]
            assert cw["max"] is None or 0 <= cw["mean"] <= cw["max"] and cw["p99"] <= cw["max"] + 1e-9
    assert doc["policies"]["timelyllm"]["batcher"] == "latency-guided"
    assert doc["policies"]["vllm"]["batcher"] == "fixed(256)"
    for p in (fig, tl):
        data = p.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    text = capsys.readouterr().out
    assert "T1" in text and "T6" in text and "[urgent]" in text  # the rich table per policy
    assert "plan %max" in text and "cont.wait s" in text

    out2 = tmp_path / "r2.json"
    assert main(["bench", "--workload", str(wl), "--policy", "timelyllm", "--policy", "vllm",
                 "--out", str(out2), "--no-progress"]) == 0
    assert out2.read_bytes() == out.read_bytes()


def test_bench_max_batch_and_params(wl, tmp_path):
    out = tmp_path / "r.json"
    assert main(["bench", "--workload", str(wl), "--policy", "fcfs", "--max-batch", "2", "--seed", "9",
                 "--out", str(out), "--no-progress"]) == 0
    doc = json.loads(out.read_text())
    assert doc["seed"] == 9 and doc["max_batch"] == 2
    assert doc["policies"]["fcfs"]["batcher"] == "fixed(2)"


def test_param_scoped_to_one_policy(wl, tmp_path, capsys):
    """`policy:name=value` reaches only that policy (a Trail-only knob would break fcfs)."""
    out = tmp_path / "r.json"
    assert main(["bench", "--workload", str(wl), "--policy", "trail", "--policy", "fcfs",
                 "--param", "trail:predictor=oracle", "--param", "trail:c=0.5",
                 "--out", str(out), "--no-progress"]) == 0
    pols = json.loads(out.read_text())["policies"]
    assert pols["trail"]["policy_params"] == {"predictor": "oracle", "c": 0.5}
    assert pols["fcfs"]["policy_params"] == {}
    rc = main(["bench", "--workload", str(wl), "--policy", "fcfs", "--param", "trail:c=0.5",
               "--out", str(tmp_path / "x.json"), "--no-progress"])
    assert rc == 2 and "--param names policies not in this run: ['trail']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "--workload", str(wl), "--policy", "fcfs", "--param", ":c=1", "--out", "x.json"])


def test_param_values_are_yaml_and_inf_means_no_limit():
    """`inf` (what the parameters' errors say: "inf: no step-time cap") is a float, as YAML's `.inf`."""
    from timelyllm_ros.cli import _param

    assert _param("step_ratio=inf") == (None, "step_ratio", math.inf)
    assert _param("default:step_ratio=.inf") == ("default", "step_ratio", math.inf)
    assert _param("x=-Infinity") == (None, "x", -math.inf)
    assert _param("pace=true") == (None, "pace", True) and _param("c=0.5") == (None, "c", 0.5)
    assert _param("pace_kv=cache") == (None, "pace_kv", "cache") and _param("s=info") == (None, "s", "info")
    # exponent floats without a dot, which YAML 1.1 leaves as strings, are floats too
    assert _param("heavy_rho=1e9") == (None, "heavy_rho", 1e9)
    assert _param("x=-2.5E-3") == (None, "x", -2.5e-3) and _param("x=.5e1") == (None, "x", 5.0)
    assert _param("x=1.0e9") == (None, "x", 1e9) and _param("x=e9") == (None, "x", "e9")
    assert _param("x=1e") == (None, "x", "1e") and _param("x=10") == (None, "x", 10)


def test_unknown_policy_exits_2(wl, tmp_path, capsys):
    rc = main(["bench", "--workload", str(wl), "--policy", "nope", "--out", str(tmp_path / "x.json")])
    assert rc == 2
    err = capsys.readouterr().err
    assert "unknown policy 'nope'" in err and "timelyllm" in err
    assert not (tmp_path / "x.json").exists()


def test_bad_workload_exits_2_with_line(tmp_path, capsys):
    p = tmp_path / "bad.yaml"
    p.write_text("name: bad\nduration_s: 10\nevents: {rate_per_s: -1}\nagents: {tello: 1}\ntraces: [1]\n")
    rc = main(["bench", "--workload", str(p), "--policy", "timelyllm", "--out", str(tmp_path / "x.json")])
    assert rc == 2
    assert f"{p}:3: events.rate_per_s: must be > 0" in capsys.readouterr().err


def test_missing_workload_and_bad_policy_param_exit_2(wl, tmp_path, capsys):
    assert main(["bench", "--workload", "NOPE", "--policy", "timelyllm", "--out", str(tmp_path / "x.json")]) == 2
    assert "bundled workloads" in capsys.readouterr().err
    rc = main(["bench", "--workload", str(wl), "--policy", "timelyllm", "--param", "no_such_param=1",
               "--out", str(tmp_path / "x.json"), "--no-progress"])
    assert rc == 2
    assert "bad parameters for policy" in capsys.readouterr().err


def test_usage_errors_exit_2():
    with pytest.raises(SystemExit) as e:
        main(["bench", "--workload", "WID1", "--policy", "timelyllm", "--max-batch", "0", "--out", "x.json"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        main([])
    assert e.value.code == 2


def test_parser_is_modular():
    ap = build_parser()
    sub = next(a for a in ap._actions if a.dest == "cmd")
    assert "bench" in sub.choices
