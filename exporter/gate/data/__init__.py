"""Datasets where they live, read in record batches: the reader (dataset), the gate's column rules (columns), exact order statistics in passes (quantile)."""
