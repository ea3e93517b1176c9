"""`timelyllm sweep` (regime map): grid parsing, one-line errors, byte-identical JSON, the
isolated-service bound as a true upper bound, timeouts reported (never dropped)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from timelyllm_ros.cli import main
from timelyllm_ros.core.metrics import to_json
from timelyllm_ros.core.robots import load_robots
from timelyllm_ros.workloads.format import default_catalog
from timelyllm_ros.sim import regime
from timelyllm_ros.sweep import PLAN_CHUNK, sweep

# A burst on a small engine: six drone tasks (three urgent) at once, then a few more events.
WL = """name: sweeptest
duration_s: 6
seed: 5
events: {rate_per_s: 0.6, max_tasks_per_event: 3}
agents: {tello: 8}
traces: [1, 6]
tuf:
  normal: {ert: 1.0, alpha: -2.0, beta: 1.0}
  urgent: {ert: 0.2, alpha: -6.67, beta: 2.0}
requests:
  - {time: 0.5, task: T6, scene: 0}
  - {time: 0.5, task: T7, scene: 1}
  - {time: 0.5, task: T8, scene: 2}
  - {time: 0.5, task: T1, scene: 0}
  - {time: 0.5, task: T2, scene: 1}
  - {time: 0.5, task: T3, scene: 0}
"""


@pytest.fixture(scope="module")
def wl(tmp_path_factory):
    p = tmp_path_factory.mktemp("sweep") / "w.yaml"
    p.write_text(WL)
    return str(p)


@pytest.fixture(scope="module")
def env():
    robots = load_robots()
    return robots, default_catalog(robots)


# --- grid parsing -------------------------------------------------------------------------------

def test_parse_capacity():
    assert regime.parse_capacity("default") == regime.Capacity("default")
    assert regime.parse_capacity("kv/4") == regime.Capacity("kv/4", kv_divisor=4)
    assert regime.parse_capacity(" cap16 ") == regime.Capacity("cap16", max_batch=16)
    for bad in ("kv/0", "cap0", "kv4", "cap", "half", "kv/-2", ""):
        with pytest.raises(regime.GridError, match="capacity"):
            regime.parse_capacity(bad)



def test_parse_cell_key():
    """A stored map's cell name, PROFILE/ENGINE/LOAD/CAPACITY (the capacity may hold a slash)."""
    assert regime.parse_cell_key("orin_nano_llama3_2_3b/preserve/drones:400/kv/4") == regime.Cell(
        load="drones:400", capacity="kv/4", profile="orin_nano_llama3_2_3b", engine="preserve")
    for bad, why in (("rtx4090_llama3_8b/stock/drones:400", "PROFILE/ENGINE/LOAD/CAPACITY"),
                     ("rtx4090_llama3_8b//drones:400/cap8", "PROFILE/ENGINE/LOAD/CAPACITY"),
                     ("rtx4090_llama3_8b/gpu/drones:400/cap8", "engine kind"),
                     ("rtx4090_llama3_8b/stock/drones:400/cap0", "capacity")):
        with pytest.raises(regime.GridError, match=why):
            regime.parse_cell_key(bad)

def test_capacity_scales_kv_memory_only():
    base = regime.LatencyProfile.from_yaml(regime.resolve_profile("rtx4090_llama3_8b"))
    half = regime.parse_capacity("kv/2").profile(base)
    assert half.kv_capacity_blocks == base.kv_capacity_blocks // 2
    assert half.decode_base_s == base.decode_base_s and half.name == base.name
    assert regime.parse_capacity("cap8").profile(base) is base


def test_resolve_profile_names_bundled_ones():
    assert regime.resolve_profile("orin_nano_llama3_2_3b").is_file()
    with pytest.raises(regime.GridError, match="bundled: .*rtx4090_llama3_8b"):
        regime.resolve_profile("no_such_gpu")


