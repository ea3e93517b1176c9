"""A deterministic, reversible tokeniser for the simulator.

The simulator needs token *counts* that look like a real BPE tokeniser's (a drone plan of ~20
characters is ~15-20 tokens, a 2,884-token prompt is a few pages of text) and token *ids* that
are stable, so that prefix-cache hashes match across requests.  It does not need a trained
vocabulary: pieces are cut by a regex (letter runs, digit runs, whitespace runs, single other
characters), each piece split into chunks of at most 4 characters, and each distinct chunk gets
the next free id the first time it is seen.

It lives in core (pure: no I/O, no state beyond its vocabulary) because the oracle length
predictor (core/length_predictor.py) counts its tokens; the simulated engine and sim/ import it
from here.
"""

from __future__ import annotations

import re
from typing import Iterable, Sequence

# Every character matches exactly one alternative, so the pieces concatenate back to the input.
_PIECE_RE = re.compile(r"[A-Za-z_]+|[0-9]+|\s+|[^A-Za-z_0-9\s]")
MAX_CHUNK = 4


class SimTokenizer:
    """Reversible text <-> ids mapping; ids are assigned in order of first appearance.

    Id 0 is the end-of-sequence token: it decodes to "" and is never produced by `encode`.
    Two instances agree on ids exactly when they have seen the same texts in the same order,
    which is what a deterministic simulation needs.
    """

    eos_token_id = 0

    def __init__(self, max_chunk: int = MAX_CHUNK) -> None:
        if max_chunk < 1:
            raise ValueError(f"max_chunk must be >= 1, got {max_chunk}")
        self._max_chunk = max_chunk
        self._pieces: list[str] = [""]  # id -> text; 0 = EOS
        self._ids: dict[str, int] = {}

    @property
    def vocab_size(self) -> int:
        return len(self._pieces)

    def pieces(self, text: str) -> list[str]:
        """The chunks `encode` would produce, without touching the vocabulary."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        out: list[str] = []
        n = self._max_chunk
        for m in _PIECE_RE.finditer(text):
            p = m.group(0)
            out.extend(p[i:i + n] for i in range(0, len(p), n))
        return out

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for chunk in self.pieces(text):
            tid = self._ids.get(chunk)
            if tid is None:
                tid = len(self._pieces)
                self._pieces.append(chunk)
                self._ids[chunk] = tid
            ids.append(tid)
        return ids

    def decode(self, ids: Sequence[int] | Iterable[int]) -> str:
        """Text of these ids; EOS decodes to "" (a special token, as with skip_special_tokens)."""
        out: list[str] = []
        n = len(self._pieces)
        for tid in ids:
            if isinstance(tid, bool) or not isinstance(tid, int) or not 0 <= tid < n:
                raise ValueError(f"unknown token id {tid!r} (vocabulary has {n} ids)")
            out.append(self._pieces[tid])
        return "".join(out)

    def count(self, text: str) -> int:
        """Number of tokens `encode(text)` returns."""
        return len(self.pieces(text))
