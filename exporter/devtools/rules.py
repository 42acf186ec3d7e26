"""Generate rules/fairness-exporter.rules.yaml, the PrometheusRule shipped with fairness-exporter.

Every threshold, `for:` duration and severity lives in TUNING (the range windows beside each alert's code); the
committed YAML is a generated artifact and a test fails when it is out of date.

    python -m exporter.devtools.rules            # rewrite rules/fairness-exporter.rules.yaml
    python -m exporter.devtools.rules --check    # exit 1 when the committed file differs from the generated one
    python -m exporter.devtools.rules --plain    # print the plain promtool rule file (the PrometheusRule's spec)

Tests import it as ``exporter.devtools.rules``: ``rule_file(for_durations="5s")`` gives the
promtool/Prometheus rule file with every `for:` set to 5s.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, NamedTuple

import yaml

from exporter.devtools.estimate_rules import calibration_alert
from exporter.devtools.health_rules import health_alerts
from exporter.devtools.recording_rules import recording_rules
from exporter.devtools.rule_text import JOB, VALUE_3F, alert, explained, own
from exporter.devtools.rule_text import RUNBOOK_URL as RUNBOOK_URL  # where every alert's runbook_url points
from exporter.devtools.rule_text import fmt as _fmt
from exporter.devtools.rule_text import label as _label
from exporter.devtools.stage_rules import stage_alerts
from exporter.stream.state.detectors import ALERTS, CALIBRATION_METRIC, Alert


class Tuning(NamedTuple):
    """How sensitive one alert is: the value it compares against, how long it must hold, whom it pages."""

    threshold: float | None
    for_: str
    severity: Literal["critical", "warning"]


DETECTOR_FOR = "0m"
"""The detectors page as soon as they raise an alarm: the evidence is already accumulated, and the false-alarm
budget counts alarms, so a `for:` would only delay the page."""

# fmt: off
TUNING: dict[str, Tuning] = {
    # the change detectors (exporter/stream/state/detectors.py ALERTS): while a detector is in alarm
    **{alert.name: Tuning(None, DETECTOR_FOR, alert.severity) for alert in ALERTS},
    # The seed's literal rules, non-paging: model_demographic_parity_difference > threshold
    "FairnessDemographicParityAboveThreshold": Tuning(0.05, "30m", "warning"),
    # model_disparate_impact_ratio < threshold (four-fifths rule, NYC LL144 impact ratio)
    "FairnessDisparateImpactBelowThreshold":   Tuning(0.80, "30m", "warning"),
    # |1h average - 7d average| of a subgroup's selection rate > threshold
    "SubgroupPredictionRateAverageShift":      Tuning(0.10, "1h",  "warning"),
    # up == 0 for one target; rebalancing hands its partitions to the other replicas
    "FairnessExporterDown":             Tuning(None, "5m",  "warning"),
    # no target at all: every fairness alert is blind, nothing else can fire
    "FairnessExporterAbsent":           Tuning(None, "10m", "critical"),
    # nothing consumed over STALL_WINDOW while the lag is > 0 and not decreasing
    "FairnessExporterConsumerStalled":  Tuning(None, "10m", "warning"),
    # seconds since the last successful computation > 3 evaluation intervals (health_rules.py), and > threshold
    "FairnessExporterComputationStale": Tuning(300,  "5m",  "warning"),
    # rejected / consumed over REJECT_WINDOW > threshold
    "FairnessExporterHighRejectRate":   Tuning(0.05, "10m", "warning"),
    # late (dropped: older than the longest window + allowed_lateness) / consumed over REJECT_WINDOW > threshold
    "FairnessExporterHighLateRate":     Tuning(0.05, "10m", "warning"),
    # fairness_exporter_kafka_connected == 0: no broker answers this replica's consumer
    "FairnessExporterKafkaUnreachable": Tuning(None, "5m",  "warning"),
    # consumer errors per second over ERROR_WINDOW > threshold (a broker outage, refused commits, a bad setting)
    "FairnessExporterConsumerErrors":   Tuning(0,    "15m", "warning"),
    # seconds since the last checkpoint (or the start) > 2 checkpoint intervals + threshold: offsets stay uncommitted
    "FairnessExporterCheckpointFailing": Tuning(300, "5m",  "warning"),
    # records skipped over SKIP_WINDOW > threshold: a batch failed 3 times and these records failed alone too
    "FairnessExporterRecordsSkipped":   Tuning(0,    "5m",  "warning"),
    # fairness_exporter_config_last_reload_successful == 0: a reload was refused, the previous config still runs
    "FairnessExporterConfigReloadFailed": Tuning(None, "5m", "warning"),
    # fairness_exporter_models == 0: the config monitors no model (an empty models_dir): every event is ignored
    "FairnessExporterNoModel":          Tuning(None, "10m", "critical"),
    # the staged path: no replica owns a model (its detectors and series are gone): every alert of it is blind
    "FairnessExporterModelUnowned":     Tuning(None, "5m",  "critical"),
    # two replicas export one model (a zombie, or partitions added to the counts topic under running replicas)
    "FairnessExporterModelOwnedTwice":  Tuning(None, "5m",  "warning"),
    # a model's last detector step is older than threshold buckets while its counts partition has lag
    "FairnessExporterModelStalled":     Tuning(3,    "5m",  "warning"),
    # labels of no known prediction / (those + labels joined) over 1h (stage_rules.py) > alerting.max_unjoined_share
    "FairnessExporterLabelJoinBroken":  Tuning(None, "15m", "warning"),
    # a direct replica shares its consumer group: it counts nothing until it holds every partition again (blind)
    "FairnessExporterPartitionsShared": Tuning(None, "5m",  "critical"),
    "FairnessExporterStageTaskStopped": Tuning(None, "5m",  "warning"),  # staged: a task stopped on a record
    "FairnessExporterLogCutShort":      Tuning(0,    "5m",  "warning"),  # a partition beyond its log's end
    # staged: no snapshot round all acknowledged for 2 checkpoint intervals + threshold (stage_rules.py): no commit
    "FairnessExporterStateSnapshotFailing": Tuning(300, "5m", "warning"),
    # staged: a task started empty within MISSING_WINDOW (stage_rules.py): its committed snapshot was gone from the log
    "FairnessExporterStateSnapshotMissing": Tuning(0,   "5m", "warning"),
}
# fmt: on

SEED_INTERVAL = "300s"
"""The seed's rule group's `interval:`, kept for its three rules: a `for:` counts evaluations this far apart (at
300s, `for: 30m` is 7 evaluations in a row, and a dip between two is not seen; at the global 1m, 31). `backtest`
and the alerts benchmark evaluate them as often; promtool's unit tests ignore a group's interval, so those of the
seed rules set `evaluation_interval: 5m`."""
SHIFT_RECENT = "1h"  # SubgroupPredictionRateAverageShift compares the average over this window ...
SHIFT_BASELINE = "7d"  # ... with the average over this one
RECORDING_WINDOWS = ("1h", "24h")  # increase() windows of the fleet-wide recording rules

OUTPUT = Path(__file__).resolve().parents[2] / "rules" / "fairness-exporter.rules.yaml"  # run from a source tree
HEADER = (
    "# Generated by exporter/devtools/rules.py from the TUNING table at its top: edit that, then run\n"
    "# `python -m exporter.devtools.rules` (`--check` verifies this file is up to date). Do not edit by hand.\n"
)

def _effective_for(for_durations: str | Mapping[str, str] | None) -> dict[str, str]:
    """The `for:` of every alert: TUNING's, or all set to one duration, or some replaced by alert name."""
    durations = {name: tuning.for_ for name, tuning in TUNING.items()}
    if isinstance(for_durations, str):
        return dict.fromkeys(durations, for_durations)
    unknown = sorted(set(for_durations or {}) - set(durations))
    if unknown:
        raise ValueError(f"for_durations names unknown alerts {unknown}; known alerts: {sorted(durations)}")
    return durations | dict(for_durations or {})


