"""The counts-based core: subgroups, counts, rates, intervals, evaluation. Pure functions; imports nothing of ours."""
