# -*- test-case-name: tests.selection.test_predict -*-
"""Predicted time to an answer's last token, per candidate (docs/behaviour.md §15.2).

:func:`request_size` reads what the prediction needs from the request's parsed document (the one
parse of §14.1, never the body again): the prompt's tokens estimated from its text at the model's
learnt bytes per token (:data:`BYTES_PER_TOKEN` until learnt, §15.1; each image at
:data:`IMAGE_TOKENS`), the text's size itself (what the engine's stated prompt tokens teach the
ratio from), the tokens of its last message (what a warm prefix leaves uncached, §5.3) and the
completion limit the client set.

:func:`predict` adds, for one node: the wait for a slot (0 with a free one, else the predicted work
still in flight there divided by its slots), the load time when the model is known not to be
resident, the uncached prompt over the prefill rate, and the expected completion over the share of
the decode throughput the request will get.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from attrs import frozen

from nvpair_tw.selection._speed import PRIOR_BYTES_PER_TOKEN, Rates, SpeedBook

__all__ = [
    "BYTES_PER_TOKEN",
    "IMAGE_TOKENS",
    "Load",
    "RequestSize",
    "predict",
    "predict_all",
    "request_size",
]

BYTES_PER_TOKEN = PRIOR_BYTES_PER_TOKEN
IMAGE_TOKENS = 768
MAX_MESSAGES = 2048
"""Messages walked to estimate a prompt; a longer conversation is estimated from its body size."""
EXPLORE = 0.999
"""An unmeasured node's prediction is this much below the median it is given, so a tie with the
node that set the median goes to the unmeasured one (else a new node would never be measured)."""
REFRESH_WITHIN = 2.0
"""A stale estimate is refreshed by a request predicted there within this factor of the best."""
_LIMIT_NAMES = ("max_tokens", "max_completion_tokens", "max_output_tokens", "n_predict")
_TEXT_NAMES = ("prompt", "system", "system_prompt", "instructions", "input", "suffix")


@frozen
class RequestSize:
    """A request's estimated prompt tokens, the tokens of its last message, and its limit on
    completion tokens (None: the client set none)."""

    prompt_tokens: int = 0
    tail_tokens: int = 0
    max_tokens: int | None = None
    num_ctx: int | None = None
    """The context an Ollama request asks for itself (``options.num_ctx``), or None."""
    prompt_bytes: int | None = None
    """The prompt's text as measured (the length of its parsed strings), what the engine's stated
    prompt tokens teach the model's bytes per token from (§15.1); None when the prompt holds
    images, points to earlier turns (``previous_response_id``, ``context``) or was estimated
    from the body's size."""

    @property
    def needed(self) -> int:
        """The context the request needs: its prompt and its completion limit (§15.3)."""
        return self.prompt_tokens + (self.max_tokens or 0)


@frozen
class Load:
    """A node's state as the prediction sees it: requests in flight there, its slots (0 =
    unlimited), the predicted seconds of work still in flight, and the model's residency (None:
    unknown)."""

    in_flight: int = 0
    slots: int = 0
    remaining: float = 0.0
    resident: bool | None = None


def _text_bytes(value: Any) -> tuple[int, int]:
    """(text bytes, images) in a message content, prompt or input value."""
    if isinstance(value, str):
        return len(value), 0
    if isinstance(value, list):
        size = images = 0
        for part in value:
            if isinstance(part, dict):
                kind = part.get("type")
                if isinstance(kind, str) and ("image" in kind):
                    images += 1
                    continue
                part = part.get("text", part.get("content", part.get("output")))
            more, pictures = _text_bytes(part)
            size, images = size + more, images + pictures
        return size, images
    return 0, 0


def _message_text(message: Any) -> tuple[int, int]:
    """(text bytes, images) of one message."""
    if not isinstance(message, dict):
        return 0, 0
    size, images = _text_bytes(message.get("content"))
    pictures = message.get("images")
    if isinstance(pictures, list):
        images += len(pictures)
    return size, images


