"""A remote vLLM server (`vllm serve`) behind the `Engine` port, over its OpenAI-compatible API.

Segmented generation needs nothing vLLM's `/v1/completions` lacks (vllm 0.32,
`entrypoints/openai/completion/protocol.py`):
- add = `POST /v1/completions` with `prompt` as a list of token ids, `stream: true`,
  `return_token_ids: true` (each SSE chunk carries `choices[0].token_ids`, the delta ids),
  greedy by default; the server never re-tokenises our ids;
- abort (suspend) = close the stream: vLLM aborts a request whose client went away, and its full
  KV blocks stay in the server's prefix cache;
- resume = a new request with prompt + generated ids, so the prefix cache serves that prefix.

Text is detokenised here from the ids (the planner's own tokenizer, the same
`IncrementalDetokenizer` as the in-process adapter), never taken from the server's text, so a
generation suspended inside a multi-byte character still concatenates to the right text.

The streams run on one asyncio loop in a background thread (httpx.AsyncClient); `step()` drains
what arrived since the last call (waiting up to `poll_s` for the first chunk when nothing has),
so several streams progress between two planner steps and the planner loop stays synchronous.

What the server reports is read from `/metrics` (Prometheus text, parsed with
`prometheus_client.parser`): KV usage and capacity, running requests, prompt tokens and cached
prompt tokens (vLLM counts a request's prefix-cache hits when it schedules its prefill, also for
requests we later abort; a per-request `num_cached_tokens` reaches a streaming client only in the
final usage chunk of a stream that ran to its end, so `EngineOutput.num_cached_tokens` is None
here and the cached share comes from these counters).

On connect the adapter checks: the server answers (`/v1/models`), it serves the expected model
(`model`), and its tokenizer turns probe texts into the same ids as the planner's (`/tokenize`).
A server that is down, slow (no chunk for `stall_timeout_s`), or sends malformed data makes the
engine unhealthy with an `EngineError` that says which and where; the planner (or an engine
pool) then re-queues its generations from their token records.
"""

from __future__ import annotations

import asyncio
import json
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..core.engine import EngineError, EngineOutput, EngineStats
from .vllm_engine import (SCHEDULING_POLICIES, EngineInputError, HeldText, IncrementalDetokenizer, VllmTokenizer,
                          check_priority, checked_add)
from .vllm_stats import DecodeSpeed, free_blocks_from_usage

# Config keys -> meaning.  Anything else is rejected, so a typo cannot silently use a default.
CONFIG_KEYS: dict[str, str] = {
    "url": "the server's OpenAI API base, e.g. http://gpu1:8000/v1",
    "model": "served model name the planner expects (default: the server's only model)",
    "tokenizer": "local tokenizer directory (default: the served model's path, if it exists here)",
    "timeout_s": "connect / request timeout for control calls and stream starts (default 10)",
    "stall_timeout_s": "a stream that sends nothing for this long marks the server slow (default 60)",
    "poll_s": "step() waits up to this long for the first new chunk (default 0.02)",
    "metrics_interval_s": "how often /metrics is scraped for KV usage (default 0.5)",
    "temperature": "sampling temperature (default 0: greedy, what resume-equivalence needs)",
    "ignore_eos": "keep generating after EOS (benchmarks with fixed lengths)",
    "scheduling_policy": "fcfs (default) | priority: the server runs `vllm serve --scheduling-policy priority`; "
                         "adds then carry priority= (the vllm-priority policy).  Declared, not checked: "
                         "the OpenAI API does not say, and vLLM 0.32 ignores priorities under fcfs",
}

# Probe texts whose ids must match between the server's tokenizer and the planner's: MiniSpec,
# plain English, digits and a non-ASCII character (byte-level merges differ first there).
TOKENIZER_PROBES = ("mf(50);tc(90);?iv('cat')==True{g('cat');}",
                    "Find the red block on the desk and report what you see, 123 °C.")


class RemoteServerError(EngineError):
    """The server is down, slow, or sent something this adapter cannot use; the message says
    which server and what happened."""


@dataclass(frozen=True, slots=True)
class ServerMetrics:
    """What the adapter reads from one `/metrics` scrape."""

    kv_usage: float | None  # vllm:kv_cache_usage_perc (0..1)
    running: int | None  # vllm:num_requests_running
    waiting: int | None  # vllm:num_requests_waiting
    prompt_tokens: float  # vllm:prompt_tokens (counter)
    cached_prompt_tokens: float  # vllm:prompt_tokens_cached (counter)
    num_blocks: int | None  # cache_config_info num_gpu_blocks
    block_size: int | None  # cache_config_info block_size


