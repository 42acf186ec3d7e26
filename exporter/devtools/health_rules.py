"""The alerts on the daemon's own health: its target down or absent, its consumer stalled or failing, its
computation stale, events rejected or dropped as late, checkpoints failing, records skipped, a config reload
refused, no model monitored; their thresholds,
`for:` and severities are in the TUNING table of exporter/devtools/rules.py."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from exporter.config.sections_stream import CHECKPOINT_SECONDS
from exporter.devtools.rule_text import JOB, alert, configured, fmt, label, own

STALL_WINDOW = "10m"  # FairnessExporterConsumerStalled: rate() and delta() window
REJECT_WINDOW = "15m"  # FairnessExporterHighRejectRate, FairnessExporterHighLateRate: rate() window
ERROR_WINDOW = "10m"  # FairnessExporterConsumerErrors: rate() window
SKIP_WINDOW = "1h"  # FairnessExporterRecordsSkipped: increase() window (one skipped record keeps it an hour)
STALE_INTERVALS = 3
"""FairnessExporterComputationStale: the last computation older than this many evaluation intervals, and than the
floor in TUNING. One failed or slow computation leaves it 2 intervals old, which pages nobody at a long interval;
at the default interval (15s) the floor holds, as before the interval was read."""
CHECKPOINT_INTERVALS = 2
"""FairnessExporterCheckpointFailing: the last checkpoint (the start, if none yet) older than this many checkpoint
intervals plus the margin in TUNING. One failed checkpoint between two good ones leaves it 2 intervals old."""
INTERVAL_HELD = f"{round(CHECKPOINT_SECONDS[1] / 60) + 15}m"
"""How long a checkpoint interval still counts once a reload shortened it: longer than the longest interval the
config accepts, so a checkpoint at the new interval is due before the old interval's threshold goes."""


def unwritten(last: str, interval: str, margin: str) -> str:
    """The age of a replica's last durable state (``last``; its start if none since), where it passes
    :data:`CHECKPOINT_INTERVALS` times its ``interval`` (the longest within :data:`INTERVAL_HELD`) plus ``margin``
    seconds: the direct path's checkpoint and the staged path's snapshot rounds alike."""
    start = own("fairness_exporter_start_timestamp_seconds")
    # group_left keeps the target's labels (its namespace, that the chart's AlertmanagerConfig routes on) that a
    # one-to-one `on (job, instance)` would drop from the alert
    return (f"time() - (\n  {own(last)} > 0\n  or on (job, instance) {start}\n)\n"
            f"  > on (job, instance) group_left ()\n  ({CHECKPOINT_INTERVALS} * "
            f"max_over_time({own(interval)}[{INTERVAL_HELD}]) + {margin})")