def _positive(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _limit(doc: Mapping[str, Any]) -> int | None:
    for name in _LIMIT_NAMES:
        given = doc.get(name)
        value = None if given is None else _positive(given)  # most requests set none
        if value is not None:
            return value
    options = doc.get("options")
    return _positive(options.get("num_predict")) if isinstance(options, dict) else None


def request_size(
    doc: Mapping[str, Any] | None, body_size: int = 0, bytes_per_token: float | None = None
) -> RequestSize:
    """What :func:`predict` needs of a request, from its parsed document (None: nothing known),
    its text counted at ``bytes_per_token`` (the model's learnt ratio, §15.1; None: not learnt,
    :data:`BYTES_PER_TOKEN`).

    A conversation of more than :data:`MAX_MESSAGES` messages is not walked on the reactor: its
    prompt is ``body_size`` (the body's bytes) at ``bytes_per_token``, none of it cached."""
    if doc is None:
        return RequestSize()
    ratio = bytes_per_token if bytes_per_token and bytes_per_token > 0 else BYTES_PER_TOKEN
    messages = doc.get("messages")
    if isinstance(messages, list) and len(messages) > MAX_MESSAGES:
        whole = int(body_size / ratio)
        return RequestSize(whole, whole, _limit(doc))
    text = images = tail = 0
    if isinstance(messages, list):
        for message in messages:
            size, pictures = _message_text(message)
            text, images = text + size, images + pictures
            tail = int(size / ratio) + pictures * IMAGE_TOKENS
    for name in _TEXT_NAMES:
        value = doc.get(name)
        if value is not None:  # a chat sets none of them
            size, pictures = _text_bytes(value)
            text, images = text + size, images + pictures
    attached = doc.get("images")
    if isinstance(attached, list):
        images += len(attached)
    tokens = int(text / ratio) + images * IMAGE_TOKENS
    if not isinstance(messages, list):
        tail = _input_tail(doc.get("input"), ratio, tokens)
    options = doc.get("options")
    asked = _positive(options.get("num_ctx")) if isinstance(options, dict) else None
    measured = text if images == 0 and not _carries_earlier(doc) else None
    return RequestSize(tokens, min(tail, tokens), _limit(doc), asked, measured)


def _input_tail(given: Any, ratio: float, tokens: int) -> int:
    """The tokens of a request's new message when it has no ``messages``: the last Responses input
    item (a tool's result: its output), a string input (Responses, LM Studio's ``/api/v1/chat``);
    a completion's prompt (no input) has no known cached prefix: all of it counts."""
    if isinstance(given, list) and given:
        given = given[-1]
        if isinstance(given, dict) and "output" in given:
            given = given["output"]
        given = [given]
    elif not isinstance(given, str):
        return tokens
    size, pictures = _text_bytes(given)
    return int(size / ratio) + pictures * IMAGE_TOKENS


def _carries_earlier(doc: Mapping[str, Any]) -> bool:
    """Whether the request points to earlier turns the engine counts but its text does not hold
    (the Responses API's ``previous_response_id``, Ollama's ``context`` tokens)."""
    return bool(doc.get("previous_response_id")) or bool(doc.get("context"))


def expected_completion(size: RequestSize, mean: float) -> float:
    """The completion tokens to expect: the client's limit when below the model's mean, else the
    mean (§15.2)."""
    return (
        float(size.max_tokens) if size.max_tokens is not None and size.max_tokens < mean else mean
    )


def slot_wait(load: Load) -> float:
    """The predicted wait for a slot: 0 with one free, else the work in flight over the slots."""
    full = load.slots > 0 and load.in_flight >= load.slots
    return load.remaining / load.slots if full else 0.0


def predict(rates: Rates, load: Load, prompt_tokens: int, completion: float) -> float:
    """Seconds from dispatch on this node to the answer's last token.

    ``prompt_tokens`` are those not cached there (all of them, or only the last message's on the
    node holding the request's prefix, §5.3); ``completion`` is :func:`expected_completion`.
    """
    full = load.slots > 0 and load.in_flight >= load.slots
    wait = slot_wait(load)
    sharing = load.slots if full else load.in_flight + 1
    cold = rates.load if load.resident is False else 0.0
    return wait + cold + prompt_tokens / rates.prefill + completion * sharing / rates.decode


def predict_all(
    nodes: Sequence[str],
    model: str,
    size: RequestSize,
    speeds: SpeedBook,
    loads: Callable[[str], Load],
    warm: str | None,
) -> dict[str, float]:
    """Each node's predicted seconds to the last token (§15.2).

    Exploration: an unmeasured node, predicted at the fleet's median, wins a tie with a measured
    one (:data:`EXPLORE`), so it is measured; a node whose estimate is stale and whose
    prediction is within :data:`REFRESH_WITHIN` of the best is predicted just ahead of it, once
    per staleness period, so the estimate is refreshed.
    """
    completion = expected_completion(size, speeds.completion_mean(model))
    predicted = {}
    for node_id in nodes:
        prompt = size.tail_tokens if node_id == warm else size.prompt_tokens
        rates = speeds.rates(node_id, model)
        seconds = predict(rates, loads(node_id), prompt, completion)
        predicted[node_id] = seconds if rates.measured else seconds * EXPLORE
    if len(predicted) < 2:
        return predicted
    best = min(predicted.values())
    for node_id, seconds in predicted.items():
        if seconds > best and seconds <= best * REFRESH_WITHIN and speeds.stale(node_id, model):
            predicted[node_id] = best * 0.999
            speeds.refreshing(node_id, model)
            break
    return predicted
