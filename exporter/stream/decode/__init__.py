"""Decode: raw Kafka values become validated columns per model (event schema, field paths, routing by model,
timestamps, outcomes)."""