def parse_metrics(text: str) -> ServerMetrics:
    """Parse vLLM's Prometheus text exposition (summed over engines); ValueError if it is not
    Prometheus text."""
    from prometheus_client.parser import text_string_to_metric_families

    vals: dict[str, float] = {}
    info: dict[str, str] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "vllm:cache_config_info":
                info = dict(s.labels)
            elif s.name in ("vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting",
                            "vllm:prompt_tokens_total", "vllm:prompt_tokens_cached_total"):
                vals[s.name] = vals.get(s.name, 0.0) + float(s.value)

    def _int(v: str | None) -> int | None:
        try:
            return int(v) if v not in (None, "None") else None
        except ValueError:
            return None

    running, waiting = vals.get("vllm:num_requests_running"), vals.get("vllm:num_requests_waiting")
    return ServerMetrics(kv_usage=vals.get("vllm:kv_cache_usage_perc"),
                         running=int(running) if running is not None else None,
                         waiting=int(waiting) if waiting is not None else None,
                         prompt_tokens=vals.get("vllm:prompt_tokens_total", 0.0),
                         cached_prompt_tokens=vals.get("vllm:prompt_tokens_cached_total", 0.0),
                         num_blocks=_int(info.get("num_gpu_blocks")), block_size=_int(info.get("block_size")))


def parse_chunk(data: str) -> tuple[tuple[int, ...], str]:
    """(delta token ids, finish reason or "") of one streamed completion chunk; ValueError with
    the reason if it is not a chunk of a `return_token_ids` completion stream."""
    try:
        obj = json.loads(data)
    except ValueError as e:
        raise ValueError(f"not JSON: {data[:80]!r}") from e
    if not isinstance(obj, dict):
        raise ValueError(f"not a JSON object: {data[:80]!r}")
    if "error" in obj:
        raise ValueError(f"server error in stream: {str(obj['error'])[:200]}")
    choices = obj.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        raise ValueError(f"expected one choice, got {str(choices)[:80]!r}")
    ch = choices[0]
    ids = ch.get("token_ids")
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                            for t in ids):
        raise ValueError(f"choices[0].token_ids is not a list of token ids: {str(ids)[:80]!r} "
                         f"(does the server support return_token_ids?)")
    reason = ch.get("finish_reason")
    if reason is not None and not isinstance(reason, str):
        raise ValueError(f"finish_reason is not a string: {reason!r}")
    return tuple(ids), reason or ""


@dataclass(slots=True)
class _Active:
    request_id: str
    task: Any  # asyncio.Task of the stream
    detok: IncrementalDetokenizer
    first: bool = True


