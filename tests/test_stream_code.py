"""Tests for legacy code-interpreter blocks in engine.fold.accumulator.Accumulator
(legacy function calling with the code interpreter on): ``<code_interpreter ...>CODE</code_interpreter>``
in the streamed text, detected only with ``code_interpreter=True``."""

from __future__ import annotations

import itertools
import random
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest

from engine.fold.accumulator import CODE_INTERPRETER_TAGS, Accumulator, Piece
from tests.test_stream import assert_linear_feed

START = '<code_interpreter type="code" lang="python">'
END = "</code_interpreter>"


def counter_ids() -> Callable[[str], str]:
    counters: dict[str, int] = defaultdict(int)

    def make(prefix: str) -> str:
        counters[prefix] += 1
        return f"<{prefix}_{counters[prefix]}>"

    return make


def new_acc(*, code: bool = True, reasoning_tags: Any = None) -> Accumulator:
    return Accumulator(id_factory=counter_ids(), reasoning_tags=reasoning_tags, code_interpreter=code)


def feed_all(chunks: list[str], *, code: bool = True, finish: bool = True) -> tuple[Accumulator, list[Piece], str]:
    """The accumulator (finished unless told), the pieces and the visible
    text before the final strip."""
    acc = new_acc(code=code)
    pieces: list[Piece] = []
    for chunk in chunks:
        pieces += acc.feed_text(chunk)
    pieces += acc.flush()
    before = acc.text
    if finish:
        acc.finish()
    return acc, pieces, before


def of_kind(pieces: list[Piece], kind: str) -> str:
    return "".join(p.text for p in pieces if p.kind == kind)


def code_items(acc: Accumulator) -> list[dict[str, Any]]:
    return [it for it in acc.output if it["type"] == "code_interpreter"]


def test_tag_pair_constant() -> None:
    assert CODE_INTERPRETER_TAGS == (("<code_interpreter>", "</code_interpreter>"),)


def test_block_between_text() -> None:
    text = f"Let me compute.\n{START}\nprint(1 + 1)\n{END}\n\nDone."
    acc, pieces, _ = feed_all([text])
    assert acc.output == [
        {
            "type": "message",
            "id": "<msg_1>",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Let me compute.\n"}],
        },
        {
            "type": "code_interpreter",
            "id": "<ci_1>",
            "status": "completed",
            "start_tag": "<code_interpreter>",
            "end_tag": "</code_interpreter>",
            "attributes": {"type": "code", "lang": "python"},
            "lang": "python",
            "code": "print(1 + 1)",
            "output": None,
        },
        {
            "type": "message",
            "id": "<msg_2>",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Done."}],
        },
    ]
    assert pieces == [Piece("text", "Let me compute.\n"), Piece("code", "print(1 + 1)"), Piece("text", "Done.")]
    assert acc.text == "Let me compute.\nDone."  # code is not answer text
    assert acc.reasoning_text == ""
    assert acc.content == text  # the raw text keeps the tags


def test_attributes_and_lang() -> None:
    acc, _, _ = feed_all([f"<code_interpreter>x = 1{END}"])
    (item,) = code_items(acc)
    assert item["attributes"] == {} and item["lang"] == "python"
    acc, _, _ = feed_all([f'<code_interpreter type="code" lang="javascript" x="1">console.log(1){END}'])
    (item,) = code_items(acc)
    assert item["attributes"] == {"type": "code", "lang": "javascript", "x": "1"}
    assert item["lang"] == "javascript"
    # No type="code": still an item (the engine decides what to run; Open WebUI never ran it
    # but re-prompted anyway).
    acc, _, _ = feed_all([f'<code_interpreter lang="python">1/0{END}'])
    assert code_items(acc)[0]["attributes"] == {"lang": "python"}


def test_code_is_stripped_but_inner_indentation_kept() -> None:
    code = "for i in range(3):\n    print(i)\n\nprint('done')"
    acc, pieces, _ = feed_all([f"{START}\n\n  {code}  \n\n{END}"])
    assert code_items(acc)[0]["code"] == code
    assert of_kind(pieces, "code") == code


