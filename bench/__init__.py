"""Benchmarks of fairness-exporter (not tests): ingest, computation and scrape, each against a baseline measured
in the same run. ``python -m bench`` runs all three; see bench/__main__.py."""
