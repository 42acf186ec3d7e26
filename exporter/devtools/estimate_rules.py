"""The estimate's own alert, FairnessEstimateInvalid: a subgroup's labels no longer follow its calibrated scores, so
the estimated metrics (``model_*_estimated``) are not to be trusted. It says nothing of the model's fairness, and no
fairness alert reads an estimate. Its `for:` and severity are in the TUNING table of exporter/devtools/rules.py."""

from __future__ import annotations

from typing import Any

from exporter.devtools.rule_text import VALUE_3F, alert, label, own
from exporter.stream.state.detectors import Alert

DETECTOR = "fairness_calibration_detector_statistic"
ALARM = "fairness_calibration_detector_alarm"


def calibration_alert(rule: Alert, for_: str) -> dict[str, Any]:
    """The alerting rule: while a calibration detector is in alarm, showing the calibration statistic per window."""
    where = f"subgroup {label('subgroup')} of {label('attribute')}, predicted class {label('predicted')}"
    statistic = ('{{ range printf "model_calibration_statistic{model_id=%q,attribute=%q,subgroup=%q,predicted=%q,'
                 'instance=%q}" $labels.model_id $labels.attribute $labels.subgroup $labels.predicted '
                 '$labels.instance | query | sortByLabel "window" }}{{ .Labels.window }}: '
                 '{{ printf "%.1f" .Value }}; {{ end }}')  # fmt: skip
    return alert(
        rule.name,
        f"{own(DETECTOR)}\nand\n{own(ALARM)} == 1",
        for_,
        rule.severity,
        f"Model {label('model_id')}: the estimated fairness metrics no longer hold for {label('subgroup')}.",
        f"Model {label('model_id')}, {where}, direction {label('direction')}: the labels that arrived no longer "
        f"follow the subgroup's calibrated scores (the calibration detector on {label('instance')} is in alarm, "
        f"evidence now {VALUE_3F} nats): concept shift, or labels selected by the decision. The model_*_estimated "
        "series of this attribute rest on that calibration and are not to be trusted; this says nothing of the "
        f"model's fairness itself. Calibration statistic now: {statistic}",
    )
