"""A running vLLM OpenAI-compatible server (or several) as a token-in/token-out backend.

Uses ``POST /v1/completions`` with the prompt given as a list of token ids and
``"return_token_ids": true``, streamed: every chunk carries the new ids (``token_ids``), so
nothing is re-tokenized. With several base URLs, every turn of a conversation (the engine's
run: :data:`~backend.generators.base.conversation_key`) goes to the same server, chosen by
consistent hashing (``routing="sticky"``, as verl's server manager does, so the server's prefix
cache holds the conversation so far); when that server fails, the turn goes to the next server
on the ring and the conversation stays there. Requests outside a conversation, or every request
with ``routing="least_outstanding"``, go to the server with the fewest requests in flight. Each
:class:`Generation` records its server (``info["server_url"]``) and, when it moved,
``info["failover_from"]``. What the servers' logprobs are (their ``--logprobs-mode``) cannot be
read over HTTP: the loop config's ``vllm_logprobs_mode`` says it, and the engine records it in
each step's ``logprob_semantics``. Cancelling the calling task closes the HTTP stream; vLLM aborts a
request whose client disconnected.
Constraints go in vLLM's ``structured_outputs`` extra parameter (``regex`` / ``json`` /
``grammar`` / ``structural_tag``).
"""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

from backend.constraints import structured_outputs
from backend.generators.base import (
    Constraint,
    Generation,
    GenerationError,
    Generator,
    Request,
    SamplingParams,
    Stopwatch,
    conversation_key,
)
from backend.generators.routing import DEFAULT_ROUTING, LRU, HashRing, check_routing


def completion_payload(
    model: str, prompt_ids: list[int], params: SamplingParams, constraint: Constraint | None = None, *, stream: bool = True
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "prompt": list(prompt_ids),
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k and params.top_k > 0 else -1,
        "repetition_penalty": params.repetition_penalty,
        "ignore_eos": params.ignore_eos,
        "return_token_ids": True,
        "skip_special_tokens": False,
        "stream": stream,
    }
    if params.seed is not None:
        body["seed"] = params.seed
    if params.stop:
        body["stop"] = list(params.stop)
    if params.logprobs is not None:
        body["logprobs"] = params.logprobs
    so = structured_outputs(constraint)
    if so is not None:
        body["structured_outputs"] = so
    return body


