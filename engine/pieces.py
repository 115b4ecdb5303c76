"""What a live client is shown of the answer as it streams: pieces of text.

Shared by the fold that produces them (``engine.fold.accumulator``) and the
live messages that carry them (``engine.ports``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PieceKind = Literal["text", "reasoning", "code", "tool_arguments"]


@dataclass(slots=True)  # immutable by convention (frozen init is 4x slower, per chunk)
class Piece:
    """What a live client should be shown for a chunk: text that entered a
    message item (``"text"``), a reasoning item (``"reasoning"``) or the code
    of a code-interpreter block (``"code"``), or a fragment of the arguments
    of the function call ``call_id`` (``"tool_arguments"``). Consumers ignore
    kinds they do not know.

    Tags are never shown, and text that might still turn out to be a tag is
    held back until that is decided, so that a client can append pieces
    without ever retracting anything: the ``"text"`` pieces of a stream
    (including those from :meth:`Accumulator.flush`) concatenate to exactly
    :attr:`Accumulator.text` before the final strip of :meth:`Accumulator.finish`.
    """

    kind: PieceKind
    text: str
    call_id: str | None = None