@pytest.mark.parametrize("argv, needle", [
    (["--capacities", "default,kv/0"], "capacity 'kv/0'"),
    (["--policies", "timelyllm,nope"], "unknown policy 'nope'"),
    (["--policies", "fcfs,fcfs"], "policy 'fcfs' given twice"),
    (["--loads", "WID1,drones:x"], "drones:N"),
    (["--loads", "no_such_load"], "load 'no_such_load'"),
    (["--profiles", "gpu9000"], "profile 'gpu9000'"),
    (["--loads", "WID1,WID1"], "load 'WID1' given twice"),
])
def test_bad_grid_is_one_line_exit_2(argv, needle, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["sweep", *argv, "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("timelyllm sweep: error:") and needle in err and "\n" not in err
    assert not out.exists()


def test_usage_errors_exit_2(capsys):
    for argv in (["sweep", "--loads", ""], ["sweep", "--loads", "WID1,,WID2"], ["sweep", "--workers", "0"],
                 ["sweep", "--cell-timeout", "-1"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2


def test_output_that_is_a_folder(tmp_path, capsys):
    assert main(["sweep", "--loads", "WID1", "--out", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err


# --- the bound ----------------------------------------------------------------------------------

def test_bound_is_an_upper_bound_for_every_policy(wl, env):
    """No scheduler beats isolated service: request by request, on a contended small cell."""
    robots, catalog = env
    cell = regime.Cell(wl, "cap2", "rtx4090_llama3_8b")
    arrivals = regime.cell_arrivals(wl, robots, catalog)
    assert len(arrivals) >= 8
    cache: dict = {}

    def response(a):
        k = regime.bound_key(a)
        if k not in cache:
            cache[k] = regime.isolated_response(a, regime.resolve_profile(cell.profile), network_latency_s=0.008,
                                                robots=robots, catalog=catalog)[0]
        return cache[k]

    bound = regime.bound_figures(arrivals, response)
    seed = regime.check_load(wl).seed
    plan = regime.isolated_plan(arrivals, regime.resolve_profile(cell.profile), network_latency_s=0.008, seed=seed,
                                robots=robots, catalog=catalog)
    below = plan_below = 0
    for kind in regime.ENGINE_KINDS:
        for policy in regime.policy_names():
            run = regime.run_cell_policy(dataclasses.replace(cell, engine=kind), policy, robots=robots, catalog=catalog)
            assert run["status"] == "ok", (policy, run)
            assert set(run["utility"]) == set(bound["utility"]) == set(plan)
            for rid, u in run["utility"].items():
                assert u <= bound["utility"][rid] + 1e-9, (policy, rid, u, bound["utility"][rid])
                below += u < bound["utility"][rid] - 1e-6
            # Eq. 3: request by request, nothing beats the request served alone
            for rid, u in run["accrued"].items():
                assert u <= plan[rid][0] + 1e-9, (kind, policy, rid, u, plan[rid])
                plan_below += u < plan[rid][0] - 1e-6
            assert run["total_pct"] <= bound["total_pct"] + 1e-9
    assert below > 0 and plan_below > 0  # the cell is contended: the bounds are not trivially met


def test_isolated_response_is_warm_and_alone(env):
    """Alone with its prompt cached, an urgent drone task's first action starts well before its
    0.2 s expected response on the paper's GPU profile."""
    robots, catalog = env
    a = next(x for x in regime.cell_arrivals("WID1", robots, catalog) if x.category == "urgent")
    resp, policy = regime.isolated_response(a, regime.resolve_profile("rtx4090_llama3_8b"), network_latency_s=0.008,
                                            robots=robots, catalog=catalog)
    assert 0.03 < resp < 0.2 and policy in regime.policy_names()


# --- whole sweep: determinism, outputs, timeouts -------------------------------------------------

def test_same_seed_same_json_any_worker_count(wl):
    grid = ([wl], ["default", "cap2"], ["rtx4090_llama3_8b"], ["timelyllm", "vllm-stream"])
    a, walls = sweep(*grid, seed=9, workers=1)
    b, _ = sweep(*grid, seed=9, workers=2)
    assert to_json(a) == to_json(b)
    assert walls["cells"] and walls["total_s"] > 0  # wall times live outside the JSON
    assert "wall" not in to_json(a)
    c, _ = sweep(*grid, seed=10, workers=1)
    assert to_json(c) != to_json(a)  # the seed matters
    cell = a["cells"][1]
    assert cell["capacity"] == "cap2" and set(cell["policies"]) == {"timelyllm", "vllm-stream"}
    for rec in cell["policies"].values():
        assert rec["status"] == "ok" and rec["pct_of_bound"] <= 100.0 + 1e-9
        assert rec["requests"] == cell["requests"]
        # issue 25: the whole plan's figures, under the names of `timelyllm bench`
        for grp in [rec["metrics"]["overall"], *rec["metrics"]["by_category"].values(),
                    *rec["metrics"]["by_task_type"].values()]:
            assert set(grp) == {"accrued_utility_pct_of_max", "utility_pct_of_max", "completion_s",
                                "continuation_wait_s"}
            assert set(grp["completion_s"]) == {"mean", "p99"} and set(grp["continuation_wait_s"]) == {"mean", "p99", "max"}
        assert rec["accrued_total_pct"] == rec["metrics"]["overall"]["accrued_utility_pct_of_max"]


def test_cli_writes_json_heatmap_markdown(wl, tmp_path, capsys):
    out, md = tmp_path / "r.json", tmp_path / "r.md"
    rc = main(["sweep", "--loads", wl, "--capacities", "cap2", "--profiles", "orin_nano_llama3_2_3b",
               "--policies", "timelyllm,fcfs", "--workers", "1", "--out", str(out), "--markdown", str(md)])
    assert rc == 0
    cap = capsys.readouterr()
    assert "accrued utility of the whole plan (Eq. 3), total" in cap.out and "orin_nano_llama3_2_3b" in cap.out
    assert "first-action utility only (Eq. 1), total" in cap.out
    assert "[cells 2/2" in cap.err and "ETA" in cap.err  # one cell per capability column
    doc = json.loads(out.read_text())
    assert doc["grid"]["engine_kinds"] == ["stock", "preserve"] and [c["engine"] for c in doc["cells"]] == \
        ["stock", "preserve"]
    for c in doc["cells"]:
        assert c["bound"]["accrued_total_pct"] is not None
        for rec in c["policies"].values():
            assert rec["accrued_pct_of_bound"] <= 100.0 + 1e-9
    assert doc["grid"]["profiles"] == ["orin_nano_llama3_2_3b"] and doc["source"] == "simulator"
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / "r.walls.json").read_text())["workers"] == 1
    assert "| column | load | capacity | bound |" in md.read_text()


def test_timeout_is_reported_not_dropped(wl, tmp_path):
    doc, _ = sweep([wl], ["default"], ["rtx4090_llama3_8b"], ["timelyllm", "fcfs"], workers=1,
                   cell_timeout_s=1e-9)
    recs = doc["cells"][0]["policies"]
    assert set(recs) == {"timelyllm", "fcfs"}
    assert all(r["status"] == "timeout" and "wall limit" in r["reason"] for r in recs.values())
    assert doc["cells"][0]["best"]["total_pct"] is None


def test_cache_resumes_with_identical_json(wl, tmp_path):
    grid = ([wl], ["cap2"], ["rtx4090_llama3_8b"], ["timelyllm", "edf"])
    fresh, _ = sweep(*grid, workers=1)
    lines: list[str] = []
    first, _ = sweep(*grid, workers=1, cache_dir=tmp_path / "c")
    stored = sorted((tmp_path / "c").glob("*.json"))
    arrivals = regime.cell_arrivals(wl, load_robots(), default_catalog())
    plan_chunks = -(-len(arrivals) // PLAN_CHUNK)  # Eq. 3's isolated-service jobs
    assert len(stored) == 2 + len({regime.bound_key(a) for a in arrivals}) + plan_chunks
    again, _ = sweep(*grid, workers=1, cache_dir=tmp_path / "c", log=lines.append)
    assert to_json(fresh) == to_json(first) == to_json(again)
    assert f"{len(stored)} jobs from the cache" in lines[0]


def test_cached_only_reports_pending_runs(wl, tmp_path, capsys):
    out = tmp_path / "r.json"
    base = ["sweep", "--loads", wl, "--profiles", "rtx4090_llama3_8b", "--workers", "1", "--no-progress",
            "--cache-dir", str(tmp_path / "c"), "--out", str(out)]
    assert main(base + ["--capacities", "cap2", "--policies", "fcfs"]) == 0
    assert main(base + ["--capacities", "cap2,cap4", "--policies", "fcfs,edf", "--cached-only"]) == 0
    cells = {c["capacity"]: c["policies"] for c in json.loads(out.read_text())["cells"]}
    assert cells["cap2"]["fcfs"]["status"] == "ok"
    assert {cells["cap2"]["edf"]["status"], cells["cap4"]["fcfs"]["status"], cells["cap4"]["edf"]["status"]} == {"pending"}
    assert main(["sweep", "--loads", wl, "--cached-only", "--out", str(out)]) == 2
    assert "--cached-only needs --cache-dir" in capsys.readouterr().err


def test_engine_kinds_model_what_the_engine_can_do(wl, env):
    """Issue 25: the stock column is vLLM (no preserve): a policy that preserves every suspension
    is served "cache" there (counted), and honoured on the preserve-capable engine."""
    robots, catalog = env
    out = {}
    for kind in regime.ENGINE_KINDS:
        run = regime.run_cell_policy(regime.Cell(wl, "cap2", "rtx4090_llama3_8b", kind), "fcfs-preserve",
                                     robots=robots, catalog=catalog)
        assert run["status"] == "ok"
        out[kind] = run
    assert out["stock"]["kv_fallbacks"] > 0 and out["preserve"]["kv_fallbacks"] == 0
    with pytest.raises(regime.GridError, match="engine kind 'gpu'"):
        regime.check_engine_kinds(["stock", "gpu"])


def test_a_grid_run_in_parts_reads_as_the_grid_run_at_once(wl, tmp_path, capsys):
    """`--from-json A --from-json B`: parts of one grid (overlapping, in any order) give the same
    map, byte for byte, as one sweep of those cells; parts of different maps are refused."""
    common = ["--loads", wl, "--profiles", "rtx4090_llama3_8b", "--policies", "fcfs,edf", "--workers", "1",
              "--no-progress", "--seed", "5"]
    whole, a, b = tmp_path / "whole.json", tmp_path / "a.json", tmp_path / "b.json"
    assert main(["sweep", *common, "--capacities", "cap8,cap4", "--out", str(whole)]) == 0
    assert main(["sweep", *common, "--capacities", "cap4", "--out", str(a)]) == 0  # both columns
    assert main(["sweep", *common, "--capacities", "cap8,cap4", "--engine-kinds", "stock", "--out", str(b)]) == 0
    capsys.readouterr()
    merged = tmp_path / "merged.json"
    assert main(["sweep", "--from-json", str(a), "--from-json", str(b), "--out", str(merged)]) == 0
    cap = capsys.readouterr()
    assert "3 cells from 2 regime maps" in cap.err and "acceptance of `default`" not in cap.out  # not in the map
    w = json.loads(whole.read_text())  # 4 cells; cap8 / preserve is in neither part
    w["cells"] = [c for c in w["cells"] if (c["capacity"], c["engine"]) != ("cap8", "preserve")]
    assert merged.read_text() == to_json(w)
    # a part with another seed is another map
    other = tmp_path / "other.json"
    assert main(["sweep", *common[:-1], "6", "--capacities", "cap4", "--engine-kinds", "stock",
                 "--out", str(other)]) == 0
    capsys.readouterr()
    assert main(["sweep", "--from-json", str(a), "--from-json", str(other)]) == 2
    assert "seed 6 differs" in capsys.readouterr().err
    # the same cell with different figures (other code) is refused, naming the cell and both files
    bad = json.loads(a.read_text())
    bad["cells"][0]["policies"]["fcfs"]["total_pct"] = -1.0
    badf = tmp_path / "bad.json"
    badf.write_text(json.dumps(bad))
    assert main(["sweep", "--from-json", str(a), "--from-json", str(badf)]) == 2
    err = capsys.readouterr().err
    assert "cap4 | rtx4090_llama3_8b | stock" in err and "with different figures" in err and "bad.json" in err