class _Retryable(Exception):
    """A failure before any token arrived: another attempt (maybe another server) may work."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(reason)
        self.url = url
        self.reason = reason


class VLLMServerGenerator(Generator):
    """One or more vLLM OpenAI-compatible servers: conversations pinned by consistent hashing
    (``routing="sticky"``) with failover, or every request to the least busy server
    (``routing="least_outstanding"``). ``max_failovers``: how many conversations' failover
    destinations are remembered (least recently used forgotten first)."""

    name = "vllm-server"
    label = "vLLM server"

    def __init__(
        self,
        base_urls: list[str] | tuple[str, ...] | str,
        model: str | None = None,
        *,
        timeout_s: float = 120,
        retries: int = 3,
        api_key: str | None = None,
        backoff_s: float = 0.25,
        routing: str = DEFAULT_ROUTING,
        max_failovers: int = 100_000,
    ) -> None:
        if isinstance(base_urls, str):
            base_urls = [base_urls]
        urls = [self._normalize(u) for u in base_urls if u and u.strip()]
        if not urls:
            raise ValueError("VLLMServerGenerator needs at least one base URL (e.g. http://127.0.0.1:8000)")
        self.base_urls = urls
        self.model = model
        self.timeout_s = float(timeout_s)
        self.retries = max(0, int(retries))
        self.api_key = api_key
        self.backoff_s = backoff_s
        self.routing = check_routing(routing)
        self.ring = HashRing(urls)
        self.failovers = LRU(max_failovers)  # conversation key -> the server it moved to
        self.outstanding: dict[str, int] = {u: 0 for u in urls}
        self.served: dict[str, int] = {u: 0 for u in urls}  # requests completed per URL
        self._models: dict[str, str] = {}
        self._rr = itertools.count()
        self._clients: dict[int, tuple[Any, Any]] = {}  # id(loop) -> (loop, httpx.AsyncClient)

    @staticmethod
    def _normalize(url: str) -> str:
        url = url.strip().rstrip("/")
        if "://" not in url:
            url = "http://" + url
        if url.endswith("/v1"):
            url = url[: -len("/v1")]
        return url

    # ---- HTTP plumbing ------------------------------------------------------------------------

    def _client(self):
        import httpx

        loop = asyncio.get_running_loop()
        entry = self._clients.get(id(loop))
        if entry is not None and entry[0] is loop and not entry[1].is_closed:
            return entry[1]
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        client = httpx.AsyncClient(
            timeout=httpx.Timeout(self.timeout_s, connect=min(10.0, self.timeout_s)),
            headers=headers,
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
        )
        # drop clients of loops that are gone
        for k, (lp, _c) in list(self._clients.items()):
            if lp.is_closed():
                del self._clients[k]
        self._clients[id(loop)] = (loop, client)
        return client

    def _pick(self, exclude: set[str]) -> str:
        cands = [u for u in self.base_urls if u not in exclude] or list(self.base_urls)
        low = min(self.outstanding[u] for u in cands)
        ties = [u for u in cands if self.outstanding[u] == low]
        return ties[next(self._rr) % len(ties)]

    def route(self, key: str) -> list[str]:
        """The servers a turn of conversation ``key`` tries, in order: where an earlier failover
        moved it (else the ring's owner of the key), then onward round the ring."""
        order = self.ring.preference(key)
        moved = self.failovers.get(key)
        if moved is not None and moved in order:
            i = order.index(moved)
            order = order[i:] + order[:i]
        return order

    async def _model_for(self, url: str) -> str:
        if self.model:
            return self.model
        if url in self._models:
            return self._models[url]
        import httpx

        try:
            r = await self._client().get(f"{url}/v1/models")
        except httpx.HTTPError as e:
            raise _Retryable(url, _reason(e)) from e
        if r.status_code >= 500:
            raise _Retryable(url, f"HTTP {r.status_code} from /v1/models")
        if r.status_code != 200:
            raise GenerationError(f"vLLM server at {url} answered HTTP {r.status_code} to /v1/models: {_error_text(r.text)}")
        data = r.json().get("data") or []
        if not data:
            raise GenerationError(f"vLLM server at {url} serves no model (/v1/models is empty)")
        self._models[url] = data[0]["id"]
        return self._models[url]

    async def models(self, url: str | None = None) -> list[str]:
        """The model ids a server lists at /v1/models."""
        url = self._normalize(url) if url else self.base_urls[0]
        r = await self._client().get(f"{url}/v1/models")
        r.raise_for_status()
        return [m["id"] for m in r.json().get("data") or []]

    async def health(self, url: str | None = None) -> bool:
        import httpx

        url = self._normalize(url) if url else self.base_urls[0]
        try:
            r = await self._client().get(f"{url}/health")
        except httpx.HTTPError:
            return False
        return r.status_code == 200

    # ---- generation ---------------------------------------------------------------------------

    async def _generate(self, request: Request) -> Generation:
        key = conversation_key.get() if self.routing == "sticky" else None
        route = self.route(key) if key is not None else None
        tried: set[str] = set()
        failed: dict[str, str] = {}  # url -> why its first attempt failed
        last: _Retryable | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff_s * (2 ** (attempt - 1)))
            if route is not None:
                url = route[attempt % len(route)]
            else:
                url = self._pick(tried if len(tried) < len(self.base_urls) else set())
            tried.add(url)
            self.outstanding[url] += 1
            try:
                gen = await self._generate_once(url, request)
            except _Retryable as e:
                last = e
                failed.setdefault(url, e.reason)
                continue
            finally:
                self.outstanding[url] -= 1
            gen.info["routing"] = "sticky" if route is not None else "least_outstanding"
            if route is not None and url != route[0]:
                # the conversation stays where it was served: its prefix is cached there now
                if url == self.ring.node(key):
                    self.failovers.pop(key)
                else:
                    self.failovers.set(key, url)
                gen.info["failover_from"] = route[0]
                gen.info["failover_reason"] = failed.get(route[0], "")
            return gen
        assert last is not None
        urls = sorted(tried)
        where = urls[0] if len(urls) == 1 else ", ".join(urls)
        raise GenerationError(
            f"cannot reach vLLM server at {where}: {last.reason} (after {self.retries + 1} attempt(s); "
            f"is `python -m vllm.entrypoints.openai.api_server` running there?)"
        )

    async def _generate_once(self, url: str, request: Request) -> Generation:
        import httpx

        params = request.params
        model = await self._model_for(url)
        body = completion_payload(model, request.prompt_ids, params, request.constraint, stream=True)
        ids: list[int] = []
        logprobs: list[float] = []
        finish_reason: str | None = None
        stop_reason: Any = None
        clock = Stopwatch()
        try:
            async with self._client().stream("POST", f"{url}/v1/completions", json=body) as resp:
                if resp.status_code != 200:
                    text = (await resp.aread()).decode("utf-8", "replace")
                    if resp.status_code in (502, 503, 504):
                        raise _Retryable(url, f"HTTP {resp.status_code}: {_error_text(text)}")
                    raise GenerationError(
                        f"vLLM server at {url} rejected the request (HTTP {resp.status_code}): {_error_text(text)}"
                    )
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    chunk = json.loads(data)
                    if "error" in chunk:
                        raise GenerationError(f"vLLM server at {url} failed mid-generation: {_error_text(json.dumps(chunk))}")
                    for choice in chunk.get("choices") or []:
                        delta = list(choice.get("token_ids") or [])
                        if delta:
                            clock.tokens_arrived()
                            ids.extend(delta)
                            if params.logprobs is not None:
                                lp = (choice.get("logprobs") or {}).get("token_logprobs") or []
                                logprobs.extend(float("nan") if v is None else float(v) for v in lp)
                            request.emit(delta)
                        if choice.get("finish_reason") is not None:
                            finish_reason = choice["finish_reason"]
                            stop_reason = choice.get("stop_reason")
        except (httpx.ConnectError, httpx.ConnectTimeout) as e:
            raise _Retryable(url, _reason(e)) from e
        except httpx.HTTPError as e:
            if not ids:
                raise _Retryable(url, _reason(e)) from e
            raise GenerationError(f"lost the vLLM server at {url} after {len(ids)} tokens: {_reason(e)}") from e
        self.served[url] = self.served.get(url, 0) + 1
        info = {"server_url": url, "model": model, "stop_reason": stop_reason, "ttft_s": clock.ttft_s,
                "elapsed_s": clock.elapsed_s}
        return Generation(ids, finish_reason or "abort", logprobs if params.logprobs is not None else None, info)

    def describe(self) -> dict[str, Any]:
        d: dict[str, Any] = {"backend": self.name, "base_urls": list(self.base_urls), "routing": self.routing}
        model = self.model or next(iter(self._models.values()), None)
        if model:
            d["model"] = model
        return d

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        for k, (lp, client) in list(self._clients.items()):
            if lp is loop:
                await client.aclose()
            del self._clients[k]


def _reason(e: BaseException) -> str:
    s = str(e).strip()
    return f"{type(e).__name__}: {s}" if s else type(e).__name__


def _error_text(text: str) -> str:
    try:
        obj = json.loads(text)
    except (ValueError, TypeError):
        return text.strip()[:500]
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        if isinstance(err, dict):
            return str(err.get("message") or err)[:500]
        return str(err)[:500]
    return str(obj)[:500]
