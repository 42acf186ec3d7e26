"""The vectorised ISO timestamp parser against the rule it stands in for (``datetime.fromisoformat`` +
``.timestamp()``, naive means UTC): the same epoch seconds to the bit, or no answer (the rule decides then)."""

from __future__ import annotations

from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from exporter.stream.decode.timestamps import _LAYOUT, epoch, epochs, iso_epochs


def _two(lo: int, hi: int) -> st.SearchStrategy[str]:
    return st.integers(lo, hi).map(lambda v: f"{v:02d}")


zones = (st.sampled_from(["", "Z", "z", "+05", "+0530", "-00:00", "+00:00", "+24:00", "-23:59", "+05:75"])
         | st.tuples(st.sampled_from("+-"), _two(0, 25), _two(0, 61)).map("{0[0]}{0[1]}:{0[2]}".format))  # fmt: skip
fractions = st.sampled_from(["", "."]) | st.text("0123456789", min_size=1, max_size=11).map(lambda f: "." + f)
stamps = st.builds(
    "{}-{}-{}{}{}:{}:{}{}{}".format,
    st.integers(0, 9999).map(lambda y: f"{y:04d}") | st.sampled_from(["1969", "1970", "2000", "2100", "2255", "1685"]),
    _two(0, 13), _two(0, 32), st.sampled_from(["T", "T", " ", "t"]), _two(0, 25), _two(0, 61), _two(0, 61),
    fractions, zones,
)  # fmt: skip
near = st.datetimes().map(lambda d: d.isoformat()) | st.datetimes().map(lambda d: d.isoformat() + "Z")
anything: Any = stamps | near | st.floats() | st.integers(-(2**60), 2**60) | st.text(max_size=30) | st.none()


def certified(stamp: str) -> bool:
    """A layout the fast path must answer: years well inside float64's exact microseconds, offsets up to 23:59."""
    m = _LAYOUT.fullmatch(stamp)
    offset = m.group(2) if m else None
    return (m is not None and "1700" < stamp[:4] < "2200"
            and (offset in (None, "Z") or (offset[1:3] <= "23" and offset[4:] <= "59")))  # fmt: skip


def bits(values: Any) -> list[str | None]:
    return [None if v is None else float(v).hex() for v in values]


@settings(max_examples=2000, deadline=None)
@given(stamps | near)
@example("2026-12-01T12:59:48.821358Z")
@example("2026-12-01T12:59:48.821358+05:30")
@example("2024-02-29T23:59:59.999999-11:45")
@example("2023-02-29T00:00:00Z")
@example("2026-12-01T12:59:48")
@example("1970-01-01T00:00:00.1")
@example("2026-12-02T04:18:34.123456789Z")
@example("2026-12-02T04:18:34.9999999+05:30")
def test_one_stamp_is_the_rule_or_no_answer(stamp: str) -> None:
    want = epoch(stamp)
    got = iso_epochs([stamp])
    if got is not None:
        assert want is not None and bits(got) == bits([want])
    elif want is not None and certified(stamp):
        raise AssertionError(f"{stamp!r}: a certified layout, yet no answer")


@settings(max_examples=1000, deadline=None)
@given(st.lists(stamps | near, min_size=1, max_size=6) | st.lists(anything, min_size=1, max_size=6)
       | st.tuples(stamps, st.integers(1, 5)).map(lambda t: [t[0]] * t[1]))  # fmt: skip
def test_a_batch_is_the_rule_everywhere(batch: list[Any]) -> None:
    want = bits(map(epoch, batch))
    got = iso_epochs(batch)
    assert got is None or bits(got) == want
    assert bits(epochs(batch)) == want


def test_rows_cannot_slip_out_of_line() -> None:
    """Strings whose lengths add up to whole rows, and that hold the separator, are never read as rows."""
    a = "2026-12-01T12:59:48.821358Z"
    assert iso_epochs([a, a + "|" + a, a[:-1], "Z"]) is None
    assert iso_epochs([a + "|" + a[:-1], "Z", a]) is None
    assert iso_epochs([a, a]) is not None


def test_the_usual_layouts_get_an_answer() -> None:
    """Z, offsets, naive, with or without fractions (nanoseconds as Knative writes them: truncated to the
    microsecond, as the rule does): every stamp of a batch of one layout, exact."""
    for batch in (["2026-12-01T12:59:48.821358Z", "2026-12-01T12:59:49.000001Z"],
                  ["2026-12-01T12:59:48+05:30", "1999-12-31T23:59:59-08:00"],
                  ["2026-12-01T12:59:48.5", "2026-12-01T12:59:48.7"], ["2026-12-01T12:59:48.123Z"],
                  ["2026-12-02T04:18:34.123456789Z", "2026-12-02T04:18:34.999999999Z"]):  # fmt: skip
        got = iso_epochs(batch)
        assert got is not None and bits(got) == bits(map(epoch, batch))
    assert iso_epochs(["2026-12-01T12:59:48Z", "2026-12-01T12:59:48.5Z"]) is None  # two layouts: the rule decides
    assert iso_epochs(["2026-12-01T12:59:48Z", 1.5]) is None
