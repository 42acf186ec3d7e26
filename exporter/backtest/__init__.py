"""Backtest: recorded events replayed through the daemon's own decoder, windows, computation and detectors on a
simulated clock (input readers, the replay, the series it reports)."""