def test_live_pieces_and_item_while_streaming() -> None:
    acc = new_acc()
    assert acc.feed_text("Run:<code_inter") == [Piece("text", "Run:")]  # maybe a tag: held
    assert acc.feed_text('preter type="co') == []  # attribute tag not decided yet
    assert acc.feed_text('de">\nimport ma') == [Piece("code", "import ma")]
    (item,) = code_items(acc)
    assert item["status"] == "in_progress" and item["code"] == "import ma" and item["output"] is None
    assert acc.output[0]["status"] == "completed"  # the message before the block
    assert acc.pending_code is None
    assert acc.feed_text("th\n") == [Piece("code", "th")]  # trailing blank waits
    assert acc.feed_text("print(math.pi)\n</code_") == [Piece("code", "\nprint(math.pi)")]
    assert acc.feed_text("interpreter>") == []
    assert item["status"] == "completed"
    _ = acc.output  # item texts are brought up to date when output is read
    assert item["code"] == "import math\nprint(math.pi)"
    assert acc.pending_code is item
    assert acc.feed_text("\n\n") == []  # blanks after the end tag are dropped
    assert acc.pending_code is item
    assert acc.feed_text("The answer") == [Piece("text", "The answer")]
    assert acc.pending_code is None  # the model went on: nothing to run
    acc.finish()
    assert [it["type"] for it in acc.output] == ["message", "code_interpreter", "message"]


def test_less_than_in_code_is_shown_eventually() -> None:
    acc = new_acc()
    acc.feed_text(START)
    assert acc.feed_text("if a <") == [Piece("code", "if a")]
    assert acc.feed_text(" b: pass") == [Piece("code", " < b: pass")]
    acc.finish()
    assert code_items(acc)[0]["code"] == "if a < b: pass"


SAMPLES = [
    f"Let me compute.\n{START}\nprint(1 + 1)\n{END}\n\nDone.",
    f"{START}a = 1{END}",
    f"  {START}  a < b  {END}  after  ",
    f"<code_interpreter>x</code_interpreter>{START}y{END}z",  # two blocks in one chunk
    f"<think>plan</think>{START}code{END}<|begin_of_solution|>S<|end_of_solution|>",
    f"{START}print('<think>not a tag</think>'){END}",
    f"{START}never closes  ",
    f"{START}{END}Answer",
    f"{START}   {END}",
    "<code_interpreter about it\nok",  # a newline: not a tag
    "a <code_interpreter",
    f"<code_interpreter x='1'>y{END}",  # single quotes: still a tag, no attributes
    f"text {END} more",  # a stray end tag is text
]


@pytest.mark.parametrize("text", SAMPLES)
def test_chunking_does_not_matter(text: str) -> None:
    """For any cut of the text into chunks: the same items, text pieces that
    add up to the visible text, code pieces that add up to the code."""
    reference, ref_pieces, ref_before = feed_all([text])
    assert of_kind(ref_pieces, "text") == ref_before
    chunkings: list[list[str]] = [list(text)]
    for i in range(len(text) + 1):
        chunkings.append([text[:i], text[i:]])
    rng = random.Random(len(text))
    for _ in range(30):
        cuts = sorted(rng.sample(range(len(text) + 1), k=min(3, len(text) + 1)))
        chunkings.append([text[a:b] for a, b in itertools.pairwise([0, *cuts, len(text)])])
    for chunks in chunkings:
        acc, pieces, before = feed_all(chunks)
        assert acc.output == reference.output, chunks
        assert of_kind(pieces, "text") == before, chunks
        assert of_kind(pieces, "reasoning") == acc.reasoning_text, chunks
        assert of_kind(pieces, "code") == "".join(it["code"] for it in code_items(acc)), chunks
        assert acc.content == text


def test_sample_shapes() -> None:
    acc, _, _ = feed_all([SAMPLES[3]])
    assert [(it["type"], it["id"]) for it in acc.output] == [
        ("code_interpreter", "<ci_1>"),
        ("code_interpreter", "<ci_2>"),
        ("message", "<msg_1>"),
    ]
    assert [it["code"] for it in code_items(acc)] == ["x", "y"]

    acc, _, _ = feed_all([SAMPLES[4]])
    assert [it["type"] for it in acc.output] == ["reasoning", "code_interpreter", "message"]
    assert acc.text == "S"

    acc, _, _ = feed_all([SAMPLES[5]])
    assert code_items(acc)[0]["code"] == "print('<think>not a tag</think>')"
    assert acc.reasoning_text == ""

    # An empty block creates no item and burns no id.
    for text in (SAMPLES[7], SAMPLES[8]):
        acc, _, _ = feed_all([text])
        assert code_items(acc) == []
        assert acc.pending_code is None
    acc, _, _ = feed_all([SAMPLES[7]])
    assert [it["id"] for it in acc.output] == ["<msg_1>"]

    acc, _, _ = feed_all([SAMPLES[11]])
    assert code_items(acc)[0]["attributes"] == {}

    for text in (SAMPLES[9], SAMPLES[10], SAMPLES[12]):
        acc, _, _ = feed_all([text])
        assert code_items(acc) == [] and acc.text == text.strip()


