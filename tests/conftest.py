"""Shared fixtures: the real Kafka-protocol broker (broker_fixture.py); tooling.py handles missing tools."""

pytest_plugins = ["broker_fixture"]
