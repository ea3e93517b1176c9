import random

import pytest

from timelyllm_ros.core.robots import RobotSpecError, load_robots, parse_robot


def test_shipped_robots_load():
    robots = load_robots()
    assert {"tello", "arm", "chat"} <= set(robots)
    tello = robots["tello"]
    mf = tello.skill("mf")
    assert mf.name == "move_forward" and tello.skill("move_forward") is mf
    assert mf.args[0].check(50) is None
    assert "below minimum" in mf.args[0].check(10)
    assert "must be an int" in mf.args[0].check(50.0)
    assert tello.skill("s").blocking and tello.skill("s").exec_time.variable


def test_exec_time_model_nominal_and_sample():
    robots = load_robots()
    mf = robots["tello"].skill("mf")
    assert mf.exec_time.nominal({"distance": 100}) == pytest.approx(1.2 + 0.02 * 100)
    scan = robots["tello"].skill("s").exec_time
    assert scan.nominal() == scan.min_s  # the scheduler uses the minimum (paper §4.3)
    rng = random.Random(1)
    xs = [scan.sample(rng) for _ in range(200)]
    assert min(xs) >= scan.min_s and max(xs) <= scan.max_s
    say = robots["chat"].skill("say").exec_time
    assert say.nominal(words=10) == pytest.approx(2.0)  # 300 words/min


@pytest.mark.parametrize("data,msg", [
    ({"language": "minispec", "skills": {}}, "robot_type"),
    ({"robot_type": "x", "language": "klingon", "skills": {}}, "language"),
    ({"robot_type": "x", "language": "minispec", "skills": {"a": {"args": [{"name": "d", "type": "complex"}]}}}, "arg type"),
    ({"robot_type": "x", "language": "minispec", "skills": {"a": {"exec_time": {"base_s": -1}}}}, "base_s"),
    ({"robot_type": "x", "language": "minispec", "skills": {"a": {"exec_time": {"min_s": 3, "max_s": 1}}}}, "min_s"),
    ({"robot_type": "x", "language": "minispec", "skills": {"a": {"abbr": "q"}, "b": {"abbr": "q"}}}, "used twice"),
    ({"robot_type": "x", "language": "minispec", "skills": {"a": {"exec_time": {"unit_arg": "d"}}}}, "unit_arg"),
])
def test_malformed_robot_yaml_rejected(data, msg):
    with pytest.raises(RobotSpecError, match=msg):
        parse_robot(data, "test.yaml")
