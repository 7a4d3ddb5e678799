# -*- test-case-name: tests.selection.test_speed -*-
"""What the proxy learns of each machine's speed (docs/behaviour.md §15.1).

Per (node, public model): the **decode rate** (completion tokens/s), the **prefill rate** (prompt
tokens/s) and the **load time** (the extra time to first token of an answer that had to load the
model); per public model, the mean **completion length** and the **bytes per token** (the prompt
text the request measured over the prompt tokens the engine stated, :func:`bytes_per_token`). Each
is an exponentially weighted mean with a half-life of :data:`HALF_LIFE` answers; the first sample is
taken as it is.

A rate measured while other requests ran on the same node is not a single-stream rate: each
:class:`Sample` carries the mean number of requests in flight on the node over its life
(:mod:`nvpair_tw.selection._flights`), and the decode rate is kept as the node's *throughput*
(rate times that mean), which requests in flight share (docs/behaviour.md §15.2). A node's
``speed = X`` (nodes file) seeds its estimate until it has measurements.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterator
from enum import Enum

from attrs import define, field, frozen
from twisted.internet.interfaces import IReactorTime

__all__ = [
    "HALF_LIFE",
    "PRIOR_BYTES_PER_TOKEN",
    "RATIO_STEP",
    "STALE_AFTER",
    "Answer",
    "Rates",
    "Sample",
    "SpeedBook",
    "Start",
    "bytes_per_token",
    "sample_of",
]

HALF_LIFE = 20
"""Answers after which a sample's weight in an estimate has halved."""
ALPHA = 1.0 - 0.5 ** (1.0 / HALF_LIFE)
STALE_AFTER = 600.0
"""Seconds after which an estimate is refreshed by the next request that could use it (§15.2)."""

DEFAULT_DECODE = 20.0
"""Tokens/s assumed for a model no node has measured yet (scaled by a node's ``speed``)."""
DEFAULT_PREFILL = 400.0
"""Prompt tokens/s assumed before any measurement."""
DEFAULT_LOAD = 5.0
"""Seconds a cold load is assumed to take before any node measured one."""
DEFAULT_COMPLETION = 200.0
"""Completion tokens assumed for a model before any answer."""
MIN_PREFILL_TOKENS = 32
"""A prompt shorter than this says more of the round trip than of the prefill rate: not learnt.
Nor its bytes per token: the chat template's own tokens would weigh too much."""
PRIOR_BYTES_PER_TOKEN = 4
"""What a model's bytes per token starts from (the prediction's constant before any sample)."""
RATIO_STEP = 2.0
"""The most one sample of bytes per token counts for: within this factor of the learnt value."""
MIN_BYTES_PER_TOKEN = 1.0
MAX_BYTES_PER_TOKEN = 16.0
"""The range a model's bytes per token is learnt in: a ratio outside it says the stated count was
not of this prompt (a cached or truncated prompt's count), and is not learnt."""


@frozen
class Sample:
    """One answer's figures (None: not known for this answer).

    ``decode_rate`` is the answer's own completion tokens/s (the engine's figure where given),
    ``prefill_rate`` its prompt tokens/s (only for an answer whose prompt was not cached),
    ``load_seconds`` the load time of an answer that loaded the model, ``concurrency`` the mean
    requests in flight on the node over its life (itself included, so at least 1)."""

    decode_rate: float | None = None
    prefill_rate: float | None = None
    load_seconds: float | None = None
    completion_tokens: int | None = None
    concurrency: float = 1.0
    bytes_per_token: float | None = None
    """The request's prompt text bytes over the engine's stated prompt tokens (per model)."""


class Start(Enum):
    """How an answer started on its node: what its time to first token measured."""

    PLAIN = "plain"
    """The model was resident (or its residency unknown) and no prefix was cached: prefill."""
    LOADED = "loaded"
    """The model was known not to be resident: load, then prefill."""
    CACHED = "cached"
    """A warm prefix was counted (§5.3): the prefill measured is not the node's rate."""