def _alert(name: str, expr: str, for_: str, summary: str, description: str) -> dict[str, Any]:
    """One alerting rule with the severity from TUNING."""
    return alert(name, expr, for_, TUNING[name].severity, summary, description)


PAIR_DETECTOR = "fairness_detector_statistic"
PAIR_ALARM = "fairness_detector_alarm"
SUBGROUP_DETECTOR = "fairness_subgroup_detector_statistic"
SUBGROUP_ALARM = "fairness_subgroup_detector_alarm"
_WHAT = {
    "FairnessDemographicParityDrift": ("demographic parity drift", "the selection rates have moved apart by "
                                       "the demographic_parity_difference threshold or more"),
    "FairnessDisparateImpactViolation": ("disparate impact", "the lower selection rate has fallen to the "
                                         "disparate_impact_ratio threshold times the higher one or below"),
    "FairnessEqualisedOddsDrift": ("equalised odds drift", "the true or false positive rates have moved apart by "
                                   "the equalised_odds_difference threshold or more"),
    "SubgroupPredictionRateShift": ("selection rate shift", "the selection rate has moved from its own baseline "
                                    "by alerting.rate_shift or more"),
}


def _shown(family: str, keys: tuple[str, ...]) -> str:
    """An annotation fragment listing `family` with its 95% interval in every window, for the alert's series."""
    def selector(name: str, window: bool) -> str:
        labels = [*keys, "instance"]
        matchers = ",".join(f"{k}=%q" for k in labels) + (",window=%q" if window else "")
        args = " ".join(f"$labels.{k}" for k in labels) + (" .Labels.window" if window else "")
        return f'printf "{name}{{{matchers}}}" {args}'

    bound = '{{{{ with {} | query }}}}{{{{ . | first | value | printf "%.3f" }}}}{{{{ end }}}}'
    return (
        f'{{{{ range {selector(family, False)} | query | sortByLabel "window" }}}}'
        '{{ .Labels.window }}: {{ printf "%.3f" .Value }} (95% interval '
        + bound.format(selector(family + "_lower", True)) + " to " + bound.format(selector(family + "_upper", True))
        + "); {{ end }}"
    )


