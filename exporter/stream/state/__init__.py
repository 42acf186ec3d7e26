"""State that outlives a poll: event-time windows, change detectors, the label join, the fleet of models, the
clock and durable checkpoints."""