@frozen
class Answer:
    """One answer's own figures: the engine's counts (None: unknown), clock times of dispatch,
    first content and last chunk, and the engine's own decode rate where it gave one."""

    prompt_tokens: int | None
    completion_tokens: int | None
    dispatched_at: float | None
    first_at: float | None
    last_at: float | None
    engine_rate: float | None = None
    engine_prefill: float | None = None
    """The engine's own prompt tokens a second, where it reports them."""
    engine_load: float | None = None
    """The seconds the engine says it spent loading the model, where it reports them."""
    paced: bool = True
    """Whether its tokens came one after another (a stream, or a stream assembled by the proxy):
    only then is first-to-last content a decode rate."""
    cached_tokens: int | None = None
    """The prompt tokens the engine says it found cached (part of ``prompt_tokens``); None: it
    did not say (Ollama, LM Studio)."""

    @property
    def read_tokens(self) -> int:
        """The prompt tokens the engine read: those it did not find cached, where it says so,
        else the whole prompt."""
        prompt = self.prompt_tokens or 0
        cached = self.cached_tokens
        return prompt if cached is None else max(0, prompt - cached)


def bytes_per_token(prompt_bytes: int | None, prompt_tokens: int | None) -> float | None:
    """The request's measured prompt text over the engine's stated prompt tokens (§15.1), or
    None: nothing measured (images, a prompt not walked), a prompt under
    :data:`MIN_PREFILL_TOKENS`, or a ratio outside :data:`MIN_BYTES_PER_TOKEN` ..
    :data:`MAX_BYTES_PER_TOKEN`."""
    if not prompt_bytes or prompt_tokens is None or prompt_tokens < MIN_PREFILL_TOKENS:
        return None
    ratio = prompt_bytes / prompt_tokens
    return ratio if MIN_BYTES_PER_TOKEN <= ratio <= MAX_BYTES_PER_TOKEN else None


def sample_of(
    answer: Answer,
    start: Start,
    concurrency: float,
    prefill: float,
    prompt_bytes: int | None = None,
) -> Sample:
    """The :class:`Sample` of one answer (§15.1): the engine's own figures where it reports them
    (decode and prefill rates, load time), else what was measured — the decode rate as completion
    tokens over first to last content; the prefill rate as the prompt tokens the engine read
    (:attr:`Answer.read_tokens`: without those it says it found cached) over dispatch to first
    content, from an answer that started :attr:`Start.PLAIN`, or :attr:`Start.CACHED` when the
    engine says what it found cached; the load time (:attr:`Start.LOADED`) as that time less the
    prompt read at the node's current ``prefill`` estimate; the model's bytes per token from the
    request's ``prompt_bytes`` (:attr:`RequestSize.prompt_bytes`) and the stated prompt tokens."""
    decode = answer.engine_rate
    first, last = answer.first_at, answer.last_at
    tokens = answer.completion_tokens
    if decode is None and answer.paced and tokens and first is not None and last is not None:
        decode = tokens / (last - first) if last > first else None
    ttft = None
    if first is not None and answer.dispatched_at is not None:
        ttft = max(0.0, first - answer.dispatched_at)
    read = answer.read_tokens
    rate = load = None
    counted = start is Start.CACHED and answer.cached_tokens is not None
    if (start is Start.PLAIN or counted) and read >= MIN_PREFILL_TOKENS:
        if answer.engine_prefill is not None:
            rate = answer.engine_prefill
        elif ttft is not None and ttft > 0:
            rate = read / ttft
    if start is Start.LOADED:
        if answer.engine_load is not None:
            load = answer.engine_load
        elif ttft is not None:
            load = max(0.0, ttft - read / prefill)
    ratio = bytes_per_token(prompt_bytes, answer.prompt_tokens)
    return Sample(decode, rate, load, tokens, concurrency, ratio)


@frozen
class Rates:
    """One node's estimate for one model: throughput (single-stream decode tokens/s when alone),
    prefill tokens/s, load seconds; ``measured`` is False for a seed or fleet-median stand-in."""

    decode: float
    prefill: float
    load: float
    measured: bool = False
    samples: int = 0
    at: float | None = None