def test_flag_off_tags_are_plain_text() -> None:
    text = f"Before {START}print(1){END} after"
    for chunks in ([text], list(text)):
        acc, pieces, _ = feed_all(chunks, code=False)
        assert [it["type"] for it in acc.output] == ["message"]
        assert acc.text == text
        assert of_kind(pieces, "text") == text
        assert acc.pending_code is None
    # The default is off.
    acc = Accumulator(id_factory=counter_ids())
    acc.feed_text(text)
    acc.finish()
    assert acc.text == text


def test_detected_with_reasoning_tags_off_and_after_native_reasoning() -> None:
    acc = new_acc(reasoning_tags=False)
    acc.feed_text(f"<think>t</think>{START}c{END}")
    acc.finish()
    assert [it["type"] for it in acc.output] == ["message", "code_interpreter"]
    assert acc.text == "<think>t</think>"

    acc = new_acc()
    acc.feed_reasoning("native")
    acc.feed_text(f"<think>t</think>{START}c{END}")  # reasoning tags now literal
    acc.finish()
    assert [it["type"] for it in acc.output] == ["reasoning", "message", "code_interpreter"]
    assert acc.pending_code is code_items(acc)[0]


def test_unclosed_block_at_finish_is_completed_and_pending() -> None:
    acc = new_acc()
    acc.feed_text(f"{START}\nprint(")
    acc.feed_text("1)  ")
    (item,) = code_items(acc)
    assert item["status"] == "in_progress"
    assert acc.pending_code is None
    assert acc.flush() == [Piece("code", "  ")]  # as for reasoning: an unclosed block is not stripped
    assert item["status"] == "in_progress"
    acc.finish()
    assert item["status"] == "completed"
    assert item["code"] == "print(1)  "
    assert acc.pending_code is item


def test_unclosed_block_mark_incomplete() -> None:
    acc = new_acc()
    acc.feed_text(f"Text {START}print(1)")
    acc.mark_incomplete()
    assert [(it["type"], it["status"]) for it in acc.output] == [
        ("message", "completed"),
        ("code_interpreter", "incomplete"),
    ]
    assert acc.pending_code is None
    acc.finish()  # no-op after a terminal call
    assert code_items(acc)[0]["status"] == "incomplete"
    # A block that had closed stays completed (and pending).
    done = new_acc()
    done.feed_text(f"{START}x{END}")
    done.mark_incomplete()
    assert code_items(done)[0]["status"] == "completed"
    assert done.pending_code is code_items(done)[0]


def test_pending_code_and_set_code_output() -> None:
    acc = new_acc()
    assert acc.pending_code is None
    acc.feed_text(f"{START}print(2){END}\n")
    acc.finish()
    item = acc.pending_code
    assert item is not None and item["id"] == "<ci_1>" and item["code"] == "print(2)"
    assert acc.output[-1] is item  # the live item

    result = {"stdout": "2\n", "stderr": "", "result": ""}
    acc.set_code_output("<ci_1>", result)
    assert item["output"] == result
    assert item["output"] is not result  # copied
    assert item["status"] == "completed"
    assert acc.pending_code is None

    acc.set_code_output("<ci_1>", "plain")  # a string output, replacing
    assert item["output"] == "plain"

    with pytest.raises(KeyError):
        acc.set_code_output("<ci_9>", "x")
    with pytest.raises(TypeError):
        acc.set_code_output("<ci_1>", 42)


def test_set_code_output_targets_the_named_block_only() -> None:
    acc = new_acc()
    acc.feed_text(f"{START}a{END}between{START}b{END}")
    first, second = code_items(acc)
    assert acc.pending_code is second
    with pytest.raises(KeyError):
        acc.set_code_output(str(acc.output[1]["id"]), "x")  # a message id, not a code block
    acc.set_code_output(first["id"], "A")  # allowed while streaming, any block
    assert first["output"] == "A" and second["output"] is None
    assert acc.pending_code is second
    # An empty string is an output: the block is no longer pending.
    acc.set_code_output(second["id"], "")
    assert acc.pending_code is None


@pytest.mark.parametrize(
    "text",
    [
        "Hello world, this is an answer. " * 3200,
        START + "x = compute(y) + 1\n" * 6000,
        f"{START}a{END}b " * 2000,
        ("<code_interpreter " + "a" * 300) * 330,
        "<code_interpreter about " * 5000,
        "<c<co<cod " * 10000,
    ],
    ids=["prose", "in_block", "many_blocks", "open_attr_tags", "dense_candidates", "prefixes"],
)
def test_one_char_chunks_cost_linear_time(text: str) -> None:
    """The code-block parser is never quadratic, judged by growth as in
    test_stream (a wall-clock limit fails on a busy machine)."""
    assert_linear_feed(text, new_acc)
