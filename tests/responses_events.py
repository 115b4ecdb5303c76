"""A realistic Responses API stream (the shape of OpenAI's streaming events):
a message streamed in deltas, then a function call, then response.completed
with usage. Shared by the normalizer tests and the end-to-end transport tests."""

from __future__ import annotations

from typing import Any

from engine.json_types import JsonObject

FC_ITEM_DONE = {
    "type": "function_call",
    "id": "fc_68a1",
    "call_id": "call_Kx1",
    "name": "get_weather",
    "arguments": '{"city":"Paris"}',
    "status": "completed",
}
MSG_ITEM_DONE: dict[str, Any] = {
    "type": "message",
    "id": "msg_68a0",
    "status": "completed",
    "role": "assistant",
    "content": [{"type": "output_text", "text": "Let me check the weather.", "annotations": [], "logprobs": []}],
}
USAGE: JsonObject = {
    "input_tokens": 61,
    "input_tokens_details": {"cached_tokens": 0},
    "output_tokens": 24,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 85,
}

FULL_STREAM: list[dict[str, Any]] = [
    {
        "type": "response.created",
        "sequence_number": 0,
        "response": {"id": "resp_68a", "object": "response", "status": "in_progress", "output": [], "usage": None},
    },
    {
        "type": "response.in_progress",
        "sequence_number": 1,
        "response": {"id": "resp_68a", "object": "response", "status": "in_progress", "output": []},
    },
    {
        "type": "response.output_item.added",
        "sequence_number": 2,
        "output_index": 0,
        "item": {"type": "message", "id": "msg_68a0", "status": "in_progress", "role": "assistant", "content": []},
    },
    {
        "type": "response.content_part.added",
        "sequence_number": 3,
        "item_id": "msg_68a0",
        "output_index": 0,
        "content_index": 0,
        "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []},
    },
    *[
        {
            "type": "response.output_text.delta",
            "sequence_number": 4 + n,
            "item_id": "msg_68a0",
            "output_index": 0,
            "content_index": 0,
            "delta": delta,
            "logprobs": [],
        }
        for n, delta in enumerate(["Let", " me", " check", " the", " weather", "."])
    ],
    {
        "type": "response.output_text.done",
        "sequence_number": 10,
        "item_id": "msg_68a0",
        "output_index": 0,
        "content_index": 0,
        "text": "Let me check the weather.",
        "logprobs": [],
    },
    {
        "type": "response.content_part.done",
        "sequence_number": 11,
        "item_id": "msg_68a0",
        "output_index": 0,
        "content_index": 0,
        "part": {"type": "output_text", "text": "Let me check the weather.", "annotations": [], "logprobs": []},
    },
    {"type": "response.output_item.done", "sequence_number": 12, "output_index": 0, "item": MSG_ITEM_DONE},
    {
        "type": "response.output_item.added",
        "sequence_number": 13,
        "output_index": 1,
        "item": {
            "type": "function_call",
            "id": "fc_68a1",
            "call_id": "call_Kx1",
            "name": "get_weather",
            "arguments": "",
            "status": "in_progress",
        },
    },
    *[
        {
            "type": "response.function_call_arguments.delta",
            "sequence_number": 14 + n,
            "item_id": "fc_68a1",
            "output_index": 1,
            "delta": delta,
        }
        for n, delta in enumerate(['{"', "city", '":"', "Paris", '"}'])
    ],
    {
        "type": "response.function_call_arguments.done",
        "sequence_number": 19,
        "item_id": "fc_68a1",
        "output_index": 1,
        "arguments": '{"city":"Paris"}',
    },
    {"type": "response.output_item.done", "sequence_number": 20, "output_index": 1, "item": FC_ITEM_DONE},
    {
        "type": "response.completed",
        "sequence_number": 21,
        "response": {
            "id": "resp_68a",
            "object": "response",
            "status": "completed",
            "output": [MSG_ITEM_DONE, FC_ITEM_DONE],
            "usage": USAGE,
        },
    },
]