def _detector_alert(alert: Alert, fors: Mapping[str, str]) -> dict[str, Any]:
    """A paging alert of the detectors: while a detector is in alarm, showing its evidence and the gap now."""
    subgroup = alert.metrics == ("positive_prediction_rate",)
    series, alarm = (SUBGROUP_DETECTOR, SUBGROUP_ALARM) if subgroup else (PAIR_DETECTOR, PAIR_ALARM)
    metric = () if subgroup else (f'metric="{alert.metrics[0]}"' if len(alert.metrics) == 1
                                  else f'metric=~"{"|".join(alert.metrics)}"',)  # fmt: skip
    what, meaning = _WHAT[alert.name]
    where = (f"subgroup {_label('subgroup')} of {_label('attribute')}" if subgroup else
             f"{_label('group_a')} vs {_label('group_b')} ({_label('attribute')}, dimension {_label('dimension')})")
    shown_keys = ("model_id", "attribute", "subgroup") if subgroup else ("model_id", "attribute", "dimension")
    return _alert(
        alert.name,
        f"{own(series, *metric)}\nand\n{own(alarm, *metric)} == 1",
        fors[alert.name],
        f"Model {_label('model_id')}: evidence of {what} for "
        + (_label("subgroup") if subgroup else _label("dimension")) + ".",
        f"Model {_label('model_id')}, {where}, direction {_label('direction')}: the change detector on "
        f"{_label('instance')} is in alarm (evidence now {VALUE_3F} nats): {meaning} (the detector's reference "
        f"value). Now: {_shown(alert.shown, shown_keys)}{'' if subgroup else explained(alert.metrics)}",
    )


def _fairness_alerts(fors: Mapping[str, str]) -> list[dict[str, Any]]:
    """The paging alerts: one per detector alert of exporter/stream/state/detectors.py."""
    return [calibration_alert(alert, fors[alert.name]) if alert.metrics == (CALIBRATION_METRIC,) else
            _detector_alert(alert, fors) for alert in ALERTS]  # fmt: skip


