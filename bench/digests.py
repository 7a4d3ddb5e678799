"""The conversation digests' cost per MiB of body, a git ref against the working tree, in one process.

``python bench/digests.py [--base REF] [--rounds N]`` loads ``nvpair_tw/selection/_affinity.py``
as it is at ``REF`` (default ``main``) and as it is in the working tree, and times
``affinity_key`` on conversations of the sizes coding agents send, in alternating rounds on the
same thread: the CPU time of the thread (not wall time), best of ``--rounds``. Each body is
reported in milliseconds per MiB of its JSON (docs/affinity.md, "Size bound", reads its bound
from these figures):

- an agent's turn: a 24 KiB system prompt, 12 tools, and turns of a question, a tool call and a
  tool result of 4 KiB, as chat completions (both versions), Anthropic Messages and Responses
  input items (the working tree; the base gives those no digest);
- many small messages (2,048 of a few words): the cost per atom;
- one long message (a 4 MiB string): the cost per byte of text (the working tree stops before a
  string past its bound, docs/affinity.md "Size bound": it gives no chain).

The base is only timed on the chat completions shape it knows; the 4 MiB turn is digested whole
there, to the bound here. docs/performance.md, "Conversation digests", holds a run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.hotpaths import versions  # noqa: E402

MIB = 1 << 20
SYSTEM = ("You are a coding agent. Read the files, run the tests, keep the diff small. " * 330)[
    : 24 << 10
]
TOOLS = [
    {
        "name": f"tool_{i}",
        "description": f"Tool number {i}: reads or writes part of the workspace. " * 4,
        "schema": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}},
            "required": ["path"],
        },
    }
    for i in range(12)
]
RESULT = ("    def method(self, value):\n        return self.table.get(value, None)\n" * 60)[
    : 4 << 10
]


def chat(turns: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for i in range(turns):
        arguments = json.dumps({"path": f"src/module_{i}.py", "limit": 200})
        messages += [
            {"role": "user", "content": f"Step {i}: look at module {i} and fix its bug."},
            {
                "role": "assistant",
                "content": f"Reading module {i}.",
                "tool_calls": [
                    {
                        "id": f"call_{i}",
                        "type": "function",
                        "function": {"name": "tool_1", "arguments": arguments},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": f"call_{i}", "content": RESULT},
        ]
    tools = [
        {
            "type": "function",
            "function": {
                "name": t["name"],
                "description": t["description"],
                "parameters": t["schema"],
            },
        }
        for t in TOOLS
    ]
    return {"model": "qwen3", "stream": True, "tools": tools, "messages": messages}


def messages(turns: int) -> dict[str, Any]:
    out: list[dict[str, Any]] = []
    for i in range(turns):
        text = {"type": "text", "text": f"Step {i}: look at module {i} and fix its bug."}
        result = {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": RESULT}
        out += [
            {"role": "user", "content": [result, text] if i else [text]},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": f"Reading module {i}."},
                    {
                        "type": "tool_use",
                        "id": f"toolu_{i}",
                        "name": "tool_1",
                        "input": {"path": f"src/module_{i}.py", "limit": 200},
                    },
                ],
            },
        ]
    system = [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.37; cch=1f2e3;"},
        {"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}},
    ]
    tools = [
        {"name": t["name"], "description": t["description"], "input_schema": t["schema"]}
        for t in TOOLS
    ]
    return {"model": "qwen3", "max_tokens": 4096, "system": system, "tools": tools, "messages": out}


def responses(turns: int) -> dict[str, Any]:
    items: list[dict[str, Any]] = []
    for i in range(turns):
        items += [
            {"role": "user", "content": f"Step {i}: look at module {i} and fix its bug."},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": f"Reading module {i}."}],
            },
            {
                "type": "function_call",
                "call_id": f"call_{i}",
                "name": "tool_1",
                "arguments": json.dumps({"path": f"src/module_{i}.py", "limit": 200}),
            },
            {"type": "function_call_output", "call_id": f"call_{i}", "output": RESULT},
        ]
    tools = [
        {
            "type": "function",
            "name": t["name"],
            "description": t["description"],
            "parameters": t["schema"],
        }
        for t in TOOLS
    ]
    return {"model": "qwen3", "instructions": SYSTEM, "tools": tools, "input": items}


def small(count: int) -> dict[str, Any]:
    said = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"ok {i}"} for i in range(count)
    ]
    return {"model": "qwen3", "messages": said}


def long_text(size: int) -> dict[str, Any]:
    return {"model": "qwen3", "messages": [{"role": "user", "content": "word " * (size // 5)}]}


CHAT = "/v1/chat/completions"
BODIES: list[tuple[str, str, dict[str, Any], bool]] = [
    ("agent turn, 250 KiB, chat completions", CHAT, chat(45), True),
    ("agent turn, 1 MiB, chat completions", CHAT, chat(210), True),
    ("agent turn, 1 MiB, Messages", "/v1/messages", messages(210), False),
    ("agent turn, 1 MiB, Responses", "/v1/responses", responses(210), False),
    ("agent turn, 4 MiB, chat completions", CHAT, chat(880), True),
    ("2,048 small messages", CHAT, small(2048), True),
    ("one 4 MiB message", CHAT, long_text(4 * MIB), True),
]


def cpu(step: Any) -> float:
    start = time.thread_time()
    step()
    return time.thread_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="main")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    old, new = versions(args.base, "nvpair_tw/selection/_affinity.py")
    print(f"thread CPU, best of {args.rounds} alternating rounds; ms per MiB of body (ms per call)")
    print(f"| body | size | {args.base} | working tree | new/old |")
    print("|---|---|---|---|---|")
    for label, path, body, both in BODIES:
        size = len(json.dumps(body).encode())
        times: dict[str, list[float]] = {"old": [], "new": []}
        for _ in range(args.rounds):
            if both:
                times["old"].append(cpu(partial(old.affinity_key, path, "qwen3", body)))
            times["new"].append(cpu(partial(new.affinity_key, path, "qwen3", body)))
        got = {k: min(v) * 1000 for k, v in times.items() if v}
        per = {k: v * MIB / size for k, v in got.items()}
        base = f"{per['old']:.2f} ({got['old']:.2f})" if "old" in got else "no digest"
        ratio = f"{per['new'] / per['old']:.2f}" if "old" in got else "—"
        print(
            f"| {label} | {size / MIB:.2f} MiB | {base} | {per['new']:.2f} ({got['new']:.2f}) | {ratio} |"
        )


if __name__ == "__main__":
    main()
