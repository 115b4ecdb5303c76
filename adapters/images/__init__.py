"""Image generation (``engine.ports.ImageGenerator``): an OpenAI Images-compatible API."""

from adapters.images.openai import OpenAIImages, open_images

__all__ = ["OpenAIImages", "open_images"]
