"""The alerts on replicas: the staged path's stages (a model owned by exactly one replica, and stepping; a task
stopped; its snapshots written, and found again on a restore), the label join of either path, a direct replica that
shares its consumer group, and a log found shorter than what was counted; their thresholds, `for:` and severities
are in the TUNING table of exporter/devtools/rules.py."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from exporter.devtools.health_rules import CHECKPOINT_INTERVALS, unwritten
from exporter.devtools.rule_text import VALUE_0F, alert, configured, fmt, label, own

LABEL_JOIN_WINDOW = "1h"  # FairnessExporterLabelJoinBroken: rate() window
CUT_WINDOW = "1h"  # FairnessExporterLogCutShort: increase() window (one partition found keeps it an hour)
MISSING_WINDOW = "1h"  # FairnessExporterStateSnapshotMissing: increase() window (one empty start keeps it an hour)
OWNED = own("fairness_exporter_model_owned")


def stage_alerts(tuning: Mapping[str, Any], fors: Mapping[str, str]) -> list[dict[str, Any]]:
    """The nine alerts, with each one's severity and threshold from ``tuning`` and ``for:`` from ``fors``."""

    def tuned(name: str, expr: str, summary: str, description: str) -> dict[str, Any]:
        return alert(name, expr, fors[name], tuning[name].severity, summary, description)

    buckets = fmt(tuning["FairnessExporterModelStalled"].threshold or 0)
    expired = own("fairness_exporter_labels_expired_total", 'reason="unknown_prediction"')
    unknown = f"rate({expired}[{LABEL_JOIN_WINDOW}])"
    joined = f"rate({own('fairness_exporter_labels_joined_total')}[{LABEL_JOIN_WINDOW}])"
    fleet = "sum without (instance, pod, reason)"
    model, partition, topic, job = label("model_id"), label("partition"), label("topic"), label("job")
    snapshot_interval = "fairness_exporter_state_snapshot_interval_seconds"
    restores_missing = own("fairness_exporter_state_restores_total", 'result="missing"')
    resets_beyond_end = own("fairness_exporter_partition_resets_total", 'reason="beyond_end"')
    margin = fmt(tuning["FairnessExporterStateSnapshotFailing"].threshold or 0)
    return [
        tuned(
            "FairnessExporterModelUnowned",
            f"max without (instance, pod) ({OWNED}) == 0",
            f"Model {model} is evaluated by no replica.",
            f"No replica of {job} has held partition {partition} of {topic}, which holds model {model}, for "
            f"{fors['FairnessExporterModelUnowned']}: its windows, detectors and series are on no /metrics, so none "
            "of its fairness alerts can fire.",
        ),
        tuned(
            "FairnessExporterModelOwnedTwice",
            f"sum without (instance, pod) ({OWNED}) > 1",
            f"Model {model} is evaluated by {VALUE_0F} replicas.",
            f"{VALUE_0F} replicas of {job} have exported model {model} (partition {partition} of {topic}) for "
            f"{fors['FairnessExporterModelOwnedTwice']}: each sees part of its traffic, so neither's numbers nor "
            "detectors are the model's.",
        ),
        tuned(
            "FairnessExporterModelStalled",
            f"(time() - {own('fairness_exporter_model_head_timestamp_seconds')})\n"
            f"  > on (job, instance) group_left () ({buckets} * {own('fairness_exporter_bucket_seconds')})\n"
            f"and on (job, instance, model_id) (\n  {OWNED} == 1\n"
            f"  and on (job, instance, topic, partition) {own('fairness_exporter_consumer_lag_messages')} > 0\n)",
            f"Model {model} stopped being evaluated on {label('instance')} while its counts wait.",
            f"The window of model {model} on {label('instance')} last moved "
            "{{ $value | humanizeDuration }} ago, more than " + buckets + " buckets, while its partition of the "
            f"counts topic has unread records, for {fors['FairnessExporterModelStalled']}: its evaluation stage is "
            "stuck and its numbers are frozen.",
        ),
        tuned(
            "FairnessExporterLabelJoinBroken",
            f"{fleet} ({unknown})\n/\n({fleet} ({unknown})\n + sum without (instance, pod) ({joined}))\n"
            "> on (job, namespace) group_left () max without (instance, pod) "
            f"({own('fairness_exporter_labels_max_unjoined_share')})",
            f"Delayed labels of {job} find no prediction.",
            f"Over the last {LABEL_JOIN_WINDOW}, {{{{ $value | humanizePercentage }}}} of the delayed labels that "
            f"{job} joined or gave up found no prediction within label_horizon, above alerting.max_unjoined_share, "
            f"for {fors['FairnessExporterLabelJoinBroken']}: the label join is broken (labels carrying another "
            "prediction_id than the predictions, or labels of a model not monitored), not late. TPR, FPR and "
            "equalised odds miss those labels.",
        ),
        tuned(
            "FairnessExporterPartitionsShared",
            f"{own('fairness_exporter_partitions_shared')} == 1",
            f"fairness-exporter {label('instance')} counts nothing: another member shares its consumer group.",
            f"{label('instance')} runs kafka.stages: direct, and another member of its consumer group has held some "
            f"partitions of its topics for {fors['FairnessExporterPartitionsShared']}: it counts nothing until it "
            "holds them all again (its windows, detectors and alerts are frozen; /readyz says so), rather than count "
            "a part of every model. Run one direct replica, or kafka.stages: staged for several.",
        ),
        tuned(
            "FairnessExporterStageTaskStopped",
            f"{own('fairness_exporter_stage_tasks_stopped')} > 0",
            f"fairness-exporter {label('instance')} stopped {VALUE_0F} {label('stage')} task(s).",
            f"{label('instance')} has held {VALUE_0F} {label('stage')} partition(s) whose task stopped on an "
            "internal record it could not apply in 3 tries (each from its last snapshot), for "
            f"{fors['FairnessExporterStageTaskStopped']}: what they hold is read but never counted (a counts "
            "partition's models, or the labels and payload halves of a join partition) until a restart or another "
            "replica takes them. /readyz and the log name each partition, offset and error.",
        ),
        tuned(
            "FairnessExporterStateSnapshotFailing",
            unwritten("fairness_exporter_last_state_snapshot_timestamp_seconds", snapshot_interval, margin),
            f"fairness-exporter {label('instance')} cannot snapshot its staged tasks.",
            f"{label('instance')} has had no snapshot round in which every snapshot due of its join and counts tasks "
            "was acknowledged for {{ $value | humanizeDuration }} (counted from its start if none since), more than "
            f"{CHECKPOINT_INTERVALS} times its checkpoint.interval ({configured(snapshot_interval)}) plus {margin}s, "
            f"for {fors['FairnessExporterStateSnapshotFailing']}: none of its tasks' offsets is committed meanwhile, "
            "so a restart or a rebalance reads ever more of the internal topics again (nothing lost, nothing counted "
            "twice), and starts a task empty once the topic's retention has taken its last committed snapshot. "
            "fairness_exporter_state_snapshot_failures_total counts the failed rounds; the log names the error.",
        ),
        tuned(
            "FairnessExporterStateSnapshotMissing",
            f"increase({restores_missing}[{MISSING_WINDOW}]) > "
            f"{fmt(tuning['FairnessExporterStateSnapshotMissing'].threshold or 0)}",
            f"fairness-exporter {label('instance')} started {label('stage')} tasks empty: their snapshot was gone.",
            f"{label('instance')} has started {{{{ $value | humanize }}}} {label('stage')} partition(s) empty within "
            f"the last {MISSING_WINDOW} (pending for {fors['FairnessExporterStateSnapshotMissing']}) because the "
            "snapshot their committed offset names was no longer in the log (the internal topic's retention shorter "
            "than the time since it was written) or could not be read: what they counted before it is gone. A counts "
            "partition's models count their windows again from zero (half-counted until a whole window has passed, "
            "their detectors' history lost); a join partition's waiting predictions never meet their labels. Its "
            "log names each partition and offset.",
        ),
        tuned(
            "FairnessExporterLogCutShort",
            f"increase({resets_beyond_end}[{CUT_WINDOW}]) > "
            f"{fmt(tuning['FairnessExporterLogCutShort'].threshold or 0)}",
            f"fairness-exporter {label('instance')} found a Kafka log shorter than what it had counted.",
            f"{label('instance')} has found {{{{ $value | humanize }}}} partition(s) within the last {CUT_WINDOW} "
            f"(pending for {fors['FairnessExporterLogCutShort']}) whose log, the same topic's, ends before the "
            "offset it had counted (a broker that lost the log's tail, a checkpoint restored against an older broker "
            "state): it reads on from the end, so nothing is counted twice, but records written to the cut log "
            "before it was seen, below its end, are not counted. Its log names each partition, the offset and the "
            "end.",
        ),
    ]
