"""Exact order statistics of a column too large to hold: radix selection over repeated passes of its batches.

The LL144 scoring rate compares each score with the median of all scores; the median of 10^8 scores is found
here in four passes of the score column alone, 16 bits of the value at a time, in the memory of one histogram.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np

DIGIT_BITS = 16
_SIGN = np.uint64(1 << 63)


def sortable(values: np.ndarray) -> np.ndarray:
    """float64 values as uint64 keys in the same order (negative floats' bits flipped, positive ones' sign set)."""
    bits = np.ascontiguousarray(values, dtype=np.float64).view(np.uint64)
    return np.where(bits & _SIGN, ~bits, bits | _SIGN)


def unsortable(key: int) -> float:
    """The float64 of a :func:`sortable` key."""
    bits = np.uint64(key)
    raw = bits & ~_SIGN if bits & _SIGN else ~bits
    return float(np.array([raw], dtype=np.uint64).view(np.float64)[0])


def kth_smallest(read: Callable[[], Iterable[np.ndarray]], ranks: Sequence[int]) -> list[float]:
    """The values at 0-based ``ranks`` of the sorted column that ``read()`` yields in batches (no NaN): exactly, in
    64 / DIGIT_BITS passes over it, whatever its length."""
    prefixes = [0] * len(ranks)
    remaining = list(ranks)
    digits = 1 << DIGIT_BITS
    for done in range(0, 64, DIGIT_BITS):
        shift = 64 - done - DIGIT_BITS
        histograms = [np.zeros(digits, dtype=np.int64) for _ in ranks]
        for batch in read():
            keys = sortable(batch)
            for k, prefix in enumerate(prefixes):
                chosen = keys if done == 0 else keys[(keys >> np.uint64(shift + DIGIT_BITS)) == np.uint64(prefix)]
                histograms[k] += np.bincount(((chosen >> np.uint64(shift)) & np.uint64(digits - 1)).astype(np.int64),
                                             minlength=digits)  # fmt: skip
        for k, histogram in enumerate(histograms):
            below = np.cumsum(histogram)
            digit = int(np.searchsorted(below, remaining[k], side="right"))
            remaining[k] -= int(below[digit - 1]) if digit else 0
            prefixes[k] = (prefixes[k] << DIGIT_BITS) | digit
    return [unsortable(p) for p in prefixes]


def median(read: Callable[[], Iterable[np.ndarray]], n: int) -> float:
    """The median of n values as numpy and pandas compute it: the middle value, or the mean of the middle two."""
    values = kth_smallest(read, sorted({(n - 1) // 2, n // 2}))  # one rank when n is odd
    return float(np.mean([values[0], values[-1]]))
