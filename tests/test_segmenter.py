"""Incremental segmenter: exact cut positions whatever the token boundaries."""

from __future__ import annotations

import random
import re

import pytest

from timelyllm_ros.core.robots import load_robots
from timelyllm_ros.core.segmenter import Cut, Segmenter, segment_text
from timelyllm_ros.core.types import SkillCall

ROBOTS = load_robots()
TELLO, ARM, CHAT = ROBOTS["tello"], ROBOTS["arm"], ROBOTS["chat"]

PLANS = [
    (TELLO, "s('cat');g('cat');tp;"),
    (TELLO, "s('cat');?iv('cat')==True{g('cat');tp;l('found; the } cat')}:{l('no {cat}')};mf(50);tp"),
    (TELLO, "_1=ox('cat');?_1>0.6{tc(15)};?_1<0.4{tu(15)};2{3{?iv('x')&oh('x')<0.5{mf(40)}:{tp}}};->True"),
    (TELLO, "8{?iv('cat')==True{->True}tc(45)}->False;"),
    (TELLO, "l('it\\'s a \\\\ path; {x}');tp();tp"),
    (ARM, "hm;dt('red box');pk('red box');pl('blue box');mt(-10,20,5);rw(-90);og;cg;wp('desk');hm"),
]


def whole(robot, text, **kw) -> list[Cut]:
    return segment_text(robot, text, **kw)


def fed(robot, pieces, **kw) -> list[Cut]:
    seg = Segmenter(robot, **kw)
    out: list[Cut] = []
    for p in pieces:
        out.extend(seg.feed(p))
    return out + seg.finish()


def key(cuts):
    return [(c.start, c.end, c.text, c.calls, c.blocking, c.error) for c in cuts]


@pytest.mark.parametrize("robot, text", PLANS)
def test_every_single_split_point_gives_same_cuts(robot, text):
    ref = key(whole(robot, text))
    assert ref and all(not e for *_, e in ref)
    for i in range(len(text) + 1):
        assert key(fed(robot, [text[:i], text[i:]])) == ref, f"split at {i}"


@pytest.mark.parametrize("robot, text", PLANS)
def test_every_pair_of_split_points_gives_same_cuts(robot, text):
    ref = key(whole(robot, text))
    n = len(text)
    for i in range(0, n + 1, 3):
        for j in range(i, n + 1, 2):
            assert key(fed(robot, [text[:i], text[i:j], text[j:]])) == ref, f"split at {i},{j}"


@pytest.mark.parametrize("robot, text", PLANS)
def test_cut_emitted_exactly_when_its_last_char_arrives(robot, text):
    seg = Segmenter(robot)
    for i, ch in enumerate(text):
        for cut in seg.feed(ch):
            assert cut.end == i + 1, (cut, i)
            assert text[cut.end - 1] in ";}"
            assert text[cut.start:cut.end].strip() == cut.text
    for cut in seg.finish():
        assert text[cut.start:cut.end] == cut.text
        assert text[cut.end:].strip() == ""


def test_cut_positions_and_texts():
    text = "s('cat');  ?iv('cat')==True{g('cat');tp}\n:{l('no')};tp"
    cuts = whole(TELLO, text)
    assert [c.text for c in cuts] == ["s('cat');", "?iv('cat')==True{g('cat');tp}", ":{l('no')}", "tp"]
    assert [(c.start, c.end) for c in cuts] == [(0, 9), (11, 40), (41, 51), (52, 54)]
    assert [text[c.start:c.end] for c in cuts] == [c.text for c in cuts]
    assert [c.blocking for c in cuts] == [True, True, False, False]
    assert cuts[0].calls == (SkillCall("scan", "s", ("cat",)),)
    assert all(c.ok for c in cuts)


def test_lrtrace_like_tokenisation():
    rng = random.Random(7)
    for robot, text in PLANS:
        ref = key(whole(robot, text))
        for _ in range(20):
            pieces, i = [], 0
            while i < len(text):
                k = rng.randint(1, 5)
                pieces.append(text[i:i + k])
                i += k
            assert key(fed(robot, pieces)) == ref
        assert key(fed(robot, re.findall(r".{1,3}", text, re.S))) == ref


def test_quotes_containing_separators_do_not_cut():
    seg = Segmenter(TELLO)
    assert seg.feed("l('a;b}c") == []
    assert seg.feed("{d)e(f") == []
    (cut,) = seg.feed("');")
    assert cut.calls == (SkillCall("log", "l", ("a;b}c{d)e(f",)),)
    assert seg.feed("l('don\\'t; stop')") == []
    (cut,) = seg.feed(";")
    assert cut.calls[0].args == ("don't; stop",)


