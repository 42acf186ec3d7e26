"""The staged path (``kafka.stages: staged``): ingest, label join and evaluation as stages of one consumer
group, joined by internal topics keyed by what the next stage groups on."""
