"""Send the suite's prompts to the chat target: each distinct request once, its answers cached on disk by the
request's hash (a rerun sends nothing it has an answer for), at most ``concurrency`` at a time, a 429, a 5xx or a
timeout retried with backoff (so is an HTTP 200 whose body is no chat completion), and every HTTP call counted
against the budget, which is checked before the first.

The client is the red team's :class:`~exporter.gate.targets.chat.ChatTarget` (its key handling, its timeout, its
refusal of a wrong key, URL or model), with the client's own retries off: retries are counted here, so that
``max_calls`` bounds every call the run makes. A request that still fails is a failed request (counted, blocking),
never an answer; so is one that raised anything else, whatever the target sent.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from exporter.gate.counterfactual.suite import Requests
from exporter.gate.targets.chat import ChatSettings, ChatTarget, reply_text
from exporter.gate.targets.objects import TargetError

RETRIED_STATUS: Final = frozenset({408, 409, 429})
"""Besides every 5xx: the statuses a server sends when it is busy, not when the request is wrong."""
MAX_WAIT_SECONDS: Final = 60.0
"""The longest wait before a retry: the server's Retry-After, or the doubled backoff, is capped at a minute."""
NO_COMPLETION: Final = "HTTP 200 but the body is no chat completion"
"""A gateway's error page, an error object sent with status 200, a body cut short: retried like a 5xx."""
SHOWN_BODY_CHARS: Final = 200


@dataclass(frozen=True)
class Prompt:
    """One request: its messages and the parameters fixed for the whole run."""

    messages: tuple[tuple[str, str], ...]

    def body(self, settings: ChatSettings, requests: Requests) -> dict[str, Any]:
        body: dict[str, Any] = {"model": settings.model, "messages": [{"role": r, "content": c} for r, c in
                                                                      self.messages],
                                "temperature": settings.temperature, "max_tokens": settings.max_tokens,
                                "n": requests.samples}  # fmt: skip
        if requests.seed is not None:
            body["seed"] = requests.seed
        return body


def request_hash(settings: ChatSettings, body: dict[str, Any], model_version: str | None) -> str:
    """What identifies an answer: the endpoint, everything sent (model, messages, temperature, n, seed) and the model
    version the run names (``--model-version`` or the suite's): a new version behind the same URL and model name is
    asked again, never judged on another version's answers. A run that names no version hashes as before."""
    version = {} if model_version is None else {"model_version": model_version}
    canonical = json.dumps({"base_url": settings.base_url.rstrip("/"), **body, **version}, sort_keys=True,
                           ensure_ascii=False)  # fmt: skip
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass
class Answer:
    """The answers to one request (``samples`` texts), or why there are none."""

    texts: list[str] | None
    error: str | None = None
    calls: int = 0
    """HTTP calls spent on it in this run (0 when it came from the cache)."""


class Cache:
    """Answers on disk, one JSON file per request hash (``DIR/ab/abcd....json``), written atomically."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.not_written = 0
        """Answers that could not be written (a disk that filled up mid-run): the run goes on without them."""
        self.first_error: str | None = None
        self._lock = threading.Lock()

    def check(self) -> None:
        """TargetError, before the first request, when the folder cannot be written (a file at its path, a
        read-only mount): a run must not spend its calls and then lose every answer."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(dir=self.directory, suffix=".probe")
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            raise TargetError(f"--cache {self.directory}: the answers cannot be written there: "
                              f"{exc.strerror or exc}") from exc  # fmt: skip

    def _path(self, key: str) -> Path:
        return self.directory / key[:2] / f"{key}.json"

    def get(self, key: str) -> list[str] | None:
        try:
            record = json.loads(self._path(key).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        texts = record.get("answers") if isinstance(record, dict) else None
        return texts if isinstance(texts, list) and all(isinstance(t, str) for t in texts) else None

    def put(self, key: str, body: dict[str, Any], model_version: str | None, texts: list[str]) -> None:
        """Keep an answer; one that cannot be written is counted (:attr:`not_written`), never the run's end."""
        path, tmp = self._path(key), None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({"request": body, "model_version": model_version, "answers": texts}, f, ensure_ascii=False)
            os.replace(tmp, path)
        except OSError as exc:
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)
            with self._lock:
                self.not_written += 1
                self.first_error = self.first_error or f"{path}: {exc.strerror or exc}"


