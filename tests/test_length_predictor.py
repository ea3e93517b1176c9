"""Remaining-length predictors: bins, the Bayesian bin update (hand-computed), the bundled model."""

import numpy as np
import pytest

from timelyllm_ros.core.length_predictor import (DEFAULT_MODEL_DIR, MLP, Bins, FeatureSpec, LearnedPredictor,
                                                 OraclePredictor, PredictorError, bayes_update, make_predictor)
from timelyllm_ros.core.tuf import NORMAL
from timelyllm_ros.core.types import Generation, PlanRequest
from timelyllm_ros.core.tokenizer import SimTokenizer


def test_bins_and_transition_matrix():
    b = Bins.equal(4, 16)  # width 4
    assert b.edges == (0, 4, 8, 12, 16) and list(b.mids) == [2, 6, 10, 14]
    assert [b.index(x) for x in (0, 3.9, 4, 15, 16, 99)] == [0, 0, 1, 3, 3, 3]
    T = b.transition()
    assert np.allclose(T.sum(axis=1), 1)
    assert T[0, 0] == 1 and T[2, 2] == 0.75 and T[2, 1] == 0.25 and T[2, 3] == 0 and T[1, 2] == 0
    with pytest.raises(PredictorError):
        Bins((1, 2))
    with pytest.raises(PredictorError):
        Bins((0, 5, 5))


def test_bayes_update_hand_computed():
    T = Bins.equal(2, 8).transition()  # widths 4: bin 1 -> bin 0 with 1/4
    q = np.array([0.0, 1.0])
    prior = bayes_update(q, None, T, floor=0)
    assert np.allclose(prior, [0.25, 0.75])
    # observation [0.9, 0.1]: (0.25*0.9, 0.75*0.1) = (0.225, 0.075) -> (0.75, 0.25)
    assert np.allclose(bayes_update(q, np.array([0.9, 0.1]), T, floor=0), [0.75, 0.25])
    # a uniform observation changes nothing
    assert np.allclose(bayes_update(q, np.array([0.5, 0.5]), T, floor=0), prior)
    # the floor keeps a bin the observation rules out alive
    assert bayes_update(q, np.array([1.0, 0.0]), T, floor=1e-3)[1] > 0


def test_transition_alone_moves_expected_remaining_down_about_one_per_token():
    b = Bins.equal(8, 256)
    T = b.transition()
    q = np.zeros(8)
    q[5] = 1.0  # 160-192, mid 176
    for _ in range(32):
        q = bayes_update(q, None, T, floor=0)
    assert float(q @ b.mids) == pytest.approx(176 - 32, abs=0.5)


def _req(task, scene, robot="chat", plan=None):
    return PlanRequest("r", "u", robot, task, scene, NORMAL, 0.0, category="chat", reference_plan=plan)


def test_oracle_counts_reference_tokens_plus_eos():
    tok = SimTokenizer()
    plan = "It is sunny today. Enjoy it."
    g = Generation(request=_req("t", "s", plan=plan))
    p = OraclePredictor(tok.count)
    assert p.initial(g) == tok.count(plan) + 1
    g.output_ids = [1] * 3
    assert p.remaining(g) == tok.count(plan) + 1 - 3


@pytest.fixture(scope="module")
def learned():
    if not (DEFAULT_MODEL_DIR / "weights.npz").exists():
        pytest.fail(f"bundled model missing: run scripts/train_length_predictor.py (expected {DEFAULT_MODEL_DIR})")
    return make_predictor("learned")


def test_bundled_model_learned_the_length_signal_of_the_prompt(learned):
    """Same question, different requested detail: the prediction follows the detail, averaged over
    the length-neutral context (who asks, where)."""
    names, places = ["Ana", "Ben", "Chen", "Dara", "Eli", "Gus"], ["kitchen", "lab", "garden", "library"]

    def mean_pred(task, tail):
        reqs = [_req(task, f"user: {n}; location: {p}; {tail}") for n in names for p in places]
        return float(np.mean([learned.observe_proba(r, "", 0) @ learned.bins.mids for r in reqs]))

    vac = "Explain how the robot vacuum works."
    brief = mean_pred(vac, "topic: robot vacuum; detail: brief")
    detailed = mean_pred(vac, "topic: robot vacuum; detail: detailed")
    hello = mean_pred("Say hello to me.", "user: Ben; mood: happy")
    assert hello < brief < detailed and detailed - brief > 50


def test_learned_refinement_tracks_a_reply_as_it_is_generated(learned):
    tok = SimTokenizer()
    req = _req("Tell me a story.", "user: Eli; location: garden; hero: Eli; place: the garden; length: long")
    reply = ("Once upon a time Eli lived near the garden. Every morning Eli walked to the garden to look for "
             "adventure. One day a small robot rolled out of the shadows and asked for help. Eli and the robot "
             "searched the garden for the lost battery together. They followed a trail of tiny footprints past "
             "the old shelves. From then on Eli and the robot met every day in the garden.")
    pieces = tok.pieces(reply)
    g = Generation(request=req)
    true_total = len(pieces) + 1
    first = learned.remaining(g)
    errs = []
    for a, piece in enumerate(pieces, start=1):
        g.output_ids.append(1)
        g.text += piece
        learned.observe(g, 1)
        errs.append(abs(learned.remaining(g) - (true_total - a)))
    assert learned.initial(g) in set(learned.bins.mids)  # r0 = midpoint of the argmax bin
    assert abs(first - true_total) < 64
    # near the end it knows the reply is nearly done
    assert np.mean(errs[-10:]) < 32
    assert g.policy.length.seen == len(pieces)


def test_save_load_roundtrip_and_errors(tmp_path):
    rng = np.random.default_rng(0)
    f = FeatureSpec(prompt_dim=16, output_dim=8)
    X = rng.random((50, f.dim))
    y = rng.integers(0, 4, 50)
    m = MLP.train(X, y, 4, hidden=8, epochs=2)
    p = LearnedPredictor(m, Bins.equal(4, 64), f)
    p.save(tmp_path)
    q = LearnedPredictor.load(tmp_path)
    r = _req("a", "b")
    assert np.allclose(p.observe_proba(r, "x", 3), q.observe_proba(r, "x", 3), atol=1e-6)
    with pytest.raises(PredictorError):
        LearnedPredictor.load(tmp_path / "nowhere")
    with pytest.raises(PredictorError):
        LearnedPredictor(m, Bins.equal(5, 64), f)  # shape mismatch
    with pytest.raises(PredictorError):
        make_predictor("psychic")


def test_mlp_learns_a_separable_problem():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(400, 6))
    y = (X[:, 0] > 0).astype(int) + 2 * (X[:, 1] > 0).astype(int)
    m = MLP.train(X, y, 4, hidden=16, epochs=40, lr=0.01)
    acc = float((m.proba(X).argmax(1) == y).mean())
    assert acc > 0.9
