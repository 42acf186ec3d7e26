"""The daemon's health: its own counters (counters.py) and bounded-rate logging (logs.py), imported by stream/ and
serve/ alike and importing neither."""