class RemoteVllmEngine:
    """`Engine` over one `vllm serve` endpoint (see the module docstring)."""

    kv_modes: frozenset[str] = frozenset({"cache", "discard"})

    def __init__(self, config: Mapping[str, Any]) -> None:
        import httpx

        if not isinstance(config, Mapping):
            raise EngineError(f"remote engine config must be a mapping, got {type(config).__name__}")
        unknown = sorted(set(config) - set(CONFIG_KEYS))
        if unknown:
            raise EngineError(f"unknown remote engine config keys {unknown}; valid: {sorted(CONFIG_KEYS)}")
        url = config.get("url")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise EngineError(f"remote engine needs `url: http://HOST:PORT/v1`, got {url!r}")
        self.url = url.rstrip("/")
        self.base = self.url.removesuffix("/v1")  # /tokenize, /metrics, /health live at the root
        self.timeout_s = self._positive(config, "timeout_s", 10.0)
        self.stall_timeout_s = self._positive(config, "stall_timeout_s", 60.0)
        self.poll_s = self._positive(config, "poll_s", 0.02)
        self.metrics_interval_s = self._positive(config, "metrics_interval_s", 0.5)
        self._temperature = float(config.get("temperature", 0.0))
        self.ignore_eos = bool(config.get("ignore_eos", False))
        self.scheduling_policy = str(config.get("scheduling_policy") or "fcfs")
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise EngineError(f"remote engine `scheduling_policy` must be one of {SCHEDULING_POLICIES}, "
                              f"got {config.get('scheduling_policy')!r}")
        self.healthy = True
        self._closed = False
        self._error = ""
        self._active: dict[str, _Active] = {}
        self._owner: dict[str, str] = {}
        self.held = HeldText()
        self._n = 0
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._speed = DecodeSpeed()
        self._last_step: float | None = None
        self._metrics: ServerMetrics | None = None
        # the planner-side step log of the in-process adapter has no equivalent here: the server's
        # iterations are not visible to a client; kept (and left empty) for callers that set it
        self.step_log: list | None = None
        self._http = httpx.Client(timeout=self.timeout_s)
        self._loop: asyncio.AbstractEventLoop | None = None
        try:
            self._connect(config)
            self._start_loop()
        except BaseException:
            self.shutdown()
            raise

    @staticmethod
    def _positive(config: Mapping[str, Any], key: str, default: float) -> float:
        v = config.get(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            raise EngineError(f"remote engine `{key}` must be a number > 0, got {v!r}")
        return float(v)

    # -- connect: the server is there, serves the expected model, tokenises like us ------------

    def _get_json(self, url: str, what: str, body: Any = None) -> Any:
        import httpx

        try:
            r = self._http.post(url, json=body) if body is not None else self._http.get(url)
        except httpx.TimeoutException as e:
            raise RemoteServerError(f"vLLM server {self.url} is slow: no answer to {what} within "
                                    f"{self.timeout_s:g} s ({type(e).__name__})") from e
        except httpx.HTTPError as e:
            raise RemoteServerError(f"cannot reach vLLM server {self.url} ({what}): {type(e).__name__}: "
                                    f"{e}. Is `vllm serve` running there?") from e
        if r.status_code != 200:
            raise RemoteServerError(f"vLLM server {self.url}: {what} answered HTTP {r.status_code}: "
                                    f"{r.text[:200]!r}")
        try:
            return r.json()
        except ValueError as e:
            raise RemoteServerError(f"vLLM server {self.url}: {what} answered non-JSON: "
                                    f"{r.text[:80]!r}") from e

    def _connect(self, config: Mapping[str, Any]) -> None:
        models = self._get_json(f"{self.url}/models", "GET /v1/models")
        data = models.get("data") if isinstance(models, dict) else None
        if not isinstance(data, list) or not data or not all(isinstance(m, dict) and isinstance(m.get("id"), str)
                                                             for m in data):
            raise RemoteServerError(f"vLLM server {self.url}: /v1/models is malformed: {str(models)[:120]!r}")
        want = config.get("model")
        served = {m["id"]: m for m in data}
        if want is not None:
            match = served.get(str(want)) or next((m for m in data if m.get("root") == want), None)
            if match is None:
                raise EngineError(f"vLLM server {self.url} serves {sorted(served)}, not the expected "
                                  f"model {want!r}: point `url` at the right server or fix `model`")
        elif len(data) == 1:
            match = data[0]
        else:
            raise EngineError(f"vLLM server {self.url} serves several models {sorted(served)}: set `model`")
        self.model = str(match["id"])
        mml = match.get("max_model_len")
        self.max_model_len = int(mml) if isinstance(mml, int) and mml > 0 else 1 << 30
        tok_dir = config.get("tokenizer") or match.get("root") or self.model
        if not Path(str(tok_dir)).expanduser().is_dir():
            raise EngineError(f"no local tokenizer for {self.model!r} (served by {self.url}): "
                              f"{str(tok_dir)!r} is not a directory here; set `tokenizer` to a copy "
                              f"of the model's tokenizer files")
        try:
            from transformers import AutoTokenizer
            hf = AutoTokenizer.from_pretrained(str(Path(str(tok_dir)).expanduser()))
        except Exception as e:  # noqa: BLE001 - transformers raises many types
            raise EngineError(f"cannot load tokenizer {str(tok_dir)!r}: {type(e).__name__}: {e}") from e
        self.tokenizer = VllmTokenizer(hf)
        self._decode = self.tokenizer.decode
        for probe in TOKENIZER_PROBES:
            for special in (False, True):
                ans = self._get_json(f"{self.base}/tokenize", "POST /tokenize",
                                     {"model": self.model, "prompt": probe, "add_special_tokens": special})
                theirs = ans.get("tokens") if isinstance(ans, dict) else None
                ours = self.tokenizer.encode_prompt(probe) if special else self.tokenizer.encode(probe)
                if theirs != ours:
                    raise EngineError(
                        f"vLLM server {self.url} ({self.model!r}) tokenises differently from the planner's "
                        f"tokenizer {str(tok_dir)!r}: {probe!r} -> server {str(theirs)[:60]} vs local "
                        f"{str(ours)[:60]}; the planner's prompts would mean something else there")
        m = self._scrape()
        if m.num_blocks is None or m.block_size is None:
            raise RemoteServerError(f"vLLM server {self.url}: /metrics has no vllm:cache_config_info "
                                    f"(num_gpu_blocks, block_size); is it a vLLM server?")
        self.block_size = m.block_size
        self.kv_total_blocks = max(m.num_blocks - 1, 0)  # minus vLLM's null block
        self._metrics = m

    def _scrape(self) -> ServerMetrics:
        import httpx

        try:
            r = self._http.get(f"{self.base}/metrics")
        except httpx.HTTPError as e:
            raise RemoteServerError(f"cannot reach vLLM server {self.url} (GET /metrics): "
                                    f"{type(e).__name__}: {e}") from e
        if r.status_code != 200:
            raise RemoteServerError(f"vLLM server {self.url}: /metrics answered HTTP {r.status_code}")
        try:
            return parse_metrics(r.text)
        except Exception as e:  # noqa: BLE001 - the parser raises ValueError / TypeError / ...
            raise RemoteServerError(f"vLLM server {self.url}: /metrics is not Prometheus text "
                                    f"({type(e).__name__}: {e})") from e

    # -- the stream loop ----------------------------------------------------------------------

    def _start_loop(self) -> None:
        import httpx

        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name=f"vllm-remote {self.url}", daemon=True)
        self._thread.start()

        async def make() -> Any:
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
            return httpx.AsyncClient(timeout=httpx.Timeout(self.timeout_s, read=self.stall_timeout_s),
                                     limits=limits)

        self._aclient = asyncio.run_coroutine_threadsafe(make(), loop).result()
        self._metrics_task = asyncio.run_coroutine_threadsafe(self._metrics_loop(), loop)

    async def _metrics_loop(self) -> None:
        import httpx

        while True:
            await asyncio.sleep(self.metrics_interval_s)
            try:
                r = await self._aclient.get(f"{self.base}/metrics")
                if r.status_code == 200:
                    self._metrics = parse_metrics(r.text)
            except (httpx.HTTPError, ValueError):
                pass  # the streams report a dead server; stats keep the last scrape

    async def _stream(self, rid: str, body: dict[str, Any]) -> None:
        import httpx

        put = self._events.put
        try:
            async with self._aclient.stream("POST", f"{self.url}/completions", json=body) as resp:
                if resp.status_code != 200:
                    text = (await resp.aread()).decode(errors="replace")[:200]
                    put((rid, "error", f"POST /v1/completions answered HTTP {resp.status_code}: {text!r}"))
                    return
                async for line in resp.aiter_lines():
                    if not line.strip():
                        continue
                    if not line.startswith("data:"):
                        raise ValueError(f"not a server-sent-events data line: {line[:80]!r}")
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    ids, reason = parse_chunk(data)
                    put((rid, "tokens", (ids, reason)))
            put((rid, "end", None))
        except asyncio.CancelledError:
            raise  # aborted by us: closing the stream tells vLLM to abort the request
        except httpx.TimeoutException as e:
            put((rid, "error", f"slow: nothing streamed for {self.stall_timeout_s:g} s ({type(e).__name__})"))
        except httpx.HTTPError as e:
            put((rid, "error", f"connection lost: {type(e).__name__}: {e}"))
        except ValueError as e:
            put((rid, "error", f"malformed stream data: {e}"))

    # -- Engine protocol ----------------------------------------------------------------------

    def _ensure_usable(self) -> None:
        if self._closed:
            raise EngineError(f"the remote engine for {self.url} was shut down")
        if not self.healthy:
            raise RemoteServerError(f"vLLM server {self.url} failed earlier: {self._error}")

    def _fail(self, why: str) -> RemoteServerError:
        self.healthy = False
        self._error = why
        return RemoteServerError(f"vLLM server {self.url}: {why}")

    def add(self, gen_id: str, prompt_ids: Sequence[int], max_tokens: int, priority: int = 0) -> None:
        self._ensure_usable()
        ids, room = checked_add(gen_id, prompt_ids, max_tokens, active=self._active, vocab_size=None,
                                max_model_len=self.max_model_len, where="the server's max_model_len")
        check_priority(gen_id, priority, self.scheduling_policy)
        self._n += 1
        rid = f"{gen_id}#{self._n}"
        body = {"model": self.model, "prompt": ids, "max_tokens": min(max_tokens, room), "stream": True,
                "return_token_ids": True, "temperature": self._temperature, "ignore_eos": self.ignore_eos,
                "skip_special_tokens": True, "request_id": rid}
        if priority:
            body["priority"] = priority  # vLLM's request priority (its OpenAI API extension)
        assert self._loop is not None
        fut = asyncio.run_coroutine_threadsafe(self._spawn(rid, body), self._loop)
        task = fut.result()
        self._active[gen_id] = _Active(rid, task, self.held.detokenizer(gen_id, ids, self._decode))
        self._owner[rid] = gen_id

    async def _spawn(self, rid: str, body: dict[str, Any]) -> Any:
        return asyncio.ensure_future(self._stream(rid, body))

    def abort(self, gen_id: str, kv: str = "cache") -> None:
        """Close the generation's stream (vLLM aborts it; full KV blocks stay in its prefix cache).
        Every mode is served as "cache": the server offers no per-request KV control."""
        if kv not in ("cache", "discard", "preserve", "swap"):
            raise EngineInputError(f"unknown kv mode {kv!r}")
        act = self._active.pop(gen_id, None)
        if act is None:
            return
        self._owner.pop(act.request_id, None)
        self.held.keep(gen_id, act.detok)
        if self._loop is not None and not self._closed:
            self._loop.call_soon_threadsafe(act.task.cancel)

    def _drain(self) -> list[tuple[str, str, Any]]:
        events = []
        try:
            events.append(self._events.get(timeout=self.poll_s))
            while True:
                events.append(self._events.get_nowait())
        except queue.Empty:
            pass
        return events

    def step(self) -> list[EngineOutput]:
        """The tokens every live stream received since the last call."""
        self._ensure_usable()
        if not self._active:
            self._last_step = None
            return []
        running = len(self._active)
        events = self._drain()
        now = time.perf_counter()
        result: list[EngineOutput] = []
        decoded = 0
        for rid, kind, payload in events:
            gen_id = self._owner.get(rid)
            if gen_id is None:
                continue  # an aborted request's leftovers: never reported
            if kind == "error":
                raise self._fail(f"{payload} (generation {gen_id})")
            if kind == "end":  # the stream closed without a finish reason
                raise self._fail(f"the stream of generation {gen_id} ended before it finished")
            ids, reason = payload
            act = self._active[gen_id]
            if not act.first:
                decoded += len(ids)
            act.first = False
            if reason:
                del self._active[gen_id]
                del self._owner[rid]
            # One output per token (a chunk may carry several when the client lags): the planner
            # maps statement ends to tokens by each output's text, as with one token per step.
            last = len(ids) - 1
            for i, t in enumerate(ids):
                result.append(EngineOutput(gen_id=gen_id, token_ids=(t,), text=act.detok.push((t,)),
                                           finished=bool(reason) and i == last,
                                           finish_reason=reason if i == last else ""))
            if reason and not ids:
                result.append(EngineOutput(gen_id=gen_id, token_ids=(), text="", finished=True,
                                           finish_reason=reason))
        if self._last_step is not None:
            self._speed.update(decoded, running, now - self._last_step)
        self._last_step = now if self._active else None
        return result

    def has_unfinished(self) -> bool:
        return bool(self._active)

    def stats(self) -> EngineStats:
        m = self._metrics
        free = (free_blocks_from_usage(m.kv_usage, self.kv_total_blocks)
                if m is not None and m.kv_usage is not None else self.kv_total_blocks)
        return EngineStats(kv_total_blocks=self.kv_total_blocks, kv_free_blocks=free,
                           block_size=self.block_size, running=len(self._active),
                           tokens_per_s=self._speed.value, healthy=self.healthy and not self._closed)

    def server_metrics(self) -> ServerMetrics:
        """A fresh `/metrics` scrape (prompt / cached-prompt token counters, KV usage)."""
        return self._scrape()

    def shutdown(self) -> None:
        """Close every stream and the HTTP clients (idempotent); the server keeps running."""
        if self._closed:
            return
        self._closed = True
        loop, self._loop = self._loop, None
        if loop is not None:
            async def close() -> None:
                for t in [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
                    t.cancel()
                await self._aclient.aclose()

            try:
                asyncio.run_coroutine_threadsafe(close(), loop).result(timeout=5)
            except Exception:  # noqa: BLE001 - closing a broken connection: nothing left to do
                pass
            loop.call_soon_threadsafe(loop.stop)
            self._thread.join(timeout=5)
            loop.close()
        self._active.clear()
        self._owner.clear()
        self._http.close()

    def __enter__(self) -> "RemoteVllmEngine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
