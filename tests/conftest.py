"""Shared fixtures: the real Kafka-protocol broker (broker_fixture.py), daemons on it for both
client libraries (daemon_fixture.py), an S3 API on loopback (s3_fixture.py); tooling.py handles missing tools."""

pytest_plugins = ["broker_fixture", "daemon_fixture", "s3_fixture"]