def test_escaped_backslash_before_closing_quote():
    (cut,) = whole(TELLO, "l('a\\\\');")
    assert cut.ok and cut.calls[0].args == ("a\\",)


def test_nested_blocks_cut_only_at_top_level_close():
    seg = Segmenter(TELLO)
    assert seg.feed("2{3{?iv('x'){tp};mf(20);}") == []
    assert seg.feed("tc(90)") == []
    (cut,) = seg.feed("}")
    assert cut.ok and [str(c) for c in cut.calls] == ["iv('x')", "tp()", "mf(20)", "tc(90)"]


def test_conditional_dispatches_at_close_and_else_follows():
    seg = Segmenter(TELLO)
    (c1,) = seg.feed("?iv('cat')==True{g('cat')}")
    assert c1.ok and c1.blocking
    (c2,) = seg.feed(":{s('cat')}")
    assert c2.ok and c2.text == ":{s('cat')}"


def test_unicode_space_is_not_minispec_whitespace():
    (c,) = whole(TELLO, "\u00a0mf(50);")
    assert "unexpected character" in c.error and c.text == "\u00a0mf(50);"
    (c,) = whole(TELLO, "mf(50)\u00a0")
    assert "unexpected character" in c.error


def test_empty_statements_are_skipped():
    assert [c.text for c in whole(TELLO, "3{tp};;  ;mf(50);;")] == ["3{tp}", "mf(50);"]


@pytest.mark.parametrize("text, fragment", [
    ("foo(1);", "unknown skill 'foo'"),
    ("mf(5);", "below minimum"),
    ("mf(900);", "above maximum"),
    ("mf(50.5);", "must be an int"),
    ("s(3);", "must be a string"),
    ("mf(50)mf(60);", "one statement per segment"),
    ("pk('box');", "unknown skill 'pk'"),
    ("101{tp}", "outside 1..100"),
])
def test_invalid_statements_become_error_cuts(text, fragment):
    (cut,) = whole(TELLO, text)
    assert not cut.ok and fragment in cut.error
    assert cut.calls == () and cut.end == len(text)


def test_structural_errors_cut_immediately():
    seg = Segmenter(TELLO)
    (cut,) = seg.feed("mf(50;")
    assert "inside a call's parentheses" in cut.error and cut.end == 6
    (cut,) = seg.feed("}")
    assert "unbalanced '}'" in cut.error and (cut.start, cut.end) == (6, 7)
    (cut,) = seg.feed(" tp)")
    assert "unbalanced ')'" in cut.error and cut.text == "tp)"


def test_no_arg_call_at_end_completes_on_finish():
    seg2 = Segmenter(TELLO)
    (c1,) = seg2.feed("mf(50);tp")
    assert c1.text == "mf(50);"
    assert seg2.in_segment
    (c2,) = seg2.finish()
    assert c2.ok and c2.text == "tp" and (c2.start, c2.end) == (7, 9)
    assert seg2.finish() == []


@pytest.mark.parametrize("tail, fragment", [
    ("l('abc", "unterminated string"),
    ("3{tp", "missing 1 '}'"),
    ("mf(50", "missing ')'"),
    ("Here is the plan", "unknown skill"),
    ("```", "unexpected character"),
])
def test_finish_with_trailing_garbage_is_an_error_cut(tail, fragment):
    seg = Segmenter(TELLO)
    seg.feed("tp;" + tail)
    (cut,) = seg.finish()
    assert fragment in cut.error


def test_finish_whitespace_only_gives_nothing():
    seg = Segmenter(TELLO)
    assert len(seg.feed("tp; \n\t ")) == 1
    assert seg.finish() == []
    with pytest.raises(ValueError, match="after finish"):
        seg.feed("tp;")


def test_bad_input_types():
    seg = Segmenter(TELLO)
    with pytest.raises(TypeError):
        seg.feed(b"tp;")  # type: ignore[arg-type]
    assert seg.feed("") == []
    with pytest.raises(ValueError, match="mode"):
        Segmenter(TELLO, mode="sentence")
    with pytest.raises(ValueError, match="mode"):
        Segmenter(CHAT, mode="statement")


def test_overlong_statement_is_cut_as_error():
    seg = Segmenter(TELLO, max_statement_chars=50)
    cuts = seg.feed("l('" + "x" * 60)
    assert len(cuts) == 1 and "longer than 50" in cuts[0].error and cuts[0].end == 51
    # the rest of the cut statement is still string text: never scanned for statements (issue 12)
    assert seg.feed(";mf(60);") == []
    tail = seg.feed("');tp;")  # the string ends: the tail is one error cut, then scanning goes on
    assert [c.ok for c in tail] == [False, True] and "rest of a statement" in tail[0].error
    assert tail[0].text == "x" * 12 + ";mf(60);');" and tail[1].text == "tp;"
    seg = Segmenter(TELLO, max_statement_chars=50)
    cuts = seg.feed("l('" + "x" * 60) + seg.finish()
    assert [c.ok for c in cuts] == [False, False] and "rest of a statement" in cuts[1].error


