"""OpenTelemetry traces of turns, following the GenAI semantic conventions.

A turn is one trace: an ``invoke_agent turnlog`` span from its start to its
end, and under it a ``chat {model}`` span per model call (with the token usage
and finish reasons) and an ``execute_tool {name}`` span per tool call (error
status when the call failed). Jaeger, Tempo, Langfuse or Phoenix show a turn
from these names and attributes alone.

Only with the ``otel`` extra installed and an OTLP endpoint set
(``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``);
everything else comes from the standard ``OTEL_*`` variables (service name,
resource attributes, headers, timeout, sampler, batch sizes), read by the SDK
itself. Spans are exported over OTLP/HTTP (protobuf) by the SDK's batch
processor, in its own thread: nothing on the event loop waits for the
collector. The tracer provider belongs to the app (not the global one), so
several apps in one process keep their traces apart.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.ports import ResolvedModel

log = logging.getLogger("turnlog.observe")

AGENT_NAME = "turnlog"


def tracing_requested(env: Mapping[str, str] = os.environ) -> bool:
    """Whether the standard variables ask for traces: an OTLP endpoint is set and
    neither ``OTEL_SDK_DISABLED`` nor ``OTEL_TRACES_EXPORTER=none`` says no."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return bool(env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def open_tracing(env: Mapping[str, str] = os.environ) -> Tracing | None:
    """The tracer of this app, or None when traces are not asked for or the
    ``otel`` extra is missing (then a warning says so, once, at start)."""
    if not tracing_requested(env):
        return None
    protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf"
    if protocol != "http/protobuf":
        log.warning("OTEL_EXPORTER_OTLP_PROTOCOL=%s is not supported: turnlog exports traces over http/protobuf", protocol)
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning("an OTLP endpoint is set but the otel extra is not installed (pip install 'turnlog[otel]'): no traces")
        return None
    # Resource.create reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; "turnlog"
    # only when neither names the service.
    named = env.get("OTEL_SERVICE_NAME") or "service.name=" in env.get("OTEL_RESOURCE_ATTRIBUTES", "")
    resource = Resource.create({} if named else {"service.name": "turnlog"})
    provider = TracerProvider(resource=resource)  # the sampler from OTEL_TRACES_SAMPLER
    exporter = OTLPSpanExporter()  # endpoint, headers, timeout, compression from OTEL_EXPORTER_OTLP_*
    provider.add_span_processor(BatchSpanProcessor(exporter))  # OTEL_BSP_* for its batching
    log.info("traces: OTLP/HTTP to %s", env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"))
    return Tracing(provider)


def provider_name(resolved: ResolvedModel) -> str:
    """``gen_ai.provider.name`` of an upstream: the convention's names where one fits."""
    from adapters.providers.demo import DemoProvider
    from adapters.providers.ollama import OllamaProvider

    if isinstance(resolved.provider, OllamaProvider):
        return "ollama"
    if isinstance(resolved.provider, DemoProvider):
        return "turnlog.demo"
    return "openai"  # the OpenAI-compatible upstream (Chat Completions or Responses)


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def token_counts(usage: Mapping[str, Any] | None) -> dict[str, int]:
    """``gen_ai.usage.*`` from either API's usage (Chat: prompt/completion, Responses: input/output)."""
    if not usage:
        return {}
    out: dict[str, int] = {}
    for attr, keys in (
        ("gen_ai.usage.input_tokens", ("input_tokens", "prompt_tokens")),
        ("gen_ai.usage.output_tokens", ("output_tokens", "completion_tokens")),
    ):
        for key in keys:
            value = usage.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                out[attr] = value
                break
    return out


@dataclass
class _Turn:
    span: Any
    context: Any
    model: Any = None  # the open model call's span
    tools: dict[str, Any] = field(default_factory=dict)  # call id -> open span


class Tracing:
    """``engine.ports.TurnObserver`` as OpenTelemetry spans."""

    def __init__(self, provider: Any) -> None:
        from opentelemetry import trace

        self._trace = trace
        self.provider = provider
        self._tracer = provider.get_tracer("turnlog")
        self._turns: dict[str, _Turn] = {}

    def _error(self, span: Any, kind: str, message: str | None = None) -> None:
        from opentelemetry.trace import Status, StatusCode

        span.set_attribute("error.type", kind)
        span.set_status(Status(StatusCode.ERROR, message or kind))

    def turn_started(self, turn_id: str, *, model: str, chat_id: str | None, started_at: float | None, resumed: bool) -> None:
        from opentelemetry.trace import SpanKind

        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": AGENT_NAME,
            "gen_ai.request.model": model,
            "turnlog.turn_id": turn_id,
            "turnlog.resumed": resumed,
        }
        if chat_id:
            attributes["gen_ai.conversation.id"] = chat_id
        # A new turn's span starts when it was recorded; a resumed one now (its
        # first process's trace ended when that process stopped running it).
        start = _ns(started_at) if started_at is not None and not resumed else None
        span = self._tracer.start_span(f"invoke_agent {AGENT_NAME}", kind=SpanKind.INTERNAL, attributes=attributes, start_time=start)
        self._turns[turn_id] = _Turn(span, self._trace.set_span_in_context(span))

    def turn_ended(self, turn_id: str, status: str) -> None:
        turn = self._turns.pop(turn_id, None)
        if turn is None:
            return
        reason = "cancelled" if status == "cancelled" else "turn_ended" if status != "running" else "released"
        if turn.model is not None:  # cut off (cancel, shutdown): its answer is partial
            self._error(turn.model, reason)
            turn.model.end()
        for span in turn.tools.values():
            self._error(span, reason)
            span.end()
        turn.span.set_attribute("turnlog.status", status)
        if status == "failed":
            self._error(turn.span, "turn_failed")
        turn.span.end()

    def first_token(self, turn_id: str, seconds: float) -> None:
        turn = self._turns.get(turn_id)
        if turn is not None:
            turn.span.set_attribute("turnlog.time_to_first_token", seconds)

    def model_call_started(self, turn_id: str, *, model: str, resolved: ResolvedModel, iteration: int) -> None:
        from opentelemetry.trace import SpanKind

        turn = self._turns.get(turn_id)
        if turn is None:
            return
        provider = provider_name(resolved)
        attributes = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": provider,
            "gen_ai.system": provider,  # the name before semantic conventions 1.37
            "gen_ai.request.model": resolved.upstream_model,
            "turnlog.model": model,
            "turnlog.api": resolved.api,
            "turnlog.iteration": iteration,
        }
        turn.model = self._tracer.start_span(f"chat {resolved.upstream_model}", context=turn.context, kind=SpanKind.CLIENT, attributes=attributes)

    def model_call_ended(
        self,
        turn_id: str,
        *,
        finish_reason: str | None = None,
        usage: dict[str, Any] | None = None,
        response_id: str | None = None,
        error: str | None = None,
    ) -> None:
        turn = self._turns.get(turn_id)
        if turn is None or turn.model is None:
            return
        span, turn.model = turn.model, None
        # The upstreams' streams do not name the model that answered: it is the one asked for.
        span.set_attribute("gen_ai.response.model", span.attributes.get("gen_ai.request.model", ""))
        for key, value in token_counts(usage).items():
            span.set_attribute(key, value)
        if finish_reason:
            span.set_attribute("gen_ai.response.finish_reasons", [finish_reason])
        if response_id:
            span.set_attribute("gen_ai.response.id", response_id)
        if error:
            self._error(span, error)
        span.end()

    def tool_call_started(self, turn_id: str, *, call_id: str, name: str) -> None:
        turn = self._turns.get(turn_id)
        if turn is not None:
            turn.tools[call_id] = self._tool_span(turn, call_id, name)

    def _tool_span(self, turn: _Turn, call_id: str, name: str) -> Any:
        from opentelemetry.trace import SpanKind

        attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name, "gen_ai.tool.call.id": call_id}
        return self._tracer.start_span(f"execute_tool {name}", context=turn.context, kind=SpanKind.INTERNAL, attributes=attributes)

    def tool_call_ended(self, turn_id: str, *, call_id: str, name: str, status: str, error: str | None = None) -> None:
        turn = self._turns.get(turn_id)
        if turn is None:
            return
        # A call refused before it ran (unknown tool, bad arguments) gets a span too.
        span = turn.tools.pop(call_id, None) or self._tool_span(turn, call_id, name)
        if status != "completed":
            self._error(span, "tool_error", error)
        span.end()

    def upstream_error(self, turn_id: str, kind: str) -> None:
        pass  # the model call's span carries it (model_call_ended)

    def events_committed(self, count: int, seconds: float) -> None:
        pass  # a metric, not a span: a commit serves many turns

    def store_waited(self, turn_id: str, seconds: float) -> None:
        pass  # a metric: many short waits per turn while the store is behind

    def close(self) -> None:
        """End what is open and export everything still queued (blocking: run it in a thread)."""
        for turn_id in list(self._turns):
            self.turn_ended(turn_id, "running")
        self.provider.shutdown()
