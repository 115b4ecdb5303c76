"""The OpenAI Images API (and compatible servers) behind ``engine.ports.ImageGenerator``.

* generate: ``POST {base}/images/generations`` with JSON
  ``{"model", "prompt", "n", "size", "response_format": "b64_json"}``;
* edit: ``POST {base}/images/edits``, multipart: one ``image[]`` part per input
  image (its bytes, a file name and its MIME type), ``prompt``, ``model``,
  ``n``, ``size`` (and ``response_format``);
* the answer: ``data[]`` with ``b64_json`` and, for models that rewrite the
  prompt, ``revised_prompt``.

The GPT Image models (``gpt-image-*``) always answer in base64 and reject a
``response_format`` field (HTTP 400 "Unknown parameter"), so it is sent only to
the others (``dall-e-*`` and compatible servers), where it is what makes them
answer with bytes instead of a URL to download. The MIME type of each image is
read from its bytes (PNG, JPEG, WebP, GIF), since the API does not say it and
``output_format`` may change it.

Every failure (HTTP status, timeout, connection, a body without images) raises
``WebError`` with the API's own message; the key is never in it.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import aiohttp

from adapters.client_session import LazySession
from engine.ports import GeneratedImage, WebError

if TYPE_CHECKING:
    from adapters.config import Settings

__all__ = ["OpenAIImages", "image_mime", "open_images"]

_EXTENSIONS = {"image/png": "png", "image/jpeg": "jpg", "image/webp": "webp", "image/gif": "gif"}


def image_mime(data: bytes) -> str | None:
    """The MIME type of image bytes, from their magic number (None: not an image we know)."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "image/gif"
    return None


class OpenAIImages:
    """``ImageGenerator`` for ``base_url`` (an OpenAI-compatible ``…/v1``).

    ``model`` and ``size`` are the defaults of every call (a call's ``size``
    wins); ``timeout`` is per request and generous, since a large image takes
    tens of seconds. One session, made lazily; ``close()`` ends it unless it
    was passed in.
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        model: str = "gpt-image-1",
        size: str | None = "1024x1024",
        timeout: float = 180.0,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.size = size
        self.timeout = timeout
        self._key = api_key
        self._session = LazySession(aiohttp.ClientTimeout(total=timeout), session)

    @property
    def _wants_response_format(self) -> bool:
        return not self.model.startswith("gpt-image")

    def _client(self) -> aiohttp.ClientSession:
        return self._session.get()

    async def close(self) -> None:
        await self._session.close()

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._key}"} if self._key else {}

    async def generate(self, prompt: str, *, n: int = 1, size: str | None = None) -> list[GeneratedImage]:
        """``n`` images for ``prompt``. Raises ``WebError``."""
        body: dict[str, Any] = {"model": self.model, "prompt": prompt, "n": n}
        if size or self.size:
            body["size"] = size or self.size
        if self._wants_response_format:
            body["response_format"] = "b64_json"
        return await self._post("/images/generations", json_body=body)

    async def edit(self, prompt: str, images: Sequence[tuple[bytes, str]], *, size: str | None = None) -> list[GeneratedImage]:
        """One image: ``images`` (bytes, MIME type) changed as ``prompt`` says. Raises ``WebError``."""
        if not images:
            raise WebError("image edit needs at least one image")
        form = aiohttp.FormData()
        for i, (data, mime) in enumerate(images):
            ext = _EXTENSIONS.get(mime, "png")
            form.add_field("image[]", data, filename=f"image-{i}.{ext}", content_type=mime)
        form.add_field("prompt", prompt)
        form.add_field("model", self.model)
        form.add_field("n", "1")
        if size or self.size:
            form.add_field("size", str(size or self.size))
        if self._wants_response_format:
            form.add_field("response_format", "b64_json")
        return await self._post("/images/edits", form=form)

    async def _post(self, path: str, *, json_body: dict[str, Any] | None = None, form: aiohttp.FormData | None = None) -> list[GeneratedImage]:
        what = "image generation" if path.endswith("generations") else "image edit"
        try:
            async with self._client().post(
                self.base_url + path, json=json_body, data=form, headers=self._headers(), timeout=aiohttp.ClientTimeout(total=self.timeout)
            ) as resp:
                text = (await resp.read()).decode("utf-8", errors="replace")
                status = resp.status
        except TimeoutError:
            raise WebError(f"{what} did not finish within {self.timeout:g} s") from None
        except aiohttp.ClientConnectorError as exc:
            raise WebError(f"{what} failed: the images API is unreachable ({exc.os_error.strerror or exc.os_error})") from None
        except aiohttp.ClientError as exc:
            raise WebError(f"{what} failed: {type(exc).__name__}: {exc}") from None
        if status != 200:
            raise WebError(f"{what} failed: HTTP {status}{self._detail(text)}")
        try:
            data = json.loads(text)
        except ValueError:
            raise WebError(f"{what} failed: the images API answered with something that is not JSON: {text[:120]!r}") from None
        items = data.get("data") if isinstance(data, dict) else None
        if not isinstance(items, list) or not items:
            raise WebError(f"{what} failed: the answer has no images (no data list)")
        out = []
        for item in items:
            b64 = item.get("b64_json") if isinstance(item, dict) else None
            if not isinstance(b64, str):
                has_url = isinstance(item, dict) and "url" in item
                raise WebError(f"{what} failed: an image came {'as a URL' if has_url else 'without b64_json'}, not as base64 bytes")
            try:
                raw = base64.b64decode(b64, validate=True)
            except (binascii.Error, ValueError):
                raise WebError(f"{what} failed: an image's b64_json is not valid base64") from None
            mime = image_mime(raw)
            if mime is None:
                raise WebError(f"{what} failed: the API returned bytes that are not a PNG, JPEG, WebP or GIF image")
            revised = item.get("revised_prompt")
            out.append(GeneratedImage(data=raw, mime=mime, revised_prompt=revised if isinstance(revised, str) and revised else None))
        return out

    def _detail(self, body: str) -> str:
        try:
            data = json.loads(body)
        except ValueError:
            detail = " ".join(body.split())[:200]
        else:
            err = data.get("error") if isinstance(data, dict) else None
            msg = err.get("message") if isinstance(err, dict) else err if isinstance(err, str) else None
            detail = str(msg) if msg else body[:200]
        if self._key:
            detail = detail.replace(self._key, "***")
        return f": {detail}" if detail else ""


def open_images(settings: Settings) -> OpenAIImages | None:
    """The image generator of the settings, or None when no images API is known.

    ``images_base_url`` (with ``images_api_key``) names one; unset, the OpenAI
    upstream's base URL and key are used. The upstream's key is never sent to
    an ``images_base_url`` of its own: that one gets ``images_api_key`` or nothing."""
    if settings.images_base_url:
        base = settings.images_base_url
        key = settings.images_api_key
    elif (endpoint := settings.openai_endpoint(settings.images_connection)) is not None:
        # The connection named by images_connection (default: the OpenAI upstream).
        base, upstream_key = endpoint
        key = settings.images_api_key or upstream_key
    else:
        return None
    return OpenAIImages(
        base,
        api_key=key.get_secret_value() if key else None,
        model=settings.images_model,
        size=settings.images_size or None,
    )
