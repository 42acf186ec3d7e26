"""A text model as the red team calls it: an HTTP endpoint, ``MODULE:CALLABLE`` or a model file, as one callable from
text to the model's output."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from exporter.gate.targets.files import load_model
from exporter.gate.targets.objects import TargetError


def _dig(value: Any, path: str, spec: str) -> Any:
    """Follow a dotted path (``predictions.0.score``) through dicts and lists."""
    for part in path.split("."):
        try:
            value = value[int(part)] if isinstance(value, list) else value[part]
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            raise TargetError(f"{spec}: the response has no field {path!r} (stopped at {part!r})") from exc
    return value


def _nest(path: str, value: Any) -> Any:
    """The JSON body that puts ``value`` at a dotted path; a numeric part makes a list (``instances.0``)."""
    for part in reversed(path.split(".")):
        value = [value] if part.isdigit() else {part: value}
    return value


class HttpTextTarget:
    """A text model behind an HTTP endpoint: POST ``{request_field: text}`` as JSON, read ``response_field``.

    ``request_field="instances.0"`` and ``response_field="predictions.0"`` speak KServe's v1 protocol;
    ``inputs.0`` / ``predictions.0`` speak MLflow's scoring server.
    """

    def __init__(self, url: str, request_field: str = "text", response_field: str = "prediction",
                 timeout: float = 10.0) -> None:  # fmt: skip
        self.url, self.request_field, self.response_field, self.timeout = url, request_field, response_field, timeout

    def __call__(self, text: str) -> Any:
        body = json.dumps(_nest(self.request_field, text)).encode()
        request = urllib.request.Request(self.url, data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                payload = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"HTTP {exc.code} from {self.url}") from exc  # the model failed on this input
        except (urllib.error.URLError, OSError) as exc:
            raise TargetError(f"{self.url}: cannot reach the model: {getattr(exc, 'reason', exc)}") from exc
        except json.JSONDecodeError as exc:
            raise TargetError(f"{self.url}: the response is not JSON ({exc.msg})") from exc
        return _dig(payload, self.response_field, self.url)


def text_target(spec: str, request_field: str = "text", response_field: str = "prediction", *,
                trust_file: bool = False) -> Callable[[str], Any]:  # fmt: skip
    """A callable from text to the model's output, for an ``http(s)://`` URL, or for ``MODULE:CALLABLE`` or a model
    file (a class is instantiated; see :mod:`exporter.gate.targets.files`; a pickle-based file only with
    ``trust_file``), whose version is then the file's SHA-256 (``file_sha256`` on the callable).

    An object with ``predict`` (a scikit-learn text pipeline) is called as ``predict([text])[0]``.
    """
    if spec.startswith(("http://", "https://")):
        return HttpTextTarget(spec, request_field, response_field)
    loaded = load_model(spec, trust_file=trust_file)
    call = _text_callable(loaded.model, spec)
    if loaded.file_sha256 is None:
        return call

    def versioned(text: str) -> Any:
        return call(text)

    versioned.file_sha256 = loaded.file_sha256  # type: ignore[attr-defined]
    return versioned


def _text_callable(obj: Any, spec: str) -> Callable[[str], Any]:
    if hasattr(obj, "predict"):
        return lambda text: obj.predict([text])[0]
    if not callable(obj):
        raise TargetError(f"{spec}: {type(obj).__name__} is neither callable nor has predict()")
    return obj
