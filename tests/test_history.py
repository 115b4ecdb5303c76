"""A chat's history, whichever way the client sends it (docs/history.md).

The oracle of every test is the exact list of messages the scripted upstream
received: each earlier message exactly once, in order, with the tool calls and
results of server tools expanded once. Two client styles are driven through the
official ``openai`` SDK: ``new`` sends only its new messages with the
``chat_id``; ``full`` keeps the conversation itself, as an OpenAI SDK app does
(each assistant message as it received it: the final text, never the calls of
server tools), and sends all of it every time.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from tests.harness import Service, make_settings, start_service, stop_service
from tests.tools_fixtures import write_tools
from tests.upstream import Reply, ScriptedUpstream

QUIET = {"title": False, "tags": False, "follow_ups": False}  # no task-model calls in the upstream's log
LOOKUP = {
    "type": "function",
    "function": {"name": "client_lookup", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}},
}
ADD_CALL = {"id": "sv1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
LOOKUP_CALL = {"id": "cl1", "type": "function", "function": {"name": "client_lookup", "arguments": '{"q": "x"}'}}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def add_round() -> list[dict[str, Any]]:
    """The server tool round ``add(1, 2)`` as the model must see it again."""
    return [
        {"role": "assistant", "content": "", "tool_calls": [ADD_CALL]},
        {"role": "tool", "tool_call_id": "sv1", "content": "3"},
    ]


def calls(*specs: dict[str, Any]) -> Reply:
    return Reply(
        tool_calls=[{"id": s["id"], "name": s["function"]["name"], "arguments": s["function"]["arguments"]} for s in specs],
        finish_reason="tool_calls",
    )


@pytest.fixture
async def svc(tmp_path: Path, upstream: ScriptedUpstream, database_url: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Service]:
    monkeypatch.setenv("TURNLOG_TEST_TOOL_LOG", str(tmp_path / "tool.log"))
    tools = write_tools(tmp_path / "tools")
    settings = make_settings(tmp_path, upstream.url, tools_dir=str(tools), tool_timeout=5.0, database_url=database_url)
    service = await start_service(settings, upstream)
    try:
        yield service
    finally:
        await stop_service(service)


class Client:
    """An OpenAI SDK app on one chat. ``kept`` is its own copy of the conversation:
    what it sent and each assistant message exactly as it received it."""

    def __init__(self, service: Service, style: str, chat_id: str, **extra: Any) -> None:
        self.sdk = openai.AsyncOpenAI(base_url=service.v1, api_key="x", max_retries=0)
        self.style = style
        self.extra = {"chat_id": chat_id, "background_tasks": QUIET, **extra}
        self.kept: list[dict[str, Any]] = []

    async def send(self, *new: dict[str, Any], **kw: Any) -> Any:
        messages: list[Any] = [*self.kept, *new] if self.style == "full" else list(new)
        completion = await self.sdk.chat.completions.create(model="gpt-test", messages=messages, extra_body=self.extra, **kw)
        self.kept = [*self.kept, *new, completion.choices[0].message.model_dump(exclude_none=True)]
        return completion

    async def close(self) -> None:
        await self.sdk.close()


def sent(service: Service) -> list[list[dict[str, Any]]]:
    return [r["messages"] for r in service.upstream.requests]


@pytest.mark.parametrize("style", ["new", "full"])
async def test_plain_three_turns(svc: Service, style: str) -> None:
    svc.upstream.enqueue(Reply(text="A1"), Reply(text="A2"), Reply(text="A3"))
    client = Client(svc, style, f"plain-{style}")
    for question in ("Q1", "Q2", "Q3"):
        await client.send(user(question))
    await client.close()
    assert sent(svc) == [
        [user("Q1")],
        [user("Q1"), assistant("A1"), user("Q2")],
        [user("Q1"), assistant("A1"), user("Q2"), assistant("A2"), user("Q3")],
    ]


@pytest.mark.parametrize("style", ["new", "full"])
async def test_server_tool_turn_is_expanded_once(svc: Service, style: str) -> None:
    svc.upstream.enqueue(calls(ADD_CALL), Reply(text="It is 3."), Reply(text="7"), Reply(text="Bye"))
    client = Client(svc, style, f"server-{style}", tool_ids=["weather"])
    first = await client.send(user("1+2?"))
    assert first.choices[0].message.content == "It is 3."
    await client.send(user("Plus 4?"))
    await client.send(user("Thanks"))
    await client.close()
    first_turn = [user("1+2?"), *add_round(), assistant("It is 3.")]
    assert sent(svc) == [
        [user("1+2?")],
        [user("1+2?"), *add_round()],
        [*first_turn, user("Plus 4?")],
        [*first_turn, user("Plus 4?"), assistant("7"), user("Thanks")],
    ]
    assert all("history" not in r and "chat_id" not in r for r in svc.upstream.requests)


@pytest.mark.parametrize("style", ["new", "full"])
async def test_mixed_server_and_client_tool_turn(svc: Service, style: str) -> None:
    """One response calls a client tool and a server tool: the server one runs,
    the client gets only its own call and answers it with a ``tool`` message."""
    svc.upstream.enqueue(calls(LOOKUP_CALL, ADD_CALL), Reply(text="Thanks, 42."), Reply(text="Done."))
    client = Client(svc, style, f"mixed-{style}", tool_ids=["weather"])
    first = await client.send(user("Look it up"), tools=[LOOKUP])
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert [c.id for c in choice.message.tool_calls or []] == ["cl1"]
    second = await client.send({"role": "tool", "tool_call_id": "cl1", "content": "42"}, tools=[LOOKUP])
    assert second.choices[0].message.content == "Thanks, 42."
    await client.send(user("Next"), tools=[LOOKUP])
    await client.close()
    answered = [
        user("Look it up"),
        {"role": "assistant", "content": "", "tool_calls": [LOOKUP_CALL, ADD_CALL]},
        {"role": "tool", "tool_call_id": "sv1", "content": "3"},
        {"role": "tool", "tool_call_id": "cl1", "content": "42"},
    ]
    assert sent(svc) == [
        [user("Look it up")],
        answered,
        [*answered, assistant("Thanks, 42."), user("Next")],
    ]


async def test_whitespace_drift_in_a_resent_answer(svc: Service) -> None:
    """A client that trims or re-wraps the answer it shows still resends the same message."""
    svc.upstream.enqueue(Reply(text="Line one.\nLine two."), Reply(text="A2"), Reply(text="A3"))
    sdk = openai.AsyncOpenAI(base_url=svc.v1, api_key="x", max_retries=0)
    extra = {"chat_id": "drift", "background_tasks": QUIET}
    first: list[Any] = [user("Q1")]
    await sdk.chat.completions.create(model="gpt-test", messages=first, extra_body=extra)
    drifted: list[Any] = [user("Q1 "), assistant("Line one.\n\nLine two. \n"), user("Q2")]
    await sdk.chat.completions.create(model="gpt-test", messages=drifted, extra_body=extra)
    again: list[Any] = [*drifted, assistant(" A2\n"), user("Q3")]
    await sdk.chat.completions.create(model="gpt-test", messages=again, extra_body=extra)
    await sdk.close()
    first = [user("Q1"), assistant("Line one.\nLine two.")]
    assert sent(svc) == [
        [user("Q1")],
        [*first, user("Q2")],
        [*first, user("Q2"), assistant("A2"), user("Q3")],
    ]


async def test_partial_resend_of_the_last_messages(svc: Service) -> None:
    """A client that keeps only a window of the conversation (here after a server-tool turn)."""
    svc.upstream.enqueue(Reply(text="A1"), calls(ADD_CALL), Reply(text="It is 3."), Reply(text="A3"), Reply(text="A4"))
    client = Client(svc, "full", "partial", tool_ids=["weather"])
    await client.send(user("Q1"))
    await client.send(user("1+2?"))
    client.kept = client.kept[-2:]  # the question and the answer it saw
    await client.send(user("Q3"))
    client.kept = client.kept[-1:]  # only the last answer
    await client.send(user("Q4"))
    await client.close()
    conversation = [user("Q1"), assistant("A1"), user("1+2?"), *add_round(), assistant("It is 3."), user("Q3")]
    assert sent(svc)[3:] == [conversation, [*conversation, assistant("A3"), user("Q4")]]


async def test_client_history_edits_and_regenerates(svc: Service) -> None:
    """``"history": "client"``: an edited earlier message and a regenerated
    answer; the chat then continues from the client's version, sent in full or not."""
    svc.upstream.enqueue(calls(ADD_CALL), Reply(text="It is 3."), Reply(text="Paris."), Reply(text="Rome."), Reply(text="Yes."), Reply(text="Ok."))

    async def post(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        body = {"model": "gpt-test", "messages": messages, "chat_id": "edit", "background_tasks": QUIET, "tool_ids": ["weather"], **extra}
        status, data, _ = await svc.post("/v1/chat/completions", body)
        assert status == 200, data
        return data

    await post([user("1+2?")])
    await post([user("Capital of France?")])
    edited = [user("1+2?"), assistant("It is 3."), user("Capital of Italy?")]
    regenerated = await post(edited, history="client")
    assert regenerated["choices"][0]["message"]["content"] == "Rome."
    await post([*edited, assistant("Rome."), user("Sure?")])  # the whole conversation, as the client keeps it
    await post([user("Thanks")])  # or only the new message
    first_turn = [user("1+2?"), *add_round(), assistant("It is 3.")]
    branch = [*first_turn, user("Capital of Italy?")]
    assert sent(svc)[3:] == [
        branch,
        [*branch, assistant("Rome."), user("Sure?")],
        [*branch, assistant("Rome."), user("Sure?"), assistant("Yes."), user("Thanks")],
    ]
    assert all("history" not in r for r in svc.upstream.requests)
    status, chat = await svc.get("/v1/chats/edit")
    assert status == 200
    shown = [(m["role"], m["content"]) for m in chat["messages"]]
    assert shown == [
        ("user", "1+2?"),
        ("assistant", "It is 3."),
        ("user", "Capital of Italy?"),
        ("assistant", "Rome."),
        ("user", "Sure?"),
        ("assistant", "Yes."),
        ("user", "Thanks"),
        ("assistant", "Ok."),
    ]


async def test_history_must_be_client_or_server(svc: Service) -> None:
    body = {"model": "gpt-test", "messages": [user("x")], "history": "both"}
    status, data, _ = await svc.post("/v1/chat/completions", body)
    assert status == 400 and data["error"]["param"] == "history"
    assert svc.upstream.requests == []


async def test_scripted_upstream_rejects_unanswered_tool_calls(upstream: ScriptedUpstream) -> None:
    """The 400s the Chat Completions API gives a transcript with broken tool-call bookkeeping."""
    upstream.enqueue(Reply(text="kept"))
    call = {"role": "assistant", "content": None, "tool_calls": [LOOKUP_CALL, ADD_CALL]}
    cases = [
        (
            [user("q"), call, {"role": "tool", "tool_call_id": "sv1", "content": "3"}, user("again")],
            "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
            "'tool_call_id'. The following tool_call_ids did not have response messages: cl1",
            "messages.[1].role",
        ),
        (
            [user("q"), {"role": "tool", "tool_call_id": "cl1", "content": "42"}],
            "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'.",
            "messages.[1].role",
        ),
        (
            [user("q"), call, {"role": "tool", "tool_call_id": "zz", "content": "42"}],
            "Invalid parameter: 'tool_call_id' of 'zz' not found in 'tool_calls' of previous message.",
            "messages.[2].tool_call_id",
        ),
    ]
    async with aiohttp.ClientSession() as http:
        for messages, message, param in cases:
            async with http.post(f"{upstream.url}/chat/completions", json={"model": "gpt-test", "messages": messages}) as resp:
                assert resp.status == 400
                assert await resp.json() == {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": None}}
        assert upstream.pending == 1  # no scripted reply was used up
        ok = [user("q"), call, {"role": "tool", "tool_call_id": "sv1", "content": "3"}, {"role": "tool", "tool_call_id": "cl1", "content": "42"}]
        async with http.post(f"{upstream.url}/chat/completions", json={"model": "gpt-test", "messages": ok}) as resp:
            assert resp.status == 200
            assert (await resp.json())["choices"][0]["message"]["content"] == "kept"