def answers_hash(answers: dict[str, Answer]) -> str:
    """The SHA-256 of exactly the answers a report was computed from (request hash and answers, in hash order):
    the audit log names it, so a rerun from the same cache is seen to judge the same answers."""
    digest = hashlib.sha256()
    for key in sorted(answers):
        digest.update(json.dumps([key, answers[key].texts, answers[key].error], ensure_ascii=False).encode())
    return digest.hexdigest()


class DecisionTarget(ChatTarget):
    """The red team's chat target asked with whole requests (``n`` answers, a seed), its client retrying nothing."""

    def __init__(self, settings: ChatSettings) -> None:
        super().__init__(settings, system_canary="", max_retries=0)

    def complete(self, body: dict[str, Any]) -> list[str]:
        """The answers to one request; TargetError when the endpoint refuses every request (key, model, URL),
        :class:`Retryable` when it may answer later (a body that is no chat completion too), RuntimeError when it
        refused this request."""
        errors = self._openai
        try:
            response = self._client.chat.completions.create(**body)
        except (errors.AuthenticationError, errors.PermissionDeniedError, errors.NotFoundError) as exc:
            raise TargetError(f"{self.settings.base_url}: {type(exc).__name__}: {exc}") from exc
        except errors.APIStatusError as exc:
            if exc.status_code in RETRIED_STATUS or exc.status_code >= 500:
                raise Retryable(f"HTTP {exc.status_code}", _retry_after(exc.response.headers)) from exc
            raise RuntimeError(f"HTTP {exc.status_code}: {exc}") from exc
        except errors.APIConnectionError as exc:  # refused, reset or timed out (APITimeoutError)
            raise Retryable(type(exc).__name__, None) from exc
        except (json.JSONDecodeError, errors.APIResponseValidationError) as exc:  # a body cut short
            raise Retryable(f"{NO_COMPLETION}: {exc}", None) from exc
        # a message with no text (content null: the tokens ran out, or a tool call) answered nothing: this request
        # failed, never an empty answer counted as unparsed; a refusal is an answer (unparsed: it decided nothing)
        try:  # the client hands back a page that is not JSON as text, and an error object as an empty completion
            choices = sorted(response.choices, key=lambda c: c.index)
            texts = [reply_text(c, self.settings.max_tokens) for c in choices]
        except (AttributeError, TypeError) as exc:
            raise Retryable(f"{NO_COMPLETION}: {_excerpt(response)}", None) from exc
        if len(texts) != body["n"]:
            raise RuntimeError(f"{len(texts)} answer(s) for n={body['n']}: the endpoint does not take n; set "
                               "requests.samples: 1")  # fmt: skip
        return texts


def _excerpt(response: Any) -> str:
    """The start of what came back instead of a chat completion, for the failed request's error."""
    dump = getattr(response, "model_dump_json", None)
    text = dump(exclude_unset=True) if callable(dump) else str(response)
    return repr(text[:SHOWN_BODY_CHARS]) + (" ..." if len(text) > SHOWN_BODY_CHARS else "")


class Retryable(Exception):
    """A failure the same request may not meet again: 429, 5xx, a timeout or a dropped connection."""

    def __init__(self, reason: str, wait: float | None) -> None:
        super().__init__(reason)
        self.wait = wait


def _retry_after(headers: Any) -> float | None:
    """The server's Retry-After (seconds) or retry-after-ms, capped at a minute; None when it sent neither."""
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        try:
            return min(float(headers.get(name)) * scale, MAX_WAIT_SECONDS)
        except (TypeError, ValueError):
            continue
    return None


