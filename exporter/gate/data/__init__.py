"""Datasets where they live, read in record batches: their files and manifest (files), the reader (dataset), the
gate's rules for a column's values (columns), exact order statistics in passes (quantile), side tables (side)."""
