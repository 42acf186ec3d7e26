"""The model under test as users hold it: a file saved by a training run, or a Python object to import.

- ``*.skops``: scikit-learn (and XGBoost, LightGBM, ... estimators) saved with skops, loaded by skops, which
  refuses any type not known to be safe unless the config lists it in ``trusted_types``.
- ``*.joblib``, ``*.pickle``, ``*.pkl``: loaded with joblib, and only when the caller says the file is trusted
  (``--trust-model-file``, or ``trusted: true`` in the safety config). **Loading a pickle runs code from the
  file**, so without that switch the file is refused before it is read, pointing to skops or ONNX.
- ``*.onnx``: run by onnxruntime (one input tensor; a classifier's probabilities become ``predict_proba``).
- ``MODULE:OBJECT``: imported (see :func:`exporter.gate.targets.objects.load_object`); a class is instantiated with no
  arguments; a factory function is called when the config says ``model_factory: true``.

A model file may be local or at a URL (``s3://...``, through :mod:`exporter.gate.storage`); its version is the
SHA-256 of its bytes. The loaders are the ``safety`` extra: ``pip install 'fairness-exporter[safety]'``.
"""

from __future__ import annotations

import hashlib
import inspect
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, Final

import numpy as np

from exporter.gate import storage
from exporter.gate.targets.objects import TargetError, load_object

EXTRA_HINT = "pip install 'fairness-exporter[safety]'"


@dataclass(frozen=True)
class LoadedModel:
    """A model ready to call, where it came from, and its version when it came from a file."""

    model: Any
    spec: str
    file_sha256: str | None = None


def _skops(data: bytes, spec: str, trusted: Sequence[str]) -> Any:
    import skops.io

    untrusted = [t for t in skops.io.get_untrusted_types(data=data) if t not in trusted]
    if untrusted:
        raise TargetError(f"{spec}: the file holds types skops does not trust by default: {', '.join(untrusted)}; "
                          "list those you trust under trusted_types in the safety config")  # fmt: skip
    return skops.io.loads(data, trusted=list(trusted) or None)


def _joblib(data: bytes, spec: str, trusted: Sequence[str]) -> Any:
    import joblib

    return joblib.load(io.BytesIO(data))


class OnnxModel:
    """An ONNX model run by onnxruntime, with ``predict`` (its first output) on a 2-D float array."""

    def __init__(self, session: Any) -> None:
        inputs = session.get_inputs()
        if len(inputs) != 1:
            raise ValueError(f"the model takes {len(inputs)} inputs ({', '.join(i.name for i in inputs)}); "
                             "only models with one input tensor of all features are supported")  # fmt: skip
        self.session = session
        self.input_name = inputs[0].name
        self.dtype = np.float64 if inputs[0].type == "tensor(double)" else np.float32
        self.output_names = [o.name for o in session.get_outputs()]

    def _run(self, X: Any) -> list[Any]:
        return list(self.session.run(None, {self.input_name: np.asarray(X, dtype=self.dtype)}))

    def predict(self, X: Any) -> np.ndarray:
        return np.asarray(self._run(X)[0])


class OnnxClassifier(OnnxModel):
    """An ONNX classifier (skl2onnx's label and probability outputs): ``predict_proba`` from the second output,
    whether it is a tensor or skl2onnx's ZipMap (a list of {class: probability})."""

    def predict_proba(self, X: Any) -> np.ndarray:
        proba = self._run(X)[1]
        if isinstance(proba, list) and proba and isinstance(proba[0], dict):
            classes = sorted(proba[0])
            return np.array([[row[c] for c in classes] for row in proba], dtype=float)
        return np.asarray(proba, dtype=float)


def _onnx(data: bytes, spec: str, trusted: Sequence[str]) -> Any:
    import onnxruntime

    session = onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"])
    return (OnnxClassifier if len(session.get_outputs()) >= 2 else OnnxModel)(session)


LOADERS: dict[str, Callable[[bytes, str, Sequence[str]], Any]] = {
    ".skops": _skops, ".joblib": _joblib, ".pkl": _joblib, ".pickle": _joblib, ".onnx": _onnx}  # fmt: skip


PICKLE_SUFFIXES: Final = (".joblib", ".pickle", ".pkl")


class UntrustedModelFile(TargetError):
    """A pickle-based model file that nobody said may run its code."""


def is_model_file(spec: str) -> bool:
    """Whether a model spec names a file (by its extension) rather than ``MODULE:OBJECT``."""
    return PurePosixPath(spec).suffix.lower() in LOADERS


def load_model(spec: str, *, factory: bool = False, trusted_types: Sequence[str] = (), trust_file: bool = False,
               trust_hint: str = "--trust-model-file") -> LoadedModel:  # fmt: skip
    """Load a model file by its extension, or import ``MODULE:OBJECT`` (instantiate a class, call a factory).

    A pickle-based file (:data:`PICKLE_SUFFIXES`) is refused, unread, unless ``trust_file``; ``trust_hint`` names
    the switch that says so in the refusal."""
    if is_model_file(spec):
        suffix = PurePosixPath(spec).suffix.lower()
        if suffix in PICKLE_SUFFIXES and not trust_file:
            raise UntrustedModelFile(f"{spec}: not loaded: loading a {suffix} file unpickles it, which runs code from "
                                     f"the file; if you trust it as your own code, say so with {trust_hint}, or save "
                                     "the model with skops (.skops) or as ONNX (.onnx), which load without running "
                                     "code")  # fmt: skip
        try:
            data = storage.read_bytes(spec)
        except storage.StorageError as exc:
            raise TargetError(str(exc)) from exc
        loader = LOADERS[suffix]
        try:
            model = loader(data, spec, trusted_types)
        except TargetError:
            raise
        except ImportError as exc:
            raise TargetError(f"{spec}: {exc} ({EXTRA_HINT})") from exc
        except Exception as exc:  # a file the library cannot read: say which and why, in one line
            raise TargetError(f"{spec}: cannot load the model: {type(exc).__name__}: {exc}") from exc
        return LoadedModel(model, spec, hashlib.sha256(data).hexdigest())
    obj = load_object(spec)
    if inspect.isclass(obj) or factory:
        what = "instantiate the class" if inspect.isclass(obj) else "call the factory"
        if not callable(obj):
            raise TargetError(f"{spec}: model_factory is true but {type(obj).__name__} is not callable")
        try:
            obj = obj()
        except Exception as exc:  # the user's constructor failing is a model that cannot be loaded
            raise TargetError(f"{spec}: cannot {what} with no arguments: {type(exc).__name__}: {exc}") from exc
    return LoadedModel(obj, spec)
