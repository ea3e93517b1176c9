"""The MiniSpec corpus (tests/data/minispec_corpus.txt): streaming == whole text, dispatchability."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from minispec_corpus import check, load_corpus  # noqa: E402
from timelyllm_ros.core.robots import load_robots  # noqa: E402

TELLO = load_robots()["tello"]
ENTRIES = load_corpus()


def test_corpus_is_large_and_covers_the_grammar():
    assert len(ENTRIES) >= 50 and sum(not e.refusal for e in ENTRIES) >= 50
    text = "\n".join(e.plan for e in ENTRIES)
    for construct in ("_1=", "(_1", "*", "/", "+", "-(", "==", "!=", "<=", ">=", "&", "|", "}:{", "}:?", "->",
                      '"', "\\'", "12{", "{2{", "->True", "tp;"):
        assert construct in text, construct


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: f"line{e.line}")
def test_corpus_plan(entry):
    out = check(entry, TELLO)
    assert out.stream_equal  # one character at a time gives the whole-text segments
    if entry.refusal:
        assert not out.dispatchable and entry.refusal in out.reason, out.reason
    else:
        assert out.dispatchable, out.reason
        assert out.run_codes and all(c == "OK" for c in out.run_codes), out.run_codes


# ---------------------------------------------------------------- TypeFly's current syntax (issue 27)

from minispec_corpus import TYPEFLY_CORPUS  # noqa: E402

TYPEFLY = load_robots()["tello_typefly"]
TYPEFLY_ENTRIES = load_corpus(TYPEFLY_CORPUS)


def test_typefly_corpus_covers_its_current_syntax():
    assert len(TYPEFLY_ENTRIES) >= 40 and sum(not e.refusal for e in TYPEFLY_ENTRIES) >= 40
    text = "\n".join(e.plan for e in TYPEFLY_ENTRIES if not e.refusal)
    for construct in ("?_1=sd(", "?_1=ox(", "?_1=p(", "?s(", "?iv(", "&&", "||", "m(80,0)", "m(0,-50)", "r(-30)",
                      "r(180)", "li(-", "d(1.5)", "tp()", "rp()", "}:?", "->False"):
        assert construct in text, construct


@pytest.mark.parametrize("entry", TYPEFLY_ENTRIES, ids=lambda e: f"line{e.line}")
def test_typefly_corpus_plan(entry):
    """100 % of the TypeFly-syntax plans the robot can do are dispatchable and run OK on the
    simulated executor; the rest are refused with the reason."""
    out = check(entry, TYPEFLY)
    assert out.stream_equal
    if entry.refusal:
        assert not out.dispatchable and entry.refusal in out.reason, out.reason
    else:
        assert out.dispatchable, out.reason
        assert out.run_codes and all(c == "OK" for c in out.run_codes), out.run_codes
