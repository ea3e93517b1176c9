"""LRTrace workload files: validation with line numbers, deterministic expansion, agent choice."""

from __future__ import annotations

import dataclasses
import math
import textwrap
from collections import Counter

import pytest

from timelyllm_ros.core.robots import load_robots
from timelyllm_ros.core.tuf import NORMAL, URGENT
from timelyllm_ros.workloads.format import WorkloadError, expand, list_workloads, load_workload, plan_exec_estimate
from timelyllm_ros.workloads.catalog import load_tasks


@pytest.fixture(scope="module")
def robots():
    return load_robots()


@pytest.fixture(scope="module")
def catalog(robots):
    return load_tasks(robots=robots)


def _write(tmp_path, text: str, name="w.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text).lstrip("\n"))
    return p


GOOD = """
name: tiny
duration_s: 30
seed: 5
events: {rate_per_s: 0.5, max_tasks_per_event: 3}
agents: {tello: 4}
traces: [1, 6]
tuf:
  normal: {ert: 1.0, alpha: -2.0, beta: 1.0}
  urgent: {ert: 0.2, alpha: -6.67, beta: 2.0}
"""


@pytest.mark.parametrize("name,table", [
    ("WID1", (0.25, 8, [f"T{i}" for i in range(1, 9)], 25, 260)),
    ("WID2", (0.25, 16, [f"T{i}" for i in range(1, 9)], 42, 300)),
    ("WID3", (0.1, 8, ["T9", "T10", "T11"], 40, 900)),
])
def test_bundled_workloads_match_table3(name, table, catalog, robots):
    eps, tpe, traces, agents, dur = table
    w = load_workload(name)
    assert (w.rate_per_s, w.max_tasks_per_event, list(w.traces), len(w.agents), w.duration_s) == (eps, tpe, traces, agents, dur)
    assert w.tuf["normal"] == NORMAL and w.tuf["urgent"] == URGENT and w.tuf["chat"] == NORMAL
    assert w.network_latency_s == pytest.approx(0.008)
    arr = expand(w, catalog, robots)
    # events ~ Poisson(rate * duration), tasks per event uniform 1..max: mean (1 + max) / 2
    expected = eps * dur * (1 + tpe) / 2
    assert 0.6 * expected < len(arr) < 1.4 * expected
    assert all(0 <= a.time < dur for a in arr)
    assert {a.task_id for a in arr} == set(traces)


def test_bundled_list_excludes_catalog():
    names = list_workloads()
    assert {"WID1", "WID2", "WID3", "mixed_small"} <= set(names)
    assert "lrtrace_tasks" not in names


def test_mixed_small_has_all_robot_kinds_and_explicit_requests(catalog, robots):
    arr = expand(load_workload("mixed_small"), catalog, robots)
    assert {a.robot_type for a in arr} == {"tello", "arm", "chat"}
    byid = {a.request_id: a for a in arr}
    assert byid["demo-arm"].robot_type == "arm" and byid["demo-arm"].task_id == "T10"
    assert byid["demo-arm"].reference_plan == catalog["T10"].scenes[2].plan
    assert byid["demo-urgent"].category == "urgent" and byid["demo-urgent"].tuf == URGENT
    assert len(byid) == len(arr)  # generated ids never collide with explicit ones


def test_expansion_is_deterministic_and_seeded(tmp_path, catalog, robots):
    w = load_workload(_write(tmp_path, GOOD))
    a, b = expand(w, catalog, robots), expand(w, catalog, robots)
    assert a == b and len(a) > 0
    c = expand(w, catalog, robots, seed=6)
    assert c != a
    times = [x.time for x in a]
    assert times == sorted(times)
    assert len({x.request_id for x in a}) == len(a)
    req = a[0].to_request()
    assert req.task_type == a[0].task_id and req.arrival == a[0].time and req.reference_plan
    assert req.tuf == (URGENT if a[0].task_id == "T6" else NORMAL)


def test_events_trigger_batches_at_the_same_time(tmp_path, catalog, robots):
    w = load_workload(_write(tmp_path, GOOD.replace("duration_s: 30", "duration_s: 400")))
    arr = expand(w, catalog, robots)
    per_event = Counter(a.time for a in arr)
    assert set(per_event.values()) <= {1, 2, 3}
    assert set(per_event.values()) == {1, 2, 3}  # uniform over 1..max
    # Poisson process: mean inter-event gap ~ 1/rate
    ts = sorted(per_event)
    gaps = [b - a for a, b in zip(ts, ts[1:])]
    assert 1.5 < sum(gaps) / len(gaps) < 2.5


def test_min_tasks_per_event_makes_bursts_and_is_checked(tmp_path, catalog, robots):
    w = load_workload(_write(tmp_path, GOOD.replace("max_tasks_per_event: 3",
                                                    "min_tasks_per_event: 2, max_tasks_per_event: 3")))
    assert set(Counter(a.time for a in expand(w, catalog, robots)).values()) == {2, 3}
    bad = _write(tmp_path, GOOD.replace("max_tasks_per_event: 3", "min_tasks_per_event: 4, max_tasks_per_event: 3"))
    with pytest.raises(WorkloadError, match=r"w.yaml:4: events.min_tasks_per_event: must be <= max_tasks_per_event"):
        load_workload(bad)


def test_issue25_workloads(catalog, robots):
    """The acceptance workloads of issue 25: arm-heavy long plans plus a few urgent drones, a chat
    flood (100+ chat users) plus urgent drones, a very bursty fleet (>= 32 tasks per event)."""
    from timelyllm_ros.workloads.format import default_catalog

    full = default_catalog(robots)
    arm = expand(load_workload("arm_heavy"), full, robots)
    cats = Counter(a.category for a in arm)
    assert Counter(a.robot_type for a in arm)["arm"] > 10 * cats["urgent"] > 0
    assert min(a.reference_plan.count(";") for a in arm if a.robot_type == "arm") >= 6  # long plans
    chat_wl = load_workload("chat_flood")
    assert sum(1 for ag in chat_wl.agents if ag.robot_type == "chat") >= 100
    chat = expand(chat_wl, full, robots)
    assert Counter(a.category for a in chat)["urgent"] >= 5 and Counter(a.category for a in chat)["chat"] > 100
    burst = expand(load_workload("burst_fleet"), full, robots)
    assert min(Counter(a.time for a in burst).values()) >= 32
    assert {"arm_heavy", "chat_flood", "burst_fleet"} <= set(list_workloads())


def test_agent_choice_prefers_idle_least_recently_used(tmp_path, catalog, robots):
    p = _write(tmp_path, """
        name: agents
        agents: {tello: 2}
        tuf: {normal: {ert: 1, alpha: -2, beta: 1}}
        requests:
          - {time: 0, task: T1}
          - {time: 1, task: T1}
          - {time: 2, task: T1}
          - {time: 500, task: T1}
          - {time: 501, task: T1}
    """)
    arr = expand(load_workload(p), catalog, robots)
    # 0 -> tello0; 1 -> tello1 (idle, tello0 busy); 2 -> both busy -> least recently used tello0;
    # 500 -> both idle -> least recently used tello1; 501 -> tello0 idle and LRU.
    assert [a.robot_id for a in arr] == ["tello0", "tello1", "tello0", "tello1", "tello0"]


def test_plan_exec_estimate(robots):
    tello = robots["tello"]
    # mf(100): 1.2 + 0.02*100; tp: 0.5; scan: uniform 2.8-24 -> mean 13.4; 'mf' inside a string is no call
    assert plan_exec_estimate("mf(100);tp;s('mf');", tello) == pytest.approx(3.2 + 0.5 + 13.4)
    words = "It is windy today. Hold on."
    assert plan_exec_estimate(words, robots["chat"]) == pytest.approx(6 * 0.2)


@pytest.mark.parametrize("text,line,fragment", [
    ("name: x\nduration_s: -3\nevents: {rate_per_s: 1}\nagents: {tello: 1}\ntraces: [1]\n", 2, "duration_s: must be > 0"),
    ("name: x\nduration_s: 3\nevents: {rate_per_s: 1, max_tasks: 2}\nagents: {tello: 1}\ntraces: [1]\n", 3, "events.max_tasks: unknown key"),
    ("name: x\nduration_s: 3\nevents: {rate_per_s: 1}\nagents: {tello: 0}\ntraces: [1]\n", 4, "agents.tello: must be >= 1"),
    ("name: x\nduration_s: 3\nevents: {rate_per_s: 1}\nagents: {tello: 1}\ntraces:\n  - 1\n  - [2]\n", 7, "traces[1]"),
    ("name: x\nduration_s: 3\nduration_s: 4\n", 3, "duplicate key"),
    ("name: x\nrequests:\n  - {time: 1, task: T1, robot_id: a}\n  - {time: oops, task: T1, robot_id: a}\n", 4, "requests[1].time: must be a finite number"),
    ("name: x\nrequests:\n  - {time: 1, task: T1, robot_id: a}\ntuf:\n  normal: {ert: 1, alpha: 2, beta: 1}\n", 5, "alpha (decay rate) must be <= 0"),
    ("name: x\nduration_s: 3\nagents: {tello: 1}\ntraces: [1]\n", 1, "'events' and 'traces' go together"),
    ("name: x\nrequests:\n  - {time: 1, task: T1}\n", 3, "robot_id is required"),
    ("name: x\nbogus: 1\n", 2, "bogus: unknown key"),
    ("name: [unclosed\n", 2, "not valid YAML"),
    ("name: bad name\n", 1, "name: must be an id"),
    # events as phases (a list, each from its from_s)
    *[(f"name: x\nduration_s: 30\n{events}agents: {{tello: 1}}\ntraces: [1]\n", line, fragment) for events, line, fragment in [
        ("events:\n  - {from_s: 5, rate_per_s: 1}\n", 4, "events[0].from_s: the first phase starts at 0, got 5"),
        ("events:\n  - {rate_per_s: 1}\n  - {from_s: 8, rate_per_s: 2}\n  - {from_s: 8, rate_per_s: 3}\n", 6,
         "events[2].from_s: must be after the previous phase's (8), got 8"),
        ("events:\n  - {rate_per_s: 1}\n  - {rate_per_s: 2}\n", 5, "events[1]: missing required key 'from_s'"),
        ("events:\n  - {rate_per_s: 1}\n  - {from_s: 30, rate_per_s: 2}\n", 5,
         "events[1].from_s: must be before duration_s (30), got 30"),
        ("events:\n  - {rate_per_s: 1}\n  - {from_s: 3, rate_per_s: 0}\n", 5, "events[1].rate_per_s: must be > 0"),
        ("events: []\n", 3, "events: must be a mapping or a non-empty list of phases"),
        ("events: {from_s: 0, rate_per_s: 1}\n", 3, "events.from_s: unknown key"),
    ]],
])
def test_malformed_files_name_line_and_reason(tmp_path, text, line, fragment):
    p = _write(tmp_path, text)
    with pytest.raises(WorkloadError) as e:
        load_workload(p)
    msg = str(e.value)
    assert msg.startswith(f"{p}:{line}:"), msg
    assert fragment in msg, msg


@pytest.mark.parametrize("body,line,fragment", [
    ("traces: [1, 99]\n", 6, "unknown task 'T99'"),
    ("traces: [1, 9]\n", 6, "needs a 'arm' agent"),
    ("traces: [1]\nrequests:\n  - {time: 1, task: T1, scene: 40}\n", 8, "index 40 is out of range"),
    ("traces: [1]\nrequests:\n  - {time: 1, task: T6, robot_id: tello0}\n", 8, "no TUF for category 'urgent'"),
])
def test_catalog_errors_name_line(tmp_path, catalog, robots, body, line, fragment):
    head = ("name: x\nduration_s: 10\nevents: {rate_per_s: 1}\nagents: {tello: 2}\n"
            "tuf: {normal: {ert: 1, alpha: -2, beta: 1}}\n")
    p = _write(tmp_path, head + body)
    w = load_workload(p)
    with pytest.raises(WorkloadError) as e:
        expand(w, catalog, robots)
    msg = str(e.value)
    assert fragment in msg, msg
    assert msg.startswith(f"{p}:{line}:" if "TUF" not in fragment else f"{p}:5:"), msg


def test_explicit_agent_must_match_task_robot(tmp_path, catalog, robots):
    p = _write(tmp_path, """
        name: x
        agents: [{robot_id: a1, robot_type: arm}, {robot_id: d1, robot_type: tello}]
        tuf: {normal: {ert: 1, alpha: -2, beta: 1}}
        requests:
          - {time: 1, task: T1, robot_id: a1}
    """)
    with pytest.raises(WorkloadError, match=r":5: requests\[0\]\.robot_id: agent 'a1' is a 'arm'"):
        expand(load_workload(p), catalog, robots)


def test_unknown_workload_name_lists_bundled():
    with pytest.raises(WorkloadError, match="bundled workloads: .*WID1"):
        load_workload("NOPE")


def test_poisson_rate_is_respected_statistically(tmp_path, catalog, robots):
    p = _write(tmp_path, GOOD.replace("duration_s: 30", "duration_s: 2000").replace("max_tasks_per_event: 3", "max_tasks_per_event: 1"))
    n = len(expand(load_workload(p), catalog, robots))
    mean = 0.5 * 2000
    assert abs(n - mean) < 4 * math.sqrt(mean)


PHASED = GOOD.replace("duration_s: 30", "duration_s: 2000").replace(
    "events: {rate_per_s: 0.5, max_tasks_per_event: 3}",
    "events:\n  - {rate_per_s: 0.5}\n  - {from_s: 1000, rate_per_s: 2.0, min_tasks_per_event: 2, max_tasks_per_event: 2}")


def test_phases_change_the_rate_and_tasks_per_event_from_their_start(tmp_path, catalog, robots):
    """`events` as a list of phases (a light start, then a surge): each phase is a Poisson process
    of its own rate and tasks per event, from its `from_s` to the next phase's."""
    arr = expand(load_workload(_write(tmp_path, PHASED)), catalog, robots)
    light = Counter(a.time for a in arr if a.time < 1000)
    surge = Counter(a.time for a in arr if a.time >= 1000)
    assert set(light.values()) == {1} and set(surge.values()) == {2}
    for events, mean in ((len(light), 0.5 * 1000), (len(surge), 2.0 * 1000)):
        assert abs(events - mean) < 4 * math.sqrt(mean), (events, mean)
    assert max(a.time for a in arr) < 2000
    short = dataclasses.replace(load_workload(_write(tmp_path, PHASED)), duration_s=500)  # as benchmarks shorten one
    assert expand(short, catalog, robots) == [a for a in arr if a.time < 500]
    surge = load_workload("surge")  # the bundled one: a light start, then drones:2000's rate
    assert [(p.from_s, p.rate_per_s, p.max_tasks_per_event) for p in surge.phases] == [(0.0, 1.0, 8), (20.0, 20.0, 8)]
    # one phase as a list is the mapping form: the same arrivals
    one = GOOD.replace("events: {rate_per_s: 0.5, max_tasks_per_event: 3}",
                       "events:\n  - {rate_per_s: 0.5, max_tasks_per_event: 3}")
    assert (expand(load_workload(_write(tmp_path, one, "one.yaml")), catalog, robots)
            == expand(load_workload(_write(tmp_path, GOOD, "map.yaml")), catalog, robots))


def test_default_catalog_merges_bundled_catalogs_and_rejects_duplicates(tmp_path, robots):
    from timelyllm_ros.workloads.format import default_catalog
    from timelyllm_ros.workloads.catalog import TASKS_FILE

    cat = default_catalog(robots)
    assert {f"T{i}" for i in range(1, 12)} | {"C1", "C2", "C3"} <= set(cat)
    only = default_catalog(robots, [TASKS_FILE])
    assert set(only) == set(load_tasks(robots=robots))
    copy = tmp_path / "copy_tasks.yaml"
    copy.write_text(TASKS_FILE.read_text())
    with pytest.raises(WorkloadError, match="task 'T1' is defined in both"):
        default_catalog(robots, [TASKS_FILE, copy])


def test_agent_robot_type_must_exist(tmp_path, catalog, robots):
    p = _write(tmp_path, """
        name: x
        duration_s: 10
        events: {rate_per_s: 1}
        traces: [1]
        tuf: {normal: {ert: 1, alpha: -2, beta: 1}}
        agents: {tello: 1, submarine: 2}
    """)
    with pytest.raises(WorkloadError, match=r":6: agents: agent 'submarine0' has robot type 'submarine'"):
        expand(load_workload(p), catalog, robots)


def test_scaled_drone_load_matches_wid1_shape():
    from timelyllm_ros.workloads.format import load_workload, scaled_drones

    base = load_workload("WID1")
    w = load_workload("drones:400")
    assert w == scaled_drones(400)
    assert (w.duration_s, w.seed, len(w.agents)) == (60.0, 11, 400)
    assert w.rate_per_s == pytest.approx(0.25 * 400 / 25)
    assert (w.traces, w.max_tasks_per_event, dict(w.tuf)) == (base.traces, base.max_tasks_per_event, dict(base.tuf))
    for bad in ("drones:0", "drones:x", "drones:-3"):
        with pytest.raises(WorkloadError, match="drones:N|>= 1"):
            load_workload(bad)