@dataclass
class Budget:
    """HTTP calls left. Each request not yet started holds one in reserve, so retries never starve a first call."""

    left: int
    unstarted: int
    lock: threading.Lock = field(default_factory=threading.Lock)

    def first_call(self) -> None:
        with self.lock:
            self.left -= 1
            self.unstarted -= 1

    def retry(self) -> bool:
        with self.lock:
            if self.left - self.unstarted <= 0:
                return False
            self.left -= 1
            return True


@dataclass
class Outcome:
    """What the run's calls did: the answers by request hash, and the calls and retries it spent."""

    answers: dict[str, Answer]
    sent: int
    cached: int
    calls: int
    not_cached: int = 0
    """Answers the cache could not keep (the run judged them all the same)."""
    cache_error: str | None = None

    @property
    def retries(self) -> int:
        """Calls beyond each sent request's first."""
        return self.calls - self.sent


def ask_all(prompts: Sequence[Prompt], settings: ChatSettings, requests: Requests, cache: Cache,
            model_version: str | None) -> tuple[dict[Prompt, str], Outcome]:  # fmt: skip
    """Ask every distinct prompt once (from the cache when it has the answer of this model version); the hash of
    each prompt and the outcome. TargetError before any call when the calls needed exceed ``max_calls``, or when the
    endpoint refuses the run (a wrong key, URL or model)."""
    bodies = {p: p.body(settings, requests) for p in prompts}
    keys = {p: request_hash(settings, b, model_version) for p, b in bodies.items()}
    answers: dict[str, Answer] = {}
    todo: dict[str, dict[str, Any]] = {}
    for p, key in keys.items():
        if key in answers or key in todo:
            continue
        texts = cache.get(key)
        if texts is not None and len(texts) == requests.samples:
            answers[key] = Answer(texts)
        else:
            todo[key] = bodies[p]
    cached = len(answers)
    if len(todo) > requests.max_calls:
        raise TargetError(f"requests.max_calls: {len(todo):,} requests are not in the cache and the budget is "
                          f"{requests.max_calls:,} calls: raise requests.max_calls (or --max-calls), or ask fewer "
                          "items")  # fmt: skip
    if not todo:
        return keys, Outcome(answers, 0, cached, 0)
    cache.check()
    client = DecisionTarget(settings)
    budget = Budget(requests.max_calls, len(todo))

    def one(key: str) -> Answer:
        body = todo[key]
        budget.first_call()
        retries = 0
        while True:
            try:
                texts = client.complete(body)
            except Retryable as exc:
                if retries == requests.retries or not budget.retry():
                    why = "retries exhausted" if retries == requests.retries else "call budget spent"
                    return Answer(None, f"{exc} ({why} after {retries + 1} call(s))", retries + 1)
                backoff = min(requests.backoff_seconds * 2**retries, MAX_WAIT_SECONDS)
                retries += 1
                time.sleep(exc.wait if exc.wait is not None else backoff)
                continue
            except RuntimeError as exc:
                return Answer(None, str(exc), retries + 1)
            except TargetError:
                raise
            except Exception as exc:  # whatever a target sends fails its request, never the run
                return Answer(None, f"{type(exc).__name__}: {exc}", retries + 1)
            cache.put(key, body, model_version, texts)
            return Answer(texts, calls=retries + 1)

    with ThreadPoolExecutor(max_workers=requests.concurrency) as pool:
        futures = {key: pool.submit(one, key) for key in todo}
        try:
            for key, future in futures.items():
                answers[key] = future.result()
        except TargetError:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    sent = len(todo)
    calls = sum(a.calls for a in answers.values())
    if all(answers[k].texts is None for k in todo) and cached == 0:
        first = answers[next(iter(todo))].error
        raise TargetError(f"{settings.base_url}: no request was answered ({sent} sent, {calls} calls): {first}")
    return keys, Outcome(answers, sent, cached, calls)
