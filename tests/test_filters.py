"""The filter adapter (adapters.filters): Open WebUI-style ``class Filter`` modules,
written by each test into a tmp folder and loaded by path, run through the
``engine.ports.Filters`` port. Adapter-level only: the engine's use of the port
is tested where the engine calls it.
"""

from __future__ import annotations

import copy
import textwrap
from pathlib import Path
from typing import Any

import pytest

from adapters.config import load_settings
from adapters.filters import DirFilters, load_filters
from engine.ports import FilterError, FilterRun, NoFilters

USER = {"id": "u1", "name": "Ada"}


def write(folder: Path, name: str, source: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    return path


def chat_body(text: str = "hello") -> dict[str, Any]:
    return {"model": "gpt-test", "chat_id": "c1", "messages": [{"role": "user", "content": text}]}


def tracer(priority_source: str) -> str:
    """A filter that appends its id to ``body["trace"]`` (to observe the order)."""
    return priority_source + textwrap.dedent(
        """
            def inlet(self, body, __id__):
                body.setdefault("trace", []).append(__id__)
                return body
        """
    ).replace("\n", "\n    ")


# -- inlet ----------------------------------------------------------------------------


async def test_inlet_rewrites_messages_and_adds_a_param(tmp_path: Path) -> None:
    write(
        tmp_path,
        "rewrite",
        """
        class Filter:
            def inlet(self, body: dict, __user__: dict | None = None) -> dict:
                body["messages"] = [{"role": "system", "content": "Be brief."}] + [
                    {**m, "content": m["content"].upper()} for m in body["messages"]
                ]
                body["temperature"] = 0.2
                return body
        """,
    )
    filters = DirFilters(tmp_path)
    body = chat_body()
    original = copy.deepcopy(body)

    out, runs = await filters.inlet(body, USER)

    assert out["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "HELLO"}]
    assert out["temperature"] == 0.2
    assert runs == [FilterRun("rewrite", changed=True, file_handler=False)]
    assert body == original  # the caller's body is never edited
    assert filters.hooks() == frozenset({"inlet"})
    assert filters.errors == []


async def test_priority_then_id_order(tmp_path: Path) -> None:
    # Valves.priority (Open WebUI's), the class attribute as fallback, 0 by default; ties by id.
    write(
        tmp_path,
        "b_low",
        tracer(
            "from pydantic import BaseModel\nclass Filter:\n    class Valves(BaseModel):\n        priority: int = -1\n"
            "    def __init__(self):\n        self.valves = self.Valves()\n"
        ),
    )
    write(tmp_path, "a_attr", tracer("class Filter:\n    priority = 5\n"))
    write(tmp_path, "z_default", tracer("class Filter:\n    pass\n"))
    write(tmp_path, "c_default", tracer("class Filter:\n    pass\n"))
    write(tmp_path, "b_tie", tracer("class Filter:\n    priority = 5\n"))

    out, runs = await DirFilters(tmp_path).inlet(chat_body(), USER)

    order = ["b_low", "c_default", "z_default", "a_attr", "b_tie"]
    assert out["trace"] == order
    assert [run.filter for run in runs] == order


async def test_inlet_that_raises_fails_with_filter_error(tmp_path: Path) -> None:
    write(tmp_path, "a_ok", tracer("class Filter:\n    pass\n"))
    write(
        tmp_path,
        "b_guard",
        """
        class Filter:
            def inlet(self, body):
                raise ValueError("blocked word")
        """,
    )
    with pytest.raises(FilterError) as caught:
        await DirFilters(tmp_path).inlet(chat_body(), USER)
    assert caught.value.filter == "b_guard"
    assert caught.value.message == "ValueError: blocked word"
    assert str(caught.value) == "filter b_guard: ValueError: blocked word"


async def test_inlet_returning_something_else_than_a_dict_is_the_filters_error(tmp_path: Path) -> None:
    write(tmp_path, "texty", "class Filter:\n    def inlet(self, body):\n        return 'nope'\n")
    with pytest.raises(FilterError, match="texty: TypeError: inlet returned str, not the body dict"):
        await DirFilters(tmp_path).inlet(chat_body(), USER)


async def test_sync_and_async_hooks(tmp_path: Path) -> None:
    write(
        tmp_path,
        "a_async",
        """
        import asyncio

        class Filter:
            async def inlet(self, body):
                await asyncio.sleep(0)
                body["via"] = body.get("via", []) + ["async inlet"]
                return body

            async def outlet(self, body):
                await asyncio.sleep(0)
                body["messages"][-1]["content"] += " [async]"
                return body
        """,
    )
    write(
        tmp_path,
        "b_sync",
        """
        class Filter:
            def inlet(self, body):
                body["via"] = body.get("via", []) + ["sync inlet"]
                return body

            def outlet(self, body):
                body["messages"][-1]["content"] += " [sync]"
                return body
        """,
    )
    filters = DirFilters(tmp_path)
    body, _ = await filters.inlet(chat_body(), USER)
    assert body["via"] == ["async inlet", "sync inlet"]
    done = {**chat_body(), "messages": [{"role": "assistant", "content": "hi"}]}
    out, runs = await filters.outlet(done, USER)
    assert out["messages"][-1]["content"] == "hi [async] [sync]"
    assert runs == [FilterRun("a_async", changed=True), FilterRun("b_sync", changed=True)]


async def test_reserved_parameters_are_injected(tmp_path: Path) -> None:
    write(
        tmp_path,
        "who",
        """
        from pydantic import BaseModel

        class Filter:
            class UserValves(BaseModel):
                shout: bool = False

            def inlet(self, body, __user__=None, __id__=None, __metadata__=None, __model__=None,
                      __chat_id__=None, __event_emitter__="unset", __request__="unset"):
                body["seen"] = {
                    "user": {k: v for k, v in __user__.items() if k != "valves"},
                    "shout": __user__["valves"].shout,
                    "id": __id__,
                    "metadata": __metadata__,
                    "model": __model__,
                    "chat_id": __chat_id__,
                    "emitter": __event_emitter__,
                    "request": __request__,
                }
                __user__["name"] = "mallory"  # must not leak into the caller's user
                return body
        """,
    )
    user = dict(USER)
    out, _ = await DirFilters(tmp_path).inlet(chat_body(), user)
    assert out["seen"] == {
        "user": {"id": "u1", "name": "Ada"},
        "shout": False,
        "id": "who",
        "metadata": {"user_id": "u1", "chat_id": "c1", "model": "gpt-test"},
        "model": {"id": "gpt-test"},
        "chat_id": "c1",
        "emitter": None,
        "request": None,
    }
    assert user == USER


async def test_returning_none_keeps_the_body_as_the_hook_left_it(tmp_path: Path) -> None:
    write(tmp_path, "a_noop", "class Filter:\n    def inlet(self, body):\n        return None\n")
    write(tmp_path, "b_in_place", "class Filter:\n    def inlet(self, body):\n        body['seed'] = 7\n")

    out, runs = await DirFilters(tmp_path).inlet(chat_body(), USER)

    assert out == {**chat_body(), "seed": 7}
    assert [(run.filter, run.changed) for run in runs] == [("a_noop", False), ("b_in_place", True)]


async def test_file_handler_is_reported_on_the_inlet_run(tmp_path: Path) -> None:
    write(tmp_path, "files", "class Filter:\n    file_handler = True\n    def inlet(self, body):\n        return body\n")
    body = {**chat_body(), "files": [{"type": "file", "id": "f1"}]}
    out, runs = await DirFilters(tmp_path).inlet(body, USER)
    assert runs == [FilterRun("files", changed=False, file_handler=True)]
    assert out["files"] == [{"type": "file", "id": "f1"}]  # dropping them is the engine's part


# -- stream -------------------------------------------------------------------------------


def test_stream_changes_the_text_of_a_delta(tmp_path: Path) -> None:
    write(
        tmp_path,
        "a_upper",
        """
        class Filter:
            def stream(self, event):
                if event.get("kind") == "content":
                    event["content"] = event["content"].upper()
                return event
        """,
    )
    write(tmp_path, "b_reader", "class Filter:\n    def stream(self, event):\n        return event\n")
    filters = DirFilters(tmp_path)
    assert filters.hooks() == frozenset({"stream"})
    event = {"type": "delta", "kind": "content", "content": "hello"}

    out, runs = filters.stream(event)

    assert out == {"type": "delta", "kind": "content", "content": "HELLO"}
    assert runs == [FilterRun("a_upper", changed=True), FilterRun("b_reader", changed=False)]
    assert event["content"] == "hello"


def test_stream_filter_that_raises_is_skipped(tmp_path: Path) -> None:
    write(
        tmp_path,
        "a_broken",
        """
        class Filter:
            def stream(self, event):
                event["content"] = "half-edited"
                raise RuntimeError("oops")
        """,
    )
    write(tmp_path, "b_suffix", "class Filter:\n    def stream(self, event):\n        event['content'] += '!'\n        return event\n")

    out, runs = DirFilters(tmp_path).stream({"type": "delta", "kind": "content", "content": "hi"})

    assert out["content"] == "hi!"  # a_broken's partial edit is dropped with it
    assert runs == [FilterRun("a_broken", error="RuntimeError: oops"), FilterRun("b_suffix", changed=True)]


def test_async_stream_is_rejected_at_load(tmp_path: Path) -> None:
    write(tmp_path, "slow", "class Filter:\n    async def stream(self, event):\n        return event\n")
    write(tmp_path, "fine", "class Filter:\n    def stream(self, event):\n        return event\n")
    filters = DirFilters(tmp_path)
    assert [f.filter_id for f in filters.filters] == ["fine"]
    assert len(filters.errors) == 1
    assert filters.errors[0].path.endswith("slow.py")
    assert "Filter.stream is async" in filters.errors[0].message and "synchronous" in filters.errors[0].message


# -- outlet ---------------------------------------------------------------------------------


async def test_outlet_rewrites_the_assistant_message(tmp_path: Path) -> None:
    write(
        tmp_path,
        "signature",
        """
        class Filter:
            def outlet(self, body, __user__=None):
                last = body["messages"][-1]
                last["content"] = last["content"].replace("secret", "[redacted]") + f"\\n-- for {__user__['name']}"
                return body
        """,
    )
    done: dict[str, Any] = {
        "model": "gpt-test",
        "chat_id": "c1",
        "messages": [{"role": "user", "content": "tell me"}, {"role": "assistant", "content": "the secret is 42", "output": []}],
    }
    out, runs = await DirFilters(tmp_path).outlet(done, USER)
    assert out["messages"][-1] == {"role": "assistant", "content": "the [redacted] is 42\n-- for Ada", "output": []}
    assert runs == [FilterRun("signature", changed=True)]
    assert done["messages"][-1]["content"] == "the secret is 42"


async def test_outlet_filter_that_raises_is_skipped(tmp_path: Path) -> None:
    write(tmp_path, "a_raises", "class Filter:\n    async def outlet(self, body):\n        body['x'] = 1\n        raise KeyError('content')\n")
    write(tmp_path, "b_ok", "class Filter:\n    def outlet(self, body):\n        body['y'] = 2\n        return body\n")
    out, runs = await DirFilters(tmp_path).outlet(chat_body(), USER)
    assert out == {**chat_body(), "y": 2}
    assert runs == [FilterRun("a_raises", error="KeyError: 'content'"), FilterRun("b_ok", changed=True)]


# -- loading, valves, configuration -------------------------------------------------------


VALVED = """
from pydantic import BaseModel, Field

class Filter:
    class Valves(BaseModel):
        priority: int = 0
        prefix: str = Field(default="", description="prepended to the user's message")

    def __init__(self):
        self.valves = self.Valves()  # Open WebUI's idiom: replaced by the configured valves

    def inlet(self, body, __id__=None):
        body["messages"][-1]["content"] = self.valves.prefix + body["messages"][-1]["content"]
        body.setdefault("trace", []).append(__id__)
        return body
"""


def settings_file(tmp_path: Path, folder: Path, tables: str) -> Path:
    config = tmp_path / "turnlog.toml"
    config.write_text(f'filters_dir = "{folder}"\n\n' + textwrap.dedent(tables))
    return config


async def test_valves_come_from_the_toml_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TURNLOG_FILTERS_DIR", raising=False)
    folder = tmp_path / "filters"
    write(folder, "a_first", VALVED)
    write(folder, "b_second", VALVED)
    config = settings_file(
        tmp_path,
        folder,
        """
        [filters.a_first]
        priority = 10
        prefix = "A:"

        [filters.b_second]
        prefix = "B:"
        """,
    )
    filters = load_filters(load_settings(config))
    assert isinstance(filters, DirFilters) and filters.errors == []

    out, _ = await filters.inlet(chat_body("hi"), USER)

    assert out["trace"] == ["b_second", "a_first"]  # a_first's configured priority 10 puts it last
    assert out["messages"][-1]["content"] == "A:B:hi"


async def test_a_bad_valve_value_skips_that_filter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TURNLOG_FILTERS_DIR", raising=False)
    folder = tmp_path / "filters"
    write(folder, "bad", VALVED)
    write(folder, "good", VALVED)
    config = settings_file(
        tmp_path,
        folder,
        """
        [filters.bad]
        priority = "high"

        [filters.good]
        prefix = ">"

        [filters.gone]
        prefix = "?"
        """,
    )
    filters = load_filters(load_settings(config))
    assert isinstance(filters, DirFilters)
    assert [f.filter_id for f in filters.filters] == ["good"]
    messages = {e.path.rsplit("/", 1)[-1]: e.message for e in filters.errors}
    assert messages["bad.py"].startswith("invalid valves in [filters.bad]: priority: Input should be a valid integer")
    assert "(got 'high')" in messages["bad.py"]
    assert messages["[filters.gone]"] == f"no filter module gone.py in {folder}"

    out, runs = await filters.inlet(chat_body("hi"), USER)
    assert out["messages"][-1]["content"] == ">hi"
    assert [run.filter for run in runs] == ["good"]


async def test_a_module_that_does_not_import_is_reported_and_the_others_work(tmp_path: Path) -> None:
    write(tmp_path, "broken", "class Filter:\n    def inlet(self, body)\n        return body\n")
    write(tmp_path, "no_class", "x = 1\n")
    write(tmp_path, "asks_more", "class Filter:\n    def inlet(self, body, strictness):\n        return body\n")
    write(tmp_path, "fine", tracer("class Filter:\n    pass\n"))
    write(tmp_path, "_helper", "raise SystemExit('never imported')\n")

    filters = DirFilters(tmp_path)

    assert [f.filter_id for f in filters.filters] == ["fine"]
    messages = {Path(e.path).stem: e.message for e in filters.errors}
    assert set(messages) == {"broken", "no_class", "asks_more"}
    assert "SyntaxError" in messages["broken"]
    assert messages["no_class"] == "module defines no class Filter"
    assert messages["asks_more"] == "Filter.inlet requires parameter 'strictness', which turnlog does not provide"
    out, _ = await filters.inlet(chat_body(), USER)
    assert out["trace"] == ["fine"]


async def test_no_folder_means_no_filters(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TURNLOG_FILTERS_DIR", raising=False)
    assert isinstance(load_filters(load_settings()), NoFilters)
    missing = DirFilters(tmp_path / "nowhere")
    assert missing.hooks() == frozenset()
    assert [e.message for e in missing.errors] == ["filters directory does not exist"]
    body = chat_body()
    assert await missing.inlet(body, USER) == (body, [])