def test_no_statement_is_invented_from_string_text():
    for text in ['l("x;mf(60);");', "l('x;mf(60);');", 'l("a\\"b;mf(60);");']:
        cuts = segment_text(TELLO, text)
        assert [c.text for c in cuts] == [text] and cuts[0].ok, cuts
        assert cuts[0].calls == (SkillCall("log", "l", (text[3:-3].replace('\\"', '"'),)),)
    text = "  l('" + "x" * 100 + "');tp;"
    ref = key(fed(TELLO, [text], max_statement_chars=50))
    for i in range(len(text)):  # where the deltas end does not matter
        assert key(fed(TELLO, [text[:i], text[i:]], max_statement_chars=50)) == ref


def test_eager_close_cuts_at_paren():
    seg = Segmenter(TELLO, eager_close=True)
    (c,) = seg.feed("mf(50)")
    assert c.ok and c.end == 6
    assert seg.feed(";") == []  # the ';' is an empty statement now
    assert seg.feed("_1=ox('a')")[0].text == "_1=ox('a')"
    assert seg.feed("?iv('a')") == []  # conditionals still wait for their block
    (c,) = seg.feed("{tp}")
    assert c.ok


def test_blocking_flag():
    assert whole(TELLO, "mf(50);")[0].blocking is False
    assert whole(TELLO, "s('cat');")[0].blocking is True
    assert whole(TELLO, "3{?iv('a'){tp}}")[0].blocking is True
    assert whole(ARM, "dt('box');")[0].blocking is True


def test_rollback_to_cut_end_and_inside_statement():
    seg = Segmenter(TELLO)
    cuts = seg.feed("s('cat');mf(50);tc(9")
    assert [c.end for c in cuts] == [9, 16]
    seg.rollback(9)  # the planner drops everything after the blocking scan
    assert seg.text == "s('cat');" and seg.length == 9 and not seg.in_segment
    seg.inject("\n# result: True\n")
    (c,) = seg.feed("g('cat');")
    assert (c.start, c.end) == (25, 34) and c.ok
    seg.feed("l('a;b")
    seg.rollback(37)  # inside the string literal
    assert seg.pending == "l('"
    (c,) = seg.feed("x;y');")
    assert c.calls[0].args == ("x;y",)


def test_inject_in_statement_is_refused_and_rollback_bounds():
    seg = Segmenter(TELLO)
    seg.feed("mf(5")
    with pytest.raises(ValueError, match="middle of a segment"):
        seg.inject("x")
    with pytest.raises(ValueError, match="rollback offset"):
        seg.rollback(10)
    with pytest.raises(ValueError, match="rollback offset"):
        seg.rollback(-1)


def test_rollback_after_finish_reopens():
    seg = Segmenter(TELLO)
    seg.feed("tp;mf(50)")
    assert seg.finish()[0].text == "mf(50)"
    seg.rollback(3)
    assert not seg.finished
    assert seg.feed("tc(90);")[0].text == "tc(90);"


# ------------------------------------------------------------------ chat


def chat_texts(text, **kw):
    return [c.text for c in whole(CHAT, text, **kw)]


def test_sentences_with_decimals_and_abbreviations():
    text = ("The rope is 3.5 m long. Dr. Smith, e.g. the vet, said so! Really?\" "
            "J. R. R. Tolkien agrees, i.e. it is true. It costs $3.50. Done")
    assert chat_texts(text) == [
        "The rope is 3.5 m long.", "Dr. Smith, e.g. the vet, said so!", "Really?\"",
        "J. R. R. Tolkien agrees, i.e. it is true.", "It costs $3.50.", "Done"]


def test_sentence_cut_is_exact_and_waits_for_whitespace():
    seg = Segmenter(CHAT)
    assert seg.feed("Hello there.") == []  # could still be "there.com" or "3.5"
    (c,) = seg.feed(" How")
    assert (c.start, c.end, c.text) == (0, 12, "Hello there.")
    assert c.calls == (SkillCall("say", "say", ("Hello there.",)),) and not c.blocking
    (c,) = seg.finish()
    assert (c.start, c.end, c.text) == (13, 16, "How")


def test_sentence_list_numbers_and_blank_lines():
    text = "Steps:\n\n1. Open the box.\n2. Take the cup. Then rest\n\nEnd."
    assert chat_texts(text) == ["Steps:", "1. Open the box.", "2. Take the cup.", "Then rest", "End."]


