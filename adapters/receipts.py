"""Receipts, exports and offline checks of a turn's hash chain (``engine.chain``).

A receipt is ``{"turn_id", "events", "head", "algorithm": "sha256-chain",
"signature"?}``: ``head`` is the hash of the turn's last event (hex) and
``signature`` the Ed25519 signature of the head's 32 bytes (base64), made
with the private key ``TURNLOG_RECEIPT_KEY`` names (a PEM file).

``turnlog export`` writes a turn as JSON lines: the receipt first,
``{"receipt": {...}}``, then one line per event, ``{"turn_id", "seq", "type",
"at", "data", "hash"}``, data as stored. Every line is compact JSON (no
whitespace, UTF-8) and :func:`verify_file` takes a line only in exactly that
form, so that any byte changed in the file fails: in an event (its hash no
longer matches), in the header (the receipt no longer matches the events),
or in the layout.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.chain import ALGORITHM, ChainResult, Damage, StoredEvent, check

_EVENT_KEYS = ("turn_id", "seq", "type", "at", "data", "hash")
_RECEIPT_KEYS = {"turn_id", "events", "head", "algorithm", "signature"}


class ReceiptKeyError(ValueError):
    """A receipt key file that cannot be used (missing, not PEM, not Ed25519)."""


def load_private_key(path: str) -> Any:
    """The Ed25519 private key in the PEM file ``path``."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ReceiptKeyError(f"receipt key {path}: {exc.strerror or exc}") from None
    try:
        key = load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise ReceiptKeyError(f"receipt key {path}: not an unencrypted PEM private key ({exc})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ReceiptKeyError(f"receipt key {path}: not an Ed25519 key")
    return key


def load_public_key(path: str) -> Any:
    """An Ed25519 public key from a PEM file (a private key's file gives its public key)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key, load_pem_public_key

    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ReceiptKeyError(f"public key {path}: {exc.strerror or exc}") from None
    key: Any
    try:
        key = load_pem_public_key(data)
    except (ValueError, TypeError):
        try:
            key = load_pem_private_key(data, password=None)
        except (ValueError, TypeError) as exc:
            raise ReceiptKeyError(f"public key {path}: not a PEM key ({exc})") from None
        if isinstance(key, Ed25519PrivateKey):
            key = key.public_key()
    if not isinstance(key, Ed25519PublicKey):
        raise ReceiptKeyError(f"public key {path}: not an Ed25519 key")
    return key


def public_pem(private_key: Any) -> str:
    """The PEM (SubjectPublicKeyInfo) of a private key's public key."""
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    return str(private_key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo).decode("ascii"))


def receipt(turn_id: str, result: ChainResult, private_key: Any | None = None) -> dict[str, Any]:
    """The receipt of a turn whose chain holds."""
    out: dict[str, Any] = {"turn_id": turn_id, "events": result.events, "head": result.head, "algorithm": ALGORITHM}
    if private_key is not None:
        out["signature"] = base64.b64encode(private_key.sign(bytes.fromhex(result.head))).decode("ascii")
    return out


def signature_ok(public_key: Any, head: str, signature: str) -> bool:
    from cryptography.exceptions import InvalidSignature

    try:
        raw = base64.b64decode(signature, validate=True)
        public_key.verify(raw, bytes.fromhex(head))
    except (InvalidSignature, ValueError):
        return False
    return True


def _line(obj: dict[str, Any]) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def export_lines(turn_id: str, events: Sequence[StoredEvent], result: ChainResult, private_key: Any | None) -> Iterable[str]:
    """The lines of ``turnlog export`` (each without its newline)."""
    yield _line({"receipt": receipt(turn_id, result, private_key)})
    for event in events:
        yield _line(event.exported())


