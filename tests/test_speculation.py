"""core/speculation.py: the online predictor of blocking results (the planner side is tested
with the default policy in tests/test_default_policy.py)."""

import pytest

from timelyllm_ros.core.speculation import ValuePredictor, same_value
from timelyllm_ros.core.types import Segment, SkillCall


def blocking(abbr="iv", name="is_visible"):
    return Segment(index=0, text=f"{abbr}('cat');", calls=(SkillCall(name, abbr, ("cat",)),), blocking=True,
                   token_count=5, gen_start=0.0, gen_end=0.1, est_exec_s=0.3)


def test_predicts_the_online_majority_once_seen_enough():
    p = ValuePredictor(min_seen=3, min_share=0.6)
    s = blocking()
    assert p.predict("tello", s) is None  # nothing seen: no guess
    p.observe("tello", s, True)
    p.observe("tello", s, True)
    assert p.predict("tello", s) is None  # 2 < min_seen
    p.observe("tello", s, False)
    assert p.predict("tello", s) is True  # 2 of 3 >= 0.6
    p.observe("tello", s, False)
    assert p.predict("tello", s) is None  # 2 of 4: no majority worth a guess
    assert p.predict("arm", s) is None  # per robot type
    assert p.predict("tello", blocking("ox", "object_x")) is None  # per skill


def test_numbers_and_none_are_not_guessed_and_true_is_not_one():
    p = ValuePredictor(min_seen=1)
    s = blocking("ox", "object_x")
    for v in (0.4, 0.4, 0.4, None):
        p.observe("tello", s, v)
    assert p.predict("tello", s) is None
    assert same_value(True, True) and not same_value(True, 1) and not same_value("1", 1)


@pytest.mark.parametrize("kw", [dict(min_seen=0), dict(min_seen=True), dict(min_share=0.4), dict(min_share=1.5)])
def test_bad_parameters_are_refused(kw):
    with pytest.raises(ValueError):
        ValuePredictor(**kw)