def test_paragraph_mode():
    text = "One. Two.\nThree!\n\n  \nSecond para.\n\nThird"
    cuts = whole(CHAT, text, mode="paragraph")
    assert [c.text for c in cuts] == ["One. Two.\nThree!", "Second para.", "Third"]
    assert text[cuts[1].start:cuts[1].end] == "Second para."


@pytest.mark.parametrize("mode", ["sentence", "paragraph"])
def test_chat_split_invariance(mode):
    text = "Hi! I am 3.5 years old, e.g. a kid.\n\nWhat? Mr. X said \"no.\" OK...  Bye.\n\nThe end"
    ref = key(whole(CHAT, text, mode=mode))
    for i in range(len(text) + 1):
        assert key(fed(CHAT, [text[:i], text[i:]], mode=mode)) == ref, i
    assert key(fed(CHAT, list(text), mode=mode)) == ref


def test_overlong_sentence_is_split_at_a_space():
    seg = Segmenter(CHAT, max_statement_chars=20)
    cuts = seg.feed("aaaa bbbb cccc dddd eeee ffff gggg")
    assert cuts and all(c.ok and len(c.text) <= 20 for c in cuts)
    cuts += seg.finish()
    assert " ".join(c.text for c in cuts) == "aaaa bbbb cccc dddd eeee ffff gggg"
    text = "aaaa   bbbb  cccc     dddd eeee"
    cuts = fed(CHAT, [text], max_statement_chars=12)
    assert all(text[c.start:c.end] == c.text for c in cuts) and len(cuts) >= 3


def test_huge_deltas_do_not_overflow():
    seg = Segmenter(CHAT, max_statement_chars=10)
    cuts = seg.feed("x" * 200_000) + seg.finish()
    assert len(cuts) == 20_000 and all(c.ok and len(c.text) == 10 for c in cuts)
    seg = Segmenter(TELLO, max_statement_chars=100)
    cuts = seg.feed("l('" + "y" * 100_000) + seg.finish()
    assert len(cuts) == 100_003 // 101 + 1 and not any(c.ok for c in cuts)  # 101 chars each + tail


def test_chat_control_characters_are_errors():
    (c,) = whole(CHAT, "Hi \x07 there.")
    assert "control character U+0007" in c.error
    (c,) = whole(CHAT, "Bidi \u202e trick.")
    assert "U+202E" in c.error


@pytest.mark.parametrize("robot, text, mode", [(r, t, None) for r, t in PLANS] + [
    (CHAT, "Hi! I am 3.5 years old, e.g. a kid.\n\nWhat? Mr. X said \"no.\" OK...  Bye.\n\nThe end", "sentence"),
    (CHAT, "One. Two.\n\nThree\nfour.\n\n\nFive", "paragraph")])
def test_rollback_to_any_offset_then_refeed_gives_same_cuts(robot, text, mode):
    ref = key(whole(robot, text, mode=mode))
    for k in range(len(text) + 1):
        seg = Segmenter(robot, mode=mode)
        first = seg.feed(text)
        seg.rollback(k)
        assert seg.text == text[:k] and seg.length == k
        again = seg.feed(text[k:]) + seg.finish()
        assert key([c for c in first if c.end <= k] + again) == ref, k


def test_a_result_the_model_writes_is_a_note_cut_whatever_the_token_boundaries():
    """`#<value>` at a statement start (what the prompt feeds back after a blocking statement, written
    by the model itself) runs to its newline: one cut with note=True and no calls; a `#` inside a
    string or a statement is not one (the statement is invalid as before)."""
    text = "s('red ball');#True\ng('red ball');#False\n;l('a #1');tp;#0.42"
    want = [("s('red ball');", False, ""), ("True", True, ""), ("g('red ball');", False, ""),
            ("False", True, ""), ("l('a #1');", False, ""), ("tp;", False, ""), ("0.42", True, "")]
    for step in (len(text), 1, 2, 3):
        seg = Segmenter(TELLO)
        cuts = []
        for i in range(0, len(text), step):
            cuts += seg.feed(text[i:i + step])
        cuts += seg.finish()
        assert [(c.text, c.note, c.error) for c in cuts] == want
        assert all(not c.calls and not c.blocking for c in cuts if c.note)
        assert text[cuts[1].start:cuts[1].end] == "#True\n"
    (bad,) = Segmenter(TELLO).feed("mf(50#x);")
    assert not bad.note and "unexpected character '#'" in bad.error
    seg = Segmenter(TELLO)
    seg.feed("s('cat');#Tr")
    seg.rollback(9)  # the planner drops a half-written note with the tokens after the statement
    assert seg.pending == "" and [c.text for c in seg.feed("g('cat');")] == ["g('cat');"]
