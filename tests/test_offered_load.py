"""Rule 12's load factor online (core/policies/offered_load.py): offered tokens per second over the
engine's full-batch tokens per second."""

import math

import pytest

from timelyllm_ros.core.policies.offered_load import OfferedLoad


def _rho_by_hand(arrivals, lens, full_tps, now, tau, engines=1):
    """The definition, written out: Σ exp(-(now - t)/tau) × reply tokens, over the window's
    effective length tau × (1 - exp(-span/tau)) (span: since the first arrival; a steady rate r
    from then on reads r), over the full batch's tokens/s."""
    first = min(t for t, _ in arrivals)
    span = max(1e-3, now - first)
    offered = sum(math.exp(-(now - t) / tau) * lens[rt] for t, rt in arrivals)
    return offered / (tau * (1 - math.exp(-span / tau))) / (full_tps * engines)


def test_rho_is_offered_tokens_over_full_batch_tokens():
    load = OfferedLoad(tau_s=60.0)
    assert load.rho(5.0) == 0.0  # nothing seen
    arrivals = [(0.0, "tello"), (1.0, "tello"), (1.5, "chat"), (4.0, "tello")]
    for t, rt in arrivals:
        load.arrive(rt, t, first_guess={"tello": 20.0, "chat": 90.0}[rt])
    load.step(0.1, 2, True)  # 20 tok/s at 2 wide
    load.saturate()
    assert load.rho(5.0) == pytest.approx(_rho_by_hand(arrivals, {"tello": 20.0, "chat": 90.0}, 20.0, 5.0, 60.0))
    load.step(3.0, 8, False)  # a prefill step: the largest batch, not a measure of its speed
    load.step(0.1, 8, True)  # 80 tok/s: restarts the mean (the 2-wide steps were not full ones)
    load.step(0.125, 8, True)  # 64 tok/s: 0.9 x 80 + 0.1 x 64
    load.step(0.1, 7, True)  # not a full batch (under 90 % of 8)
    assert load.max_outputs == 8 and load.full_tps == pytest.approx(78.4)
    want = _rho_by_hand(arrivals, {"tello": 20.0, "chat": 90.0}, 78.4, 5.0, 60.0)
    assert load.rho(5.0) == pytest.approx(want)
    assert load.rho(5.0, engines=2) == pytest.approx(want / 2)  # a pool of two serves twice the tokens
    # the effective capacity (rule 14): every full step, the prefill one too — a ratio of running
    # means of outputs and seconds (weight 0.01), restarted where the largest batch grew
    eff = 8 / (0.99 * (0.99 * 3.0 + 0.01 * 0.1) + 0.01 * 0.125)
    assert load.eff_tps == pytest.approx(eff) and load.eff_width == 8
    assert load.rho(5.0, effective=True) == pytest.approx(
        _rho_by_hand(arrivals, {"tello": 20.0, "chat": 90.0}, eff, 5.0, 60.0))
    unsaturated = OfferedLoad(tau_s=60.0)
    unsaturated.arrive("tello", 0.0, 20.0)
    unsaturated.step(0.1, 2, True)
    assert unsaturated.rho(5.0) == 0.0  # the batch never reached its limit: no load is heavy yet
    # a reply that ended replaces the guess; later guesses for a known type are ignored
    load.reply_ended("tello", 40)
    load.arrive("tello", 6.0, first_guess=1.0)
    arrivals.append((6.0, "tello"))
    assert load.guess["tello"] == 20.0 and load.knows("tello")
    assert load.rho(7.0) == pytest.approx(_rho_by_hand(arrivals, {"tello": 40.0, "chat": 90.0}, 78.4, 7.0, 60.0))
    load.reply_ended("tello", 60)  # a running mean of whole replies (weight 0.1)
    assert load.reply_len["tello"] == pytest.approx(42.0)
    # arrivals fade with their age (a minute of silence: by e) over a window that grew by a minute
    quiet = load.rho(67.0) / load.rho(7.0)
    window = (1 - math.exp(-7.0 / 60.0)) / (1 - math.exp(-67.0 / 60.0))
    assert quiet == pytest.approx(math.exp(-1.0) * window, rel=1e-9)
    # an unknown type without a guess counts as the fallback length
    fresh = OfferedLoad(tau_s=10.0)
    fresh.arrive("arm", 0.0)
    fresh.step(1.0, 4, True)
    fresh.saturate()
    assert not fresh.knows("arm")
    assert fresh.rho(10.0, fallback_len=256.0) == pytest.approx(
        256.0 * math.exp(-1.0) / (10.0 * (1 - math.exp(-1.0))) / 4.0)


def test_a_steady_rate_reads_as_itself():
    """One arrival per second of 10-token replies against 20 tokens/s: ρ 0.5 after ten minutes
    of it; after 5 s, the 6 arrivals seen over 5 s (the first one counts from the start)."""
    for seconds, want in ((5, 6 / 5 * 10 / 20), (600, 0.5)):
        load = OfferedLoad(tau_s=60.0)
        load.step(1.0, 20, True)
        load.saturate()
        for t in range(seconds + 1):
            load.arrive("tello", float(t), 10.0)
        assert load.rho(float(seconds)) == pytest.approx(want, rel=0.02)


def test_a_bad_time_constant_is_a_clear_error():
    for bad in (0, -1.0, math.inf, math.nan, "60", True, None):
        with pytest.raises(ValueError, match="rho_tau_s"):
            OfferedLoad(tau_s=bad)
