"""What Prometheus sees: the computed snapshot, its collector and exposition, HTTP, and self-metrics."""
