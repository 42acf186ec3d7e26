"""The ``kafka.client`` settings, checked against the chosen client library's own lists before anything connects:
an unknown key, a key the daemon sets itself, or a value the library would refuse (or, for kafka-python's
``security_protocol``, silently misread) is one problem line each."""

from __future__ import annotations

from typing import Any, Final

_SENTINEL: Final = "fairness.exporter.validation.sentinel"
"""Set after a user's property: librdkafka refusing it (and only it) proves the user's property was accepted."""


KAFKA_PYTHON_SET_BY_DAEMON: Final = {
    "bootstrap_servers": "kafka.bootstrap_servers", "group_id": "kafka.group_id",
    "auto_offset_reset": "kafka.auto_offset_reset", "enable_auto_commit": None, "max_poll_records": None,
    "client_id": None,
}  # fmt: skip
"""Keywords the kafka-python source passes to KafkaConsumer itself (a second value would be a TypeError there)."""


KAFKA_PYTHON_SECURITY_PROTOCOLS: Final = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
"""KafkaConsumer's documented values (kafka-python 3.0.12). kafka-python compares them as written and checks them
nowhere: ``BOGUS`` connected as plaintext and was retried forever."""
LIBRDKAFKA_SASL_MECHANISMS: Final = ("GSSAPI", "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
"""librdkafka's ``sasl.mechanisms`` (alias ``sasl.mechanism``), per its CONFIGURATION.md: a string property, which
librdkafka checks only when it creates a client with a SASL protocol (its enum properties, such as
``security.protocol``, it refuses when they are set: :func:`librdkafka_problems`)."""


def _kafka_python_value_problem(key: str, value: Any) -> str | None:
    """What is wrong with the value of an enumerated kafka-python setting (None: fine, or not enumerated), checked
    against the lists and parsers kafka-python itself uses where it has them."""
    from kafka.net.manager import KafkaConnectionManager
    from kafka.net.sasl import SASL_MECHANISMS
    from kafka.protocol.consumer.offsets import IsolationLevel

    choices: dict[str, tuple[Any, ...]] = {
        "security_protocol": KAFKA_PYTHON_SECURITY_PROTOCOLS,
        "sasl_mechanism": tuple(sorted(SASL_MECHANISMS)),  # the mechanisms kafka-python registers
        "client_dns_lookup": KafkaConnectionManager._VALID_DNS_LOOKUP_MODES,
        "isolation_level": ("read_uncommitted", "read_committed"),
    }
    if key not in choices or (key == "sasl_mechanism" and value is None):
        return None
    if key == "isolation_level":
        try:
            IsolationLevel.build_from(value)  # kafka-python's own parser (read_committed, READ-COMMITTED, 1 ...)
            return None
        except (ValueError, TypeError):
            pass
    elif value in choices[key]:
        return None
    return f"{value!r} is not one of {', '.join(map(str, choices[key]))} (kafka-python's values)"


def kafka_python_problems(client: dict[str, Any]) -> list[tuple[str, str]]:
    """(key, problem) for each setting KafkaConsumer does not know (its own DEFAULT_CONFIG) or whose value is not
    one of an enumerated setting's values (``security_protocol: BOGUS``)."""
    from kafka import KafkaConsumer

    known = set(KafkaConsumer.DEFAULT_CONFIG)
    problems = []
    for key, value in client.items():
        if key in KAFKA_PYTHON_SET_BY_DAEMON:
            instead = KAFKA_PYTHON_SET_BY_DAEMON[key]
            problems.append((key, f"set by the daemon itself{f'; use {instead}' if instead else ''}"))
        elif key not in known:
            problems.append((key, "not a kafka-python KafkaConsumer setting (see KafkaConsumer.DEFAULT_CONFIG; "
                                  "kafka-python spells them with underscores, e.g. security_protocol)"))  # fmt: skip
        elif (problem := _kafka_python_value_problem(key, value)) is not None:
            problems.append((key, problem))
    return problems


def librdkafka_problems(client: dict[str, Any]) -> list[tuple[str, str]]:
    """(key, problem) for each property librdkafka refuses (unknown name or invalid value).

    Each property is set on a throwaway consumer config followed by a property that does not exist: librdkafka
    checks the properties in order and stops at the first it refuses, so the consumer is never created (no
    thread, no connection) and the error says whether the user's property or the sentinel was refused.
    """
    try:
        from confluent_kafka import Consumer, KafkaException
    except ImportError:
        return [("", "kafka.client_library is confluent-kafka, which is not installed: "
                     "pip install 'fairness-exporter[confluent]'")]  # fmt: skip
    problems = []
    for key, value in client.items():
        if key in ("sasl.mechanisms", "sasl.mechanism") and value not in LIBRDKAFKA_SASL_MECHANISMS:
            problems.append((key, f"{value!r} is not one of {', '.join(LIBRDKAFKA_SASL_MECHANISMS)} (librdkafka's "
                                  "SASL mechanisms)"))  # fmt: skip
            continue
        try:
            Consumer({"group.id": "validation", key: value, _SENTINEL: 1})
        except KafkaException as exc:
            message = exc.args[0].str() if hasattr(exc.args[0], "str") else str(exc)
            if _SENTINEL not in message:
                problems.append((key, f"{value!r} refused by librdkafka: {message}"))
        except (TypeError, ValueError) as exc:
            problems.append((key, f"{value!r} refused by confluent-kafka: {exc}"))
        else:  # pragma: no cover - the sentinel always fails; a consumer that got built must not linger
            problems.append((key, "could not be checked"))
    return problems