def _stepped(ratio: float, current: float) -> float:
    """``ratio`` held within :data:`RATIO_STEP` of ``current`` (the prior before any sample): one
    client's crafted prompt moves a model's bytes per token for everyone (and the fleet) by that
    much at most, and by its weight in the mean after the first (docs/behaviour.md §15.1)."""
    return min(max(ratio, current / RATIO_STEP), current * RATIO_STEP)


@define
class _Mean:
    value: float | None = None

    def add(self, x: float) -> None:
        self.value = x if self.value is None else self.value + ALPHA * (x - self.value)


@define
class _Entry:
    decode: _Mean = field(factory=_Mean)
    prefill: _Mean = field(factory=_Mean)
    load: _Mean = field(factory=_Mean)
    samples: int = 0
    at: float = 0.0


def _positive(value: float | None) -> float | None:
    return value if value is not None and value > 0 else None


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _own_prefill(entry: _Entry | None) -> float | None:
    """A measured node's own prefill rate (None: unmeasured, or it taught none): what
    :meth:`SpeedBook.rates` starts from, the fleet's median and the default after it."""
    return entry.prefill.value if entry is not None and entry.decode.value is not None else None


@define
class SpeedBook:
    """One facade's learnt speeds. ``seed(node_id)`` is the node's ``speed`` (None: unset)."""

    _clock: IReactorTime
    _seed: Callable[[str], float | None] = field(default=lambda _node: None)
    _entries: dict[tuple[str, str], _Entry] = field(init=False, factory=dict)
    _completion: dict[str, _Mean] = field(init=False, factory=dict)
    _bytes: dict[str, _Mean] = field(init=False, factory=dict)
    _listeners: list[Callable[[str, str, Sample], None]] = field(init=False, factory=list)
    _fleet: dict[str, tuple[float | None, float | None, float | None]] = field(
        init=False, factory=dict
    )
    """Per model, the fleet's medians, worked out once per change of an estimate (every request
    asks them; they change only when an answer is folded in)."""

    def subscribe(self, listener: Callable[[str, str, Sample], None]) -> None:
        """Call ``listener(node_id, model, sample)`` for each sample this proxy learns itself
        (the fleet store publishes them, §15.1: a fleet merges samples, not estimates)."""
        self._listeners.append(listener)

    def learn(self, node_id: str, model: str, sample: Sample) -> None:
        """Fold one answer's figures into the node's estimate for ``model``, and tell the
        listeners."""
        self.fold(node_id, model, sample)
        for listener in self._listeners:
            listener(node_id, model, sample)

    def fold(self, node_id: str, model: str, sample: Sample) -> None:
        """Fold one answer's figures into the node's estimate for ``model`` (a peer's sample:
        nobody is told)."""
        entry = self._entries.get((node_id, model))
        if entry is None:  # made once per (node, model), not for every answer
            entry = self._entries[(node_id, model)] = _Entry()
        self._fleet.pop(model, None)
        decode = _positive(sample.decode_rate)
        if decode is not None:
            entry.decode.add(decode * max(1.0, sample.concurrency))
        prefill = _positive(sample.prefill_rate)
        if prefill is not None:
            entry.prefill.add(prefill)
        load = sample.load_seconds
        if load is not None and load >= 0:
            entry.load.add(load)
        entry.samples += 1
        entry.at = self._clock.seconds()
        if sample.completion_tokens is not None and sample.completion_tokens >= 0:
            completion = self._completion.get(model)
            if completion is None:
                completion = self._completion[model] = _Mean()
            completion.add(float(sample.completion_tokens))
        ratio = sample.bytes_per_token
        if ratio is not None and MIN_BYTES_PER_TOKEN <= ratio <= MAX_BYTES_PER_TOKEN:
            mean = self._bytes.get(model)
            if mean is None:
                mean = self._bytes[model] = _Mean()
            mean.add(_stepped(ratio, PRIOR_BYTES_PER_TOKEN if mean.value is None else mean.value))

    def completion_mean(self, model: str) -> float:
        """The mean completion length of ``model`` (a default before any answer)."""
        mean = self._completion.get(model)
        return DEFAULT_COMPLETION if mean is None or mean.value is None else mean.value

    def bytes_per_token(self, model: str) -> float | None:
        """The prompt text bytes a token of ``model`` has shown (None: not learnt yet)."""
        mean = self._bytes.get(model)
        return None if mean is None else mean.value

    def measured(self, node_id: str, model: str) -> Rates | None:
        """The node's own estimate (None before its first decode measurement)."""
        entry = self._entries.get((node_id, model))
        if entry is None or entry.decode.value is None:
            return None
        prefill, load = entry.prefill.value, entry.load.value
        if not prefill or load is None:
            medians = self._medians(model)
            prefill = prefill or medians[1] or DEFAULT_PREFILL
            load = load if load is not None else medians[2] or DEFAULT_LOAD
        return Rates(
            entry.decode.value,
            prefill,
            load,
            measured=True,
            samples=entry.samples,
            at=entry.at,
        )

    def rates(self, node_id: str, model: str) -> Rates:
        """The node's estimate, else a stand-in: the fleet's median for ``model`` (exploration),
        scaled by the node's ``speed`` when it has one, else the defaults (§15.1, §15.2)."""
        own = self.measured(node_id, model)
        if own is not None:
            return own
        decode, prefill, load = self._medians(model)
        scale = self._seed(node_id)
        if decode is None:
            decode = DEFAULT_DECODE
        return Rates(
            decode * (scale if scale is not None and scale > 0 else 1.0),
            prefill or DEFAULT_PREFILL,
            load or DEFAULT_LOAD,
        )

    def prefill(self, node_id: str, model: str) -> float:
        """:meth:`rates`'s prefill rate, without making its :class:`Rates` (read per request)."""
        own = _own_prefill(self._entries.get((node_id, model)))
        return own or self._medians(model)[1] or DEFAULT_PREFILL

    def answered(self, node_id: str, model: str) -> bool:
        """Whether the node has answered for ``model`` (in full) since this proxy started."""
        return (node_id, model) in self._entries

    def stale(self, node_id: str, model: str) -> bool:
        """Whether the node's estimate for ``model`` is older than :data:`STALE_AFTER`."""
        entry = self._entries.get((node_id, model))
        return entry is not None and self._clock.seconds() - entry.at > STALE_AFTER

    def refreshing(self, node_id: str, model: str) -> None:
        """A request went to refresh a stale estimate: others need not (until it is stale again)."""
        entry = self._entries.get((node_id, model))
        if entry is not None:
            entry.at = self._clock.seconds()

    def known(self) -> Iterator[tuple[str, str, Rates]]:
        """Every (node, model, measured estimate), for ``nodes/list`` and ``/metrics``."""
        for node_id, model in sorted(self._entries):
            rates = self.measured(node_id, model)
            if rates is not None:
                yield node_id, model, rates

    def to_json(self, node_id: str) -> dict[str, dict[str, float | int]]:
        """The node's measured estimates by model, as ``nodes/list`` shows them (§15.1), with the
        model's ``bytesPerToken`` once learnt."""
        shown: dict[str, dict[str, float | int]] = {}
        for node, model, rates in self.known():
            if node != node_id:
                continue
            shown[model] = {
                "decodeTokensPerSecond": round(rates.decode, 2),
                "prefillTokensPerSecond": round(rates.prefill, 2),
                "loadSeconds": round(rates.load, 3),
                "samples": rates.samples,
            }
            ratio = self.bytes_per_token(model)
            if ratio is not None:
                shown[model]["bytesPerToken"] = round(ratio, 2)
        return shown

    def _medians(self, model: str) -> tuple[float | None, float | None, float | None]:
        known = self._fleet.get(model)
        if known is None:
            known = self._fleet[model] = self._medians_now(model)
        return known

    def _medians_now(self, model: str) -> tuple[float | None, float | None, float | None]:
        entries = [e for (_n, m), e in self._entries.items() if m == model]
        return (
            _median([e.decode.value for e in entries if e.decode.value is not None]),
            _median([e.prefill.value for e in entries if e.prefill.value is not None]),
            _median([e.load.value for e in entries if e.load.value is not None]),
        )
