"""The CI side: the audit gate, its reports and audit log, and the seed-style Python API."""
