"""Kafka I/O: one consumer policy over two client libraries, dead letters, and the staged path's internal
topics and producer."""
