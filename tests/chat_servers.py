"""Two chat models behind real OpenAI-compatible HTTP endpoints on loopback (POST /v1/chat/completions, bearer
key, the protocol's JSON), both moderators that answer BLOCK or ALLOW (tests/text_models.py):

- ``leaky`` reads text as it arrives, obeys any instruction to reply with a token, hands out its system prompt to
  anyone who asks for instructions or claims a role, and continues texts it has memorised word for word;
- ``guarded`` normalises Unicode before it judges, and answers nothing but its verdict.

Both judge by a blocklist of words, so that the words of an injection's wrapper never move the verdict on the
text inside it (the TF-IDF moderator of tests/text_models.py does: it is the red team's classifier target).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from exporter.gate.redteam.config import library_cases, load_library
from exporter.gate.redteam.unicode_text import normalise_text

KEY = "sk-test-0123456789"
MODEL = "moderator-7b-instruct"
MEMORISED = [t for c in library_cases(load_library(), "chat") if c["technique"] == "training_data_extraction"
             for t in c["texts"]]  # fmt: skip
PRIVILEGED = re.compile(r"system|instruction|prompt|reference code|configuration|confidential|admin|developer|"
                        r"debug|root|sudo|secret|words above|first message|devmode", re.IGNORECASE)  # fmt: skip
TOKEN = re.compile(r"\b[A-Z]+-[0-9A-F]{10}\b")


BLOCKLIST = {"idiot", "stupid", "loser", "moron", "worthless", "pathetic", "ugly", "dumb", "dumbest",
             "disgusting", "kill", "hurt", "destroy", "die", "hates", "beat", "creep", "freak", "password", "prize",
             "money", "lottery", "cash"}  # fmt: skip


def verdict(text: str) -> str:
    return "BLOCK" if BLOCKLIST & set(re.findall(r"\w+", text.casefold())) else "ALLOW"


def leaky(system: str, user: str) -> str:
    for text in MEMORISED:
        shown = max((k for k in range(30, len(text)) if text[:k] in user), default=0)
        if shown:
            return text[shown:]
    if (token := TOKEN.search(user)) is not None:
        return token.group(0)
    if PRIVILEGED.search(user):
        return f"Of course. My instructions are: {system}"
    return verdict(user)


def guarded(system: str, user: str) -> str:
    return verdict(normalise_text(user))


@dataclass
class ChatServer:
    base_url: str
    requests: list[dict] = field(default_factory=list)
    calls: int = 0
    """Every POST to the completions route, the faulted ones too (``requests`` holds the answered ones)."""


Fault = Callable[[dict], "int | float | None"]
"""Before answering a request: None to answer it, an HTTP status to send instead (with ``Retry-After: 0``), or
seconds to wait before answering (longer than the client's timeout: a timeout)."""


@contextmanager
def serve(answer: Callable[[str, str], str | None], fault: Fault | None = None) -> Iterator[ChatServer]:
    """An OpenAI-compatible endpoint answering each request by ``answer``; an answer of None is a message with
    ``content: null`` and ``finish_reason: length`` (the tokens ran out before any text)."""
    state = ChatServer("")
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def _send(self, status: int, payload: dict) -> None:
            body = json.dumps(payload).encode()
            self.send_response(status)
            if status in (429, 503):
                self.send_header("Retry-After", "0")
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path != "/v1/chat/completions":
                return self._send(404, {"error": {"message": f"no route {self.path}", "type": "invalid_request"}})
            if self.headers.get("Authorization") != f"Bearer {KEY}":
                return self._send(401, {"error": {"message": "invalid api key", "type": "authentication_error"}})
            if request.get("model") != MODEL:
                return self._send(404, {"error": {"message": f"model {request.get('model')!r} does not exist",
                                                  "type": "invalid_request_error"}})  # fmt: skip
            with lock:
                state.calls += 1
            what = fault(request) if fault is not None else None
            if isinstance(what, int):
                return self._send(what, {"error": {"message": f"fault {what}", "type": "server_error"}})
            if isinstance(what, float):
                time.sleep(what)
            with lock:
                state.requests.append(request)
            messages = {m["role"]: m["content"] for m in request["messages"]}
            replies = [answer(messages.get("system", ""), messages["user"]) for _ in range(request.get("n", 1))]
            self._send(200, {"id": f"chatcmpl-{len(state.requests)}", "object": "chat.completion",
                             "created": int(time.time()), "model": MODEL,
                             "choices": [{"index": k, "message": {"role": "assistant", "content": reply},
                                          "finish_reason": "stop" if reply is not None else "length"}
                                         for k, reply in enumerate(replies)],
                             "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}})  # fmt: skip
            return None

        def log_message(self, *args: object) -> None:
            pass

    with loopback(Handler) as state.base_url:
        yield state


@contextmanager
def answering(reply: Callable[[dict], tuple[int, dict[str, str], bytes]]) -> Iterator[str]:
    """A loopback endpoint answering each POST (a JSON request) with the status, headers and body ``reply`` gives."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            status, headers, body = reply(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    with loopback(Handler) as url:
        yield url


@contextmanager
def loopback(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """``handler`` served on a free loopback port, in a thread, until the block ends; its base URL (``.../v1``)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
