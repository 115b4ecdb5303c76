"""A reranking server on loopback, as strict as the real ones about what it is sent.

``shape="cohere"`` (Cohere, Jina): ``POST /v1/rerank`` takes exactly
``{"model"?, "query", "documents", "top_n"?, "return_documents"?}`` (any other
field, a non-string document, an empty list or a ``top_n`` out of range is a 400
with an error message, as Cohere answers) and answers
``{"id", "results": [{"index", "relevance_score"}], "meta"}``, best first and
cut at ``top_n``. ``shape="tei"``: ``{"query", "texts", "raw_scores"?,
"truncate"?}`` → ``[{"index", "score"}]``, best first (TEI's 422 otherwise).

The scores are the test's oracle, not a model: ``relevant`` maps a phrase to a
score; a document gets the highest score of the phrases it contains, else 0.01.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

COHERE_FIELDS = {"model", "query", "documents", "top_n", "return_documents", "max_tokens_per_doc"}
TEI_FIELDS = {"query", "texts", "raw_scores", "truncate", "return_text", "truncation_direction"}


class RerankServer:
    def __init__(self, shape: str = "cohere", relevant: dict[str, float] | None = None, key: str | None = None) -> None:
        self.shape = shape
        self.relevant = relevant or {}
        self.key = key
        self.requests: list[dict[str, Any]] = []
        self.fail: tuple[int, Any] | None = None  # (status, body) answered instead
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/rerank", self._rerank)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}/v1"
        return self.url

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def score(self, text: str) -> float:
        return max((s for phrase, s in self.relevant.items() if phrase.lower() in text.lower()), default=0.01)

    async def _rerank(self, request: web.Request) -> web.StreamResponse:
        if self.key is not None and request.headers.get("Authorization") != f"Bearer {self.key}":
            return web.json_response({"message": "invalid api token"}, status=401)
        body = await request.json()
        self.requests.append(body)
        if self.fail is not None:
            status, answer = self.fail
            return web.json_response(answer, status=status) if not isinstance(answer, bytes) else web.Response(body=answer, status=status)
        problem = self._problem(body)
        if problem is not None:
            if self.shape == "cohere":
                return web.json_response({"message": problem}, status=400)
            return web.json_response({"error": problem, "error_type": "Validation"}, status=422)
        texts = body["documents"] if self.shape == "cohere" else body["texts"]
        ranked = sorted(range(len(texts)), key=lambda i: -self.score(texts[i]))
        if self.shape == "tei":
            return web.json_response([{"index": i, "score": self.score(texts[i])} for i in ranked])
        ranked = ranked[: body.get("top_n", len(texts))]
        results = [{"index": i, "relevance_score": self.score(texts[i])} for i in ranked]
        return web.json_response({"id": "rr-1", "results": results, "meta": {"billed_units": {"search_units": 1}}})

    def _problem(self, body: Any) -> str | None:
        if not isinstance(body, dict):
            return "body must be an object"
        allowed, docs_field = (COHERE_FIELDS, "documents") if self.shape == "cohere" else (TEI_FIELDS, "texts")
        unknown = set(body) - allowed
        if unknown:
            return f"unknown field(s): {sorted(unknown)}"
        if not isinstance(body.get("query"), str) or not body["query"]:
            return "query must be a non-empty string"
        docs = body.get(docs_field)
        if not isinstance(docs, list) or not docs or not all(isinstance(d, str) for d in docs):
            return f"{docs_field} must be a non-empty list of strings"
        top_n = body.get("top_n")
        if top_n is not None and (not isinstance(top_n, int) or not 1 <= top_n <= len(docs)):
            return "top_n must be between 1 and the number of documents"
        if "model" in body and not isinstance(body["model"], str):
            return "model must be a string"
        return None
