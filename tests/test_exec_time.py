import pytest

from timelyllm_ros.core.exec_time import ExecTimeEstimator
from timelyllm_ros.core.robots import load_robots
from timelyllm_ros.core.types import SkillCall


@pytest.fixture
def est():
    return ExecTimeEstimator(load_robots())


def test_profile_estimates(est):
    segment = [SkillCall("move_forward", "mf", (100,)), SkillCall("turn_cw", "tc", (90,))]
    assert est.estimate("tello", segment) == pytest.approx((1.2 + 2.0) + (2.6 + 0.99))
    assert est.estimate_call("tello", SkillCall("scan", "s", ("cat",))) == pytest.approx(2.8)
    assert est.estimate_call("chat", SkillCall("say", "say", ("one two three four five",))) == pytest.approx(1.0)


def test_online_learning_moves_towards_measurements(est):
    call = SkillCall("move_forward", "mf", (100,))
    before = est.estimate_call("tello", call)  # 3.2 s
    for _ in range(30):
        est.update("tello", call, 4.8)  # the real drone is 1.5x slower
    after = est.estimate_call("tello", call)
    assert after == pytest.approx(4.8, rel=0.02)
    # the learned factor generalises to other distances of the same skill
    assert est.estimate_call("tello", SkillCall("move_forward", "mf", (200,))) == pytest.approx(5.2 * 1.5, rel=0.02)
    assert before == pytest.approx(3.2)


def test_bounded_influence_of_outliers(est):
    call = SkillCall("move_forward", "mf", (100,))
    est.update("tello", call, 1e6)  # one absurd measurement
    assert est.estimate_call("tello", call) == pytest.approx(3.2 * 1.4)  # EWMA of a ratio clamped at 3
    est.update("tello", call, float("nan"))
    est.update("tello", call, -1.0)
    assert est.estimate_call("tello", call) == pytest.approx(3.2 * (0.8 + 0.2 * 3))


def test_variable_skill_learns_only_lower_minimum(est):
    scan = SkillCall("scan", "s", ("cat",))
    est.update("tello", scan, 15.0)
    assert est.estimate_call("tello", scan) == pytest.approx(2.8)
    est.update("tello", scan, 2.0)
    assert est.estimate_call("tello", scan) == pytest.approx(2.0)
    est.update("tello", scan, 0.1)
    assert est.estimate_call("tello", scan) == pytest.approx(1.4)  # floor: half the profiled minimum