@dataclass
class FileVerdict:
    """What :func:`verify_file` found: ``problem`` (one line) when it fails."""

    ok: bool
    turn_id: str | None = None
    events: int = 0
    head: str | None = None
    problem: str | None = None
    damage: Damage | None = None
    line: int | None = None  # the first bad line (1-based)
    notes: list[str] = field(default_factory=list)

    def public(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ok": self.ok, "turn_id": self.turn_id, "events": self.events, "head": self.head}
        if self.problem is not None:
            out["problem"] = self.problem
            out["line"] = self.line
        if self.damage is not None:
            out["damage"] = self.damage.public()
        if self.notes:
            out["notes"] = self.notes
        return out


def _fail(problem: str, line: int | None, **kw: Any) -> FileVerdict:
    where = f"line {line}: " if line is not None else ""
    return FileVerdict(False, problem=where + problem, line=line, **kw)


def verify_file(data: bytes, public_key: Any | None = None) -> FileVerdict:
    """Check an exported turn (the bytes of a ``turnlog export`` file): every
    line in its exact form, the chain, the receipt against the events and,
    with ``public_key``, the receipt's signature."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return _fail(f"not UTF-8 (byte {exc.start})", None)
    if not text:
        return _fail("the file is empty", None)
    if not text.endswith("\n"):
        return _fail("the file does not end with a newline (cut short or changed)", text.count("\n") + 1)
    lines = text[:-1].split("\n")
    header: dict[str, Any] | None = None
    events: list[StoredEvent] = []
    first_event_line = 1
    for number, raw in enumerate(lines, 1):
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as exc:
            return _fail(f"not JSON ({exc.msg} at column {exc.pos + 1})", number)
        if not isinstance(obj, dict):
            return _fail("not a JSON object", number)
        try:
            exact = _line(obj)
        except ValueError:
            exact = None
        if exact != raw:
            return _fail("not in the export's exact form (compact JSON, as written): the line was changed", number)
        if number == 1 and "receipt" in obj:
            if set(obj) != {"receipt"} or not isinstance(obj["receipt"], dict) or not set(obj["receipt"]) <= _RECEIPT_KEYS:
                return _fail("the header is not a receipt", number)
            header = obj["receipt"]
            first_event_line = 2
            continue
        if tuple(obj) != _EVENT_KEYS:
            return _fail(f"not an event line (keys {', '.join(_EVENT_KEYS)})", number)
        types_ok = (
            isinstance(obj["turn_id"], str)
            and type(obj["seq"]) is int
            and isinstance(obj["type"], str)
            and type(obj["at"]) in (int, float)
            and isinstance(obj["data"], dict)
            and (obj["hash"] is None or isinstance(obj["hash"], str))
        )
        if not types_ok:
            return _fail("an event field has the wrong type", number)
        events.append(StoredEvent(obj["turn_id"], obj["seq"], obj["type"], float(obj["at"]), obj["data"], obj["hash"]))
    turn_id = header.get("turn_id") if header is not None else (events[0].turn_id if events else None)
    if not isinstance(turn_id, str):
        return _fail("no turn id (no receipt, no events)", None)
    result = check(turn_id, events)
    verdict = FileVerdict(True, turn_id=turn_id, events=len(events), head=result.head)
    if result.damage is not None:
        damage = result.damage
        line = first_event_line + damage.index
        return _fail(damage.message, line, turn_id=turn_id, events=len(events), damage=damage)
    if header is None:
        verdict.notes.append("no receipt in the file: events removed from its end cannot be seen")
        return verdict
    if header.get("algorithm") != ALGORITHM:
        return _fail(f"unknown algorithm {header.get('algorithm')!r} (expected {ALGORITHM})", 1, turn_id=turn_id)
    count = header.get("events")
    if type(count) is not int:
        return _fail("the receipt's event count is not an integer", 1, turn_id=turn_id)
    if count > len(events):
        missing = Damage(
            len(events) + 1, "deleted", f"seq {len(events) + 1} missing: the receipt covers {count} events, the file has {len(events)}", len(events)
        )
        return _fail(missing.message, first_event_line + len(events), turn_id=turn_id, events=len(events), damage=missing)
    if count < len(events):
        extra = events[count]
        inserted = Damage(extra.seq, "inserted", f"seq {extra.seq} is past the receipt's {count} events: inserted", count)
        return _fail(inserted.message, first_event_line + count, turn_id=turn_id, events=len(events), damage=inserted)
    if header.get("head") != result.head:
        return _fail(f"the receipt's head {header.get('head')} is not the events' head {result.head}", 1, turn_id=turn_id, events=len(events))
    signature = header.get("signature")
    if public_key is not None:
        if not isinstance(signature, str):
            return _fail("the receipt has no signature to check with the public key", 1, turn_id=turn_id, events=len(events))
        if not signature_ok(public_key, result.head, signature):
            return _fail("the receipt's signature does not match the public key", 1, turn_id=turn_id, events=len(events))
        verdict.notes.append("signature verified")
    elif signature is not None:
        verdict.notes.append("signature not checked (no public key given)")
    else:
        verdict.notes.append("unsigned receipt: it proves the log is consistent, not who wrote it")
    return verdict