def _seed_alerts(fors: Mapping[str, str]) -> list[dict[str, Any]]:
    """The seed's literal rules on the raw values, kept as non-paging warnings (they fire on noise)."""
    dpd = _fmt(TUNING["FairnessDemographicParityAboveThreshold"].threshold or 0)
    di = _fmt(TUNING["FairnessDisparateImpactBelowThreshold"].threshold or 0)
    shift = _fmt(TUNING["SubgroupPredictionRateAverageShift"].threshold or 0)
    pair = f"{_label('group_a')} vs {_label('group_b')} ({_label('attribute')}, dimension {_label('dimension')})"
    rate = own("model_positive_prediction_rate", 'subgroup!="overall"')
    return [
        _alert(
            "FairnessDemographicParityAboveThreshold",
            f"{own('model_demographic_parity_difference')} > {dpd}",
            fors["FairnessDemographicParityAboveThreshold"],
            f"Model {_label('model_id')}: demographic parity difference above {dpd} for {_label('dimension')}.",
            f"Model {_label('model_id')}, {pair}: the selection rates differ by {VALUE_3F} over the "
            f"{_label('window')} window on {_label('instance')}, above the {dpd} threshold for "
            f"{fors['FairnessDemographicParityAboveThreshold']}.",
        ),
        _alert(
            "FairnessDisparateImpactBelowThreshold",
            f"{own('model_disparate_impact_ratio')} < {di}",
            fors["FairnessDisparateImpactBelowThreshold"],
            f"Model {_label('model_id')}: disparate impact ratio below {di} for {_label('dimension')}.",
            f"Model {_label('model_id')}, {pair}: the lower selection rate is {VALUE_3F} of the higher one over "
            f"the {_label('window')} window on {_label('instance')}, below the {di} (four-fifths) threshold for "
            f"{fors['FairnessDisparateImpactBelowThreshold']}.",
        ),
        # Every `window` label is kept: its values come from the daemon's config, so selecting window="1h"
        # would silently disable the alert for `windows: [30m, 6h]`. The label keeps the series apart, and
        # Alertmanager grouping by model_id/attribute/subgroup folds them into one notification.
        _alert(
            "SubgroupPredictionRateAverageShift",
            f"abs(\n  avg_over_time({rate}[{SHIFT_RECENT}])\n  -\n  avg_over_time({rate}[{SHIFT_BASELINE}])\n)"
            f" > {shift}",
            fors["SubgroupPredictionRateAverageShift"],
            f"Model {_label('model_id')}: selection rate of subgroup {_label('subgroup')} moved from its "
            f"{SHIFT_BASELINE} baseline.",
            f"Model {_label('model_id')}, subgroup {_label('subgroup')} of {_label('attribute')} "
            f"({_label('window')} window, {_label('instance')}): the {SHIFT_RECENT} average of the selection "
            f"rate differs from its {SHIFT_BASELINE} average by {VALUE_3F}, more than {shift}, for "
            f"{fors['SubgroupPredictionRateAverageShift']}.",
        ),
    ]


def rule_file(*, for_durations: str | Mapping[str, str] | None = None,
              seed_interval: str | None = SEED_INTERVAL) -> dict[str, Any]:  # fmt: skip
    """The plain Prometheus/promtool rule file `{"groups": [...]}` (the PrometheusRule's `spec`).

    `for_durations`: None keeps TUNING's `for:`; a duration string such as "5s" sets every alert's `for:`;
    a mapping {alert name: duration} replaces only those alerts' (unknown names raise ValueError).
    `seed_interval`: the seed rules' evaluation interval (None: the server's global one, as a test with short
    `for:` durations wants)."""
    fors = _effective_for(for_durations)
    return {
        "groups": [
            {
                "name": "fairness-exporter.recording",
                "rules": [rule for window in RECORDING_WINDOWS for rule in recording_rules(window)],
            },
            {"name": "fairness-exporter.detectors", "rules": _fairness_alerts(fors)},
            {"name": "fairness-exporter.seed-rules", **({"interval": seed_interval} if seed_interval else {}),
             "rules": _seed_alerts(fors)},
            {"name": "fairness-exporter.serve.self_metrics", "rules": health_alerts(TUNING, fors)},
            {"name": "fairness-exporter.stages", "rules": stage_alerts(TUNING, fors)},
        ]
    }


def prometheus_rule(*, for_durations: str | Mapping[str, str] | None = None) -> dict[str, Any]:
    """The Kubernetes PrometheusRule object (prometheus-operator) wrapping `rule_file(...)` as its spec."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": JOB, "labels": {"app.kubernetes.io/name": JOB}},
        "spec": rule_file(for_durations=for_durations),
    }


class _Dumper(yaml.SafeDumper):
    """Writes multi-line strings (PromQL expressions) as `|` blocks so the YAML reads like the source."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _str)


def render(document: Mapping[str, Any]) -> str:
    """YAML text of a rule document, keys in insertion order, expressions as block scalars."""
    return yaml.dump(document, Dumper=_Dumper, sort_keys=False, width=1_000, allow_unicode=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help=f"fail if {OUTPUT.name} is not up to date")
    mode.add_argument("--plain", action="store_true", help="print the plain promtool rule file to stdout")
    args = parser.parse_args(argv)
    if args.plain:
        sys.stdout.write(render(rule_file()))
        return 0
    expected = HEADER + render(prometheus_rule())
    if args.check:
        if not OUTPUT.exists() or OUTPUT.read_text(encoding="utf-8") != expected:
            print(f"{OUTPUT} is out of date: run `python -m exporter.devtools.rules`", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(expected, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
