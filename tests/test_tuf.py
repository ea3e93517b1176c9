import math

import pytest

from timelyllm_ros.core.tuf import NORMAL, TUF, TUFError, URGENT


def test_tuf0_hand_computed():
    t = TUF(ert=1.0, alpha=-2.0, beta=1.0)
    assert t(0.3) == 1.0  # before ERT: full utility
    assert t(1.0) == 1.0
    assert t(1.25) == pytest.approx(0.5)
    assert t(1.5) == pytest.approx(0.0)
    assert t(2.0) == pytest.approx(-1.0)  # utility may go negative (Eq. 1)
    assert t.zero_time() == pytest.approx(1.5)


def test_tuf1_ert_zero_and_negative_waiting():
    t = TUF(ert=0.2, alpha=-6.67, beta=2.0)
    assert t.suspended(-3.0) == 2.0  # next segment ready before the previous action ended
    assert t.suspended(0.0) == 2.0
    assert t.suspended(0.15) == pytest.approx(2.0 - 6.67 * 0.15)


def test_paper_categories():
    assert URGENT.zero_time() == pytest.approx(0.2 + 2 / 6.67)
    assert NORMAL(1.0) == 1.0


@pytest.mark.parametrize("kw,msg", [
    (dict(ert=1, alpha=-1, beta=0), "beta"),
    (dict(ert=1, alpha=-1, beta=-2), "beta"),
    (dict(ert=1, alpha=0.5, beta=1), "alpha"),
    (dict(ert=-0.1, alpha=-1, beta=1), "ert"),
    (dict(ert=math.nan, alpha=-1, beta=1), "ert"),
    (dict(ert=1, alpha=-math.inf, beta=1), "alpha"),
    (dict(ert="1", alpha=-1, beta=1), "ert"),
    (dict(ert=True, alpha=-1, beta=1), "ert"),
])
def test_invalid_parameters_rejected_with_reason(kw, msg):
    with pytest.raises(TUFError, match=msg):
        TUF(**kw)


def test_from_mapping_errors():
    with pytest.raises(TUFError, match="missing"):
        TUF.from_mapping({"ert": 1, "beta": 1})
    with pytest.raises(TUFError, match="unknown"):
        TUF.from_mapping({"ert": 1, "alpha": -1, "beta": 1, "gamma": 2})
    assert TUF.from_mapping({"ert": 1, "alpha": -1, "beta": 1}) == TUF(1, -1, 1)
