"""LRTrace task file (Table 2), its validation, and the synthetic example generator."""

from __future__ import annotations

import copy
import random

import pytest
import yaml

from timelyllm_ros.core.robots import load_robots
from timelyllm_ros.workloads.catalog import (TASKS_FILE, PlanError, TaskFileError, check_plan, count_sentences, load_tasks,
                                             parse_tasks, split_statements)
from timelyllm_ros.workloads.examples import RULES, false_path, generate, generate_many, held_out, outcome_paths

ROBOTS = load_robots()
RAW = yaml.safe_load(TASKS_FILE.read_text())


@pytest.fixture(scope="module")
def tasks():
    return load_tasks(robots=ROBOTS)


def test_table2_tasks_present_with_types(tasks):
    expected = {
        "T1": ("tello", "normal"), "T2": ("tello", "normal"), "T3": ("tello", "normal"),
        "T4": ("tello", "normal"), "T5": ("tello", "normal"),
        "T6": ("tello", "urgent"), "T7": ("tello", "urgent"), "T8": ("tello", "urgent"),
        "T9": ("arm", "normal"), "T10": ("arm", "normal"), "T11": ("arm", "normal"),
        "C1": ("chat", "chat"), "C2": ("chat", "chat"), "C3": ("chat", "chat"),
    }
    assert {k: (t.robot_type, t.category) for k, t in tasks.items()} == expected
    assert tasks["T1"].name == "look for the cat"
    assert tasks["T10"].name == "desk cleaning"
    assert all(len(t.scenes) >= 5 for t in tasks.values())


def test_plans_have_the_paper_shapes(tasks):
    for tid, t in tasks.items():
        for s in t.scenes:
            if t.robot_type == "chat":
                assert 2 <= count_sentences(s.plan) <= 5, (tid, s.plan)
                continue
            n = len(split_statements(s.plan))
            if t.category == "urgent":
                assert n <= 2, (tid, s.plan)  # short, immediate reactions
            elif t.robot_type == "tello":
                assert 2 <= n <= 6, (tid, s.plan)  # ~20-token drone plans
            else:
                assert 6 <= n <= 14, (tid, s.plan)  # ~100-token arm plans
    # plans depend on the scene: every task has at least two different plans
    assert all(len({s.plan for s in t.scenes}) >= 2 for t in tasks.values())


def _with(tid, **changes):
    data = copy.deepcopy(RAW)
    data["tasks"][tid].update(changes)
    return data


@pytest.mark.parametrize("tid, changes, msg", [
    ("T1", {"robot_type": "submarine"}, "unknown robot_type 'submarine'"),
    ("T6", {"category": "panic"}, "category must be one of"),
    ("T9", {"scenes": RAW["tasks"]["T9"]["scenes"][:2]}, "at least 5 scenes"),
    ("T2", {"task": ""}, "task must be a non-empty string"),
    ("T3", {"colour": "red"}, "unknown keys ['colour']"),
])
def test_task_field_errors_name_the_task(tid, changes, msg):
    with pytest.raises(TaskFileError) as e:
        parse_tasks(_with(tid, **changes), ROBOTS, "f.yaml")
    assert f"task {tid!r}" in str(e.value) and msg in str(e.value)


@pytest.mark.parametrize("plan, reason", [
    ("mf(600);", "above maximum 500"),
    ("tc(0);", "below minimum 1"),
    ("fly(20);", "unknown skill 'fly'"),
    ("mf('cat');", "must be an int"),
    ("mf(50,20);", "takes 1 argument"),
    ("s('cat'", ""),
])
def test_invalid_plan_in_file_is_rejected(plan, reason):
    data = copy.deepcopy(RAW)
    data["tasks"]["T1"]["scenes"][3]["plan"] = plan
    with pytest.raises(TaskFileError) as e:
        parse_tasks(data, ROBOTS, "f.yaml")
    assert "task 'T1': scene 3: invalid plan" in str(e.value) and reason in str(e.value)


def test_missing_file_and_bad_top_level(tmp_path):
    with pytest.raises(TaskFileError, match="cannot read task file"):
        load_tasks(tmp_path / "nope.yaml", ROBOTS)
    (tmp_path / "bad.yaml").write_text("tasks: [1, 2]\n")
    with pytest.raises(TaskFileError, match="'tasks' mapping"):
        load_tasks(tmp_path / "bad.yaml", ROBOTS)


def test_chat_plan_checks():
    chat = ROBOTS["chat"]
    check_plan("It is sunny. Enjoy the day!", chat)
    with pytest.raises(PlanError, match="text after the last sentence"):
        check_plan("It is sunny. and then", chat)
    with pytest.raises(PlanError, match="empty"):
        check_plan("  ", chat)


def test_generator_is_seeded_valid_and_scene_dependent():
    a = generate_many(list(RULES), 30, seed=5)
    b = generate_many(list(RULES), 30, seed=5)
    assert [(e.scene, e.plan) for e in a] == [(e.scene, e.plan) for e in b]
    assert [(e.scene, e.plan) for e in a] != [(e.scene, e.plan) for e in generate_many(list(RULES), 30, seed=6)]
    for ex in a:
        check_plan(ex.plan, ROBOTS[ex.robot_type])
        fp = false_path(ex.steps)
        if fp:
            check_plan(fp, ROBOTS[ex.robot_type])
    for tid in RULES:
        mine = [e for e in a if e.task_id == tid]
        assert len({e.scene for e in mine}) == 30  # distinct scenes
        assert len({e.plan for e in mine}) >= 2


def test_generator_rules_reproduce_the_file(tasks):
    """The committed scenes were drawn from the rules: regenerating gives the same plans."""
    seen = {}
    for tid in RULES:
        for ex in generate_many([tid], 6, 20240601 + sum(map(ord, tid))):
            seen[(tid, ex.scene)] = ex.plan
    for tid, t in tasks.items():
        for s in t.scenes:
            assert seen[(tid, s.scene)] == s.plan


def test_outcome_paths_follow_false_branch():
    rng = random.Random(0)
    ex = generate("T11", rng)
    paths = [outcome_paths(ex.steps, rng, p_annotate=1.0, p_false=1.0) for _ in range(3)]
    for p in paths:
        # first blocking call returns False -> log + home, nothing else
        assert [r for _, r in p] == [None, False, None, None]
        assert p[2][0].startswith("l('no ")


def test_held_out_covers_every_task_and_excludes_nothing_twice(tasks):
    items = held_out(tasks, n_generated=4)
    keys = [(i.task_id, i.scene) for i in items]
    assert len(keys) == len(set(keys))
    assert {i.task_id for i in items} == set(tasks)
    with pytest.raises(KeyError, match="unknown LRTrace task"):
        generate("T99", random.Random(0))
