"""Shared fixtures: see tests/tooling.py for how missing tools are handled."""