def health_alerts(tuning: Mapping[str, Any], fors: Mapping[str, str]) -> list[dict[str, Any]]:
    """The twelve alerts, with each one's severity and threshold from ``tuning`` and ``for:`` from ``fors``."""

    def tuned(name: str, expr: str, for_: str, summary: str, description: str) -> dict[str, Any]:
        return alert(name, expr, for_, tuning[name].severity, summary, description)

    stale = fmt(tuning["FairnessExporterComputationStale"].threshold or 0)
    margin = fmt(tuning["FairnessExporterCheckpointFailing"].threshold or 0)
    checkpoint_interval = "fairness_exporter_checkpoint_interval_seconds"
    reject = tuning["FairnessExporterHighRejectRate"].threshold or 0
    late = tuning["FairnessExporterHighLateRate"].threshold or 0
    lag = own("fairness_exporter_consumer_lag_messages")
    consumed = own("fairness_exporter_events_consumed_total")
    return [
        tuned(
            "FairnessExporterDown",
            f"{own('up')} == 0",
            fors["FairnessExporterDown"],
            f"fairness-exporter target {label('instance')} is down.",
            f"Prometheus has failed to scrape {label('instance')} (job {label('job')}) for "
            f"{fors['FairnessExporterDown']}: the fairness metrics it computes are not updated.",
        ),
        tuned(
            "FairnessExporterAbsent",
            f"absent({own('up')})",
            fors["FairnessExporterAbsent"],
            "No fairness-exporter target is scraped.",
            f'Prometheus has had no target with job="{JOB}" for {fors["FairnessExporterAbsent"]}: no fairness '
            "metric is collected and no fairness alert can fire.",
        ),
        tuned(
            "FairnessExporterConsumerStalled",
            f"sum without (topic, partition) ({lag}) > 0\n"
            f"and sum without (topic, partition) (delta({lag}[{STALL_WINDOW}])) >= 0\n"
            f"and rate({consumed}[{STALL_WINDOW}]) == 0",
            fors["FairnessExporterConsumerStalled"],
            f"fairness-exporter {label('instance')} consumes no events while its lag is not decreasing.",
            f"{label('instance')} has consumed no Kafka message for {STALL_WINDOW} while "
            "{{ $value | humanize }} messages wait in its partitions and the lag is not decreasing, for "
            f"{fors['FairnessExporterConsumerStalled']}: its fairness windows no longer follow the traffic.",
        ),
        tuned(
            "FairnessExporterComputationStale",
            f"time() - {own('fairness_exporter_last_computation_timestamp_seconds')}\n"
            f"  > on (job, instance) group_left () clamp_min({STALE_INTERVALS} * "  # group_left: see unwritten()
            f"{own('fairness_exporter_evaluation_interval_seconds')}, {stale})",
            fors["FairnessExporterComputationStale"],
            f"fairness-exporter {label('instance')} has stopped computing fairness metrics.",
            f"The last successful fairness computation on {label('instance')} was "
            "{{ $value | humanizeDuration }} ago, more than " + str(STALE_INTERVALS) + " times its "
            f"evaluation_interval ({configured('fairness_exporter_evaluation_interval_seconds')}) and more than "
            f"{stale}s, for {fors['FairnessExporterComputationStale']}: /metrics serves a frozen snapshot.",
        ),
        tuned(
            "FairnessExporterHighRejectRate",
            f"sum without (reason) (rate({own('fairness_exporter_events_rejected_total')}[{REJECT_WINDOW}]))\n"
            f"/\nrate({consumed}[{REJECT_WINDOW}])\n> {fmt(reject)}",
            fors["FairnessExporterHighRejectRate"],
            f"fairness-exporter {label('instance')} rejects more than {reject:.0%} of consumed events.",
            f"{label('instance')} rejected "
            "{{ $value | humanizePercentage }} of the events it consumed over the last "
            f"{REJECT_WINDOW} (threshold {reject:.0%}) for {fors['FairnessExporterHighRejectRate']}: "
            "the fairness metrics describe only the accepted part of the traffic.",
        ),
        tuned(
            "FairnessExporterHighLateRate",
            f"rate({own('fairness_exporter_events_late_total')}[{REJECT_WINDOW}])\n"
            f"/\nrate({consumed}[{REJECT_WINDOW}])\n> {fmt(late)}",
            fors["FairnessExporterHighLateRate"],
            f"fairness-exporter {label('instance')} drops more than {late:.0%} of consumed events as late.",
            f"{label('instance')} dropped as late "
            "{{ $value | humanizePercentage }} of the events it consumed over the last "
            f"{REJECT_WINDOW} (threshold {late:.0%}) for {fors['FairnessExporterHighLateRate']}: events older than "
            "its longest window plus allowed_lateness are counted in no window, so the fairness metrics describe "
            "only the rest of the traffic.",
        ),
        tuned(
            "FairnessExporterKafkaUnreachable",
            f"{own('fairness_exporter_kafka_connected')} == 0",
            fors["FairnessExporterKafkaUnreachable"],
            f"fairness-exporter {label('instance')} reaches no Kafka broker.",
            f"No Kafka broker has answered the consumer of {label('instance')} for "
            f"{fors['FairnessExporterKafkaUnreachable']} (its /readyz says so too): its lag is unknown and its "
            "fairness windows stop following the traffic.",
        ),
        tuned(
            "FairnessExporterConsumerErrors",
            f"rate({own('fairness_exporter_consumer_errors_total')}[{ERROR_WINDOW}]) > "
            f"{fmt(tuning['FairnessExporterConsumerErrors'].threshold or 0)}",
            fors["FairnessExporterConsumerErrors"],
            f"fairness-exporter {label('instance')} keeps getting Kafka consumer errors.",
            f"The Kafka consumer of {label('instance')} has reported errors for "
            f"{fors['FairnessExporterConsumerErrors']} ({{{{ $value | humanize }}}}/s over {ERROR_WINDOW}): "
            "connection failures, failed commits or a consumer being rebuilt.",
        ),
        tuned(
            "FairnessExporterCheckpointFailing",
            unwritten("fairness_exporter_last_checkpoint_timestamp_seconds", checkpoint_interval, margin)
            + f"\nand on (job, instance) {own(checkpoint_interval)} > 0",
            fors["FairnessExporterCheckpointFailing"],
            f"fairness-exporter {label('instance')} cannot write its checkpoint.",
            f"{label('instance')} has written no checkpoint for {{{{ $value | humanizeDuration }}}} (counted from "
            f"its start if it wrote none since), more than {CHECKPOINT_INTERVALS} times its checkpoint.interval "
            f"({configured(checkpoint_interval)}) plus {margin}s, for {fors['FairnessExporterCheckpointFailing']}: "
            "no offset is committed meanwhile, and a restart would resume from the last good checkpoint, reading "
            "(not losing) the events since. fairness_exporter_checkpoint_failures_total counts the failed writes.",
        ),
        tuned(
            "FairnessExporterRecordsSkipped",
            f"increase({own('fairness_exporter_records_skipped_total')}[{SKIP_WINDOW}]) > "
            f"{fmt(tuning['FairnessExporterRecordsSkipped'].threshold or 0)}",
            fors["FairnessExporterRecordsSkipped"],
            f"fairness-exporter {label('instance')} skipped Kafka records it could not count.",
            f"{label('instance')} has skipped records for {fors['FairnessExporterRecordsSkipped']} "
            f"({{{{ $value | humanize }}}} over the last {SKIP_WINDOW}): their batch failed 3 times and each failed "
            "alone too. They are dead-lettered (with kafka.dead_letter_topic) and never counted; its log names each "
            "with the error.",
        ),
        tuned(
            "FairnessExporterConfigReloadFailed",
            f"time() - {own('fairness_exporter_config_last_reload_success_timestamp_seconds')}\n"
            f"and on (job, instance) {own('fairness_exporter_config_last_reload_successful')} == 0",
            fors["FairnessExporterConfigReloadFailed"],
            f"fairness-exporter {label('instance')} refused its new config.",
            f"The last config reload of {label('instance')} was refused (invalid, or a change that needs a "
            f"restart) for {fors['FairnessExporterConfigReloadFailed']}: it still runs the config it applied "
            "{{ $value | humanizeDuration }} ago, so models added or changed since are not monitored as configured. "
            "Its log names every error.",
        ),
        tuned(
            "FairnessExporterNoModel",
            f"{own('fairness_exporter_models')} == 0",
            fors["FairnessExporterNoModel"],
            f"fairness-exporter {label('instance')} monitors no model.",
            f"The config of {label('instance')} has had no model for {fors['FairnessExporterNoModel']} (its "
            "models_dir is empty: the chart's model ConfigMaps were not found, or not copied): every event it reads "
            "is ignored, no fairness number is computed for anybody, and its /readyz answers 503.",
        ),
    ]
