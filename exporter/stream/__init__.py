"""The streaming side: Kafka source, event decoding, label join, event-time windows, checkpoints."""
