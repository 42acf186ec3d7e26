"""The CI side: the audit gate, its reports and audit log, the seed-style Python API, and the safety and
red-team suites."""
