"""`fairness-exporter demo`: everything on one machine with nothing set up by hand."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
from importlib.resources import files

from exporter.config import load_config
from exporter.daemon import Daemon
from exporter.devtools.embedded_broker import BrokerError, EmbeddedBroker
from exporter.devtools.synthetic import TrafficGenerator

log = logging.getLogger(__name__)
DEMO_CONFIG = files("exporter") / "examples" / "demo.yaml"


def run_demo(port: int = 9108, rate: float = 200.0, drift_after: float = 180.0) -> int:
    """Start a broker, synthetic traffic and the daemon; block until SIGINT/SIGTERM; stop all three."""
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    try:
        broker = EmbeddedBroker()
        broker.start()
    except BrokerError as exc:
        log.error("%s", exc)
        return 1
    with broker:
        os.environ["FAIRNESS_DEMO_BOOTSTRAP"] = broker.bootstrap_servers
        config = load_config(str(DEMO_CONFIG))
        config = dataclasses.replace(config, listen_port=port)
        broker.create_topic(config.kafka.topic, partitions=3)
        traffic = TrafficGenerator(broker.bootstrap_servers, config.kafka.topic, rate=rate, drift_after=drift_after)
        daemon = Daemon(config)
        daemon.start()
        traffic.start()
        print(f"\n  fairness-exporter demo: broker at {broker.bootstrap_servers}, {rate:g} events/s, "
              f"bias drift after {drift_after:g}s\n  metrics:  http://127.0.0.1:{daemon.port}/metrics\n"
              f"  try:      curl -s localhost:{daemon.port}/metrics | grep model_disparate_impact_ratio\n"
              "  Ctrl-C stops the broker, the traffic and the daemon.\n", flush=True)  # fmt: skip
        try:
            done.wait()
        finally:
            log.info("stopping the demo (%d events produced)", traffic.produced)
            traffic.stop()
            daemon.stop()
    return 0
