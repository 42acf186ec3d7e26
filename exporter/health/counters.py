"""The daemon's own instrumentation: counters and gauges of its work, registered on the registry they are given.

Below both stream/ (which counts) and serve/ (which renders): it imports neither, so the arrows run one way. The
reasons of a counter are declared at 0 where they are listed: here, or (an event's reject and ignore reasons, a
payload half's) by the stream part whose rules produce them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Info

from exporter import __version__

OUTCOME_EXPIRY_REASONS = ("never_labelled", "unknown_prediction")
"""A prediction or a ground-truth event that waited the whole horizon for its other half."""
OUTCOME_DROP_REASONS = ("prediction_outside_window", "duplicate_label", "duplicate_prediction",
                        "invalid_label_event", "pending_state_full", "model_reconfigured")  # fmt: skip
"""Joins given up for another reason than time (``duplicate_prediction``: a later prediction with the same id
replaced the one waiting; ``model_reconfigured``: its model was removed, or its attributes changed, by a
reload; or a checkpoint restored without ``kafka.labels_topic`` held it, which nothing will join)."""
DEAD_LETTER_FAILURES = ("too_large", "no_producer", "send_failed")
PARTITION_RESETS = ("new_log", "beyond_end")
AUTH_FAILURES = ("no_credentials", "unknown_user", "wrong_password", "client_certificate_missing",
                 "client_certificate_invalid", "client_certificate_not_allowed", "tls_handshake_failed")
"""Reasons a request or a connection was refused (``tls_handshake_failed``: any other failed handshake, e.g.
plain HTTP on the TLS port, or a client that gave up)."""


class Health:
    """Counters and gauges of the daemon's own work, registered on the registry it is given."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._payloads: tuple[Counter, Counter] | None = None
        self.consumed = Counter("fairness_exporter_events_consumed", "Kafka messages read from the events topic.",
                                registry=registry)  # fmt: skip
        self.rejected = Counter("fairness_exporter_events_rejected",
                                "Events rejected as invalid, by reason; never counted in any window.",
                                ["reason"], registry=registry)  # fmt: skip
        self.late = Counter("fairness_exporter_events_late",
                            "Events older than the longest window plus allowed_lateness, dropped.", registry=registry)
        self.ignored = Counter("fairness_exporter_events_ignored",
                               "Events of no configured model, ignored, by reason: unconfigured_model (another "
                               "model id; the id itself is never a label) or missing_model_id.", ["reason"],
                               registry=registry)  # fmt: skip
        self.dead_lettered = Counter("fairness_exporter_events_dead_lettered",
                                     "Rejected events forwarded to the dead-letter topic.", registry=registry)
        self.outcomes_joined = Counter("fairness_exporter_labels_joined",
                                     "Delayed labels joined to their prediction and counted.", registry=registry)
        self.labels_expired = Counter("fairness_exporter_labels_expired",
                                      "Predictions never labelled, and labels of no known prediction, within the "
                                      "label horizon, by reason.", ["reason"], registry=registry)  # fmt: skip
        self.labels_dropped = Counter("fairness_exporter_labels_dropped",
                                      "Labels or waiting predictions given up for another reason than time, by "
                                      "reason.", ["reason"], registry=registry)  # fmt: skip
        self.pending_predictions = Gauge("fairness_exporter_pending_predictions",
                                    "Predictions held while waiting for their delayed label.", registry=registry)
        self.labels_clock_behind = Gauge("fairness_exporter_labels_clock_behind_seconds",
                                         "How far the labels' clock, by which waiting predictions expire, is behind "
                                         "the wall clock: how late delayed labels are read (0: on time, or no "
                                         "label timestamps).", registry=registry)  # fmt: skip
        self.dead_letter_failures = Counter("fairness_exporter_dead_letters_failed",
                                            "Rejected events that could not be forwarded to the dead-letter topic "
                                            "(still counted as rejected), by reason.", ["reason"],
                                            registry=registry)  # fmt: skip
        self.log_resets = Counter("fairness_exporter_partition_resets",
                                  "Partitions whose next offset the daemon moved, by reason: new_log (the topic was "
                                  "re-created, or a broker came back empty: read again from its start), beyond_end "
                                  "(the same log ends before the offset counted, a broker lost its tail: read on "
                                  "from its end, nothing counted twice).", ["reason"], registry=registry)  # fmt: skip
        self.batch_failures = Counter("fairness_exporter_batch_failures",
                                      "Tries to count a batch (a poll's predictions, a labels batch) that raised: "
                                      "each batch is tried 3 times, then record by record.", registry=registry)
        self.records_skipped = Counter("fairness_exporter_records_skipped",
                                       "Kafka records that could not be counted even alone after their batch failed: "
                                       "skipped (dead-lettered with kafka.dead_letter_topic), never counted.",
                                       registry=registry)  # fmt: skip
        self.model_resets = Counter("fairness_exporter_model_resets",
                                    "Models whose state started afresh because its layout changed, at start or on "
                                    "a reload, by what changed (reason); the old state is kept in a dated "
                                    "checkpoint file.", ["model_id", "reason"], registry=registry)  # fmt: skip
        self.checkpoint_failures = Counter("fairness_exporter_checkpoint_failures",
                                           "Checkpoints that could not be written; offsets stay uncommitted until "
                                           "one succeeds.", registry=registry)  # fmt: skip
        self.last_computation = Gauge("fairness_exporter_last_computation_timestamp_seconds",
                                      "Unix time of the last successful fairness computation.", registry=registry)
        self.computation_duration = Gauge("fairness_exporter_computation_duration_seconds",
                                          "Duration of the last fairness computation.", registry=registry)
        self.computation_errors = Counter("fairness_exporter_computation_errors",
                                          "Fairness computations that failed.", registry=registry)
        self.evaluation_interval = Gauge("fairness_exporter_evaluation_interval_seconds",
                                         "evaluation_interval: how often the fairness metrics are computed (as of "
                                         "the last config load).", registry=registry)  # fmt: skip
        self.last_checkpoint = Gauge("fairness_exporter_last_checkpoint_timestamp_seconds",
                                     "Unix time of the last durable checkpoint (0: none written since the start, or "
                                     "checkpoints disabled).", registry=registry)  # fmt: skip
        self.checkpoint_interval = Gauge("fairness_exporter_checkpoint_interval_seconds",
                                         "checkpoint.interval: how often the checkpoint file is written (0: no "
                                         "checkpoint file: none configured, or kafka.stages: staged, which snapshots "
                                         "into its internal topics).", registry=registry)  # fmt: skip
        self.started = Gauge("fairness_exporter_start_timestamp_seconds",
                             "Unix time this daemon started (the age of its first checkpoint counts from it).",
                             registry=registry)  # fmt: skip
        self.started.set_to_current_time()
        self.http_worker_restarts = Counter("fairness_exporter_http_worker_restarts",
                                            "HTTP worker processes (which serve /metrics and the probes) that "
                                            "exited and were started again.", registry=registry)  # fmt: skip
        self.clock_jumps = Counter("fairness_exporter_clock_jumps",
                                   "Steps of the wall clock not followed: the daemon keeps time by the steady clock "
                                   "until a jumped wall clock has held its new offset for 10 minutes.",
                                   registry=registry)  # fmt: skip
        self.window_rewinds = Counter("fairness_exporter_window_rewinds",
                                      "Times a model's window head, ahead of the clock by more than max_future_skew "
                                      "(a checkpoint written while the clock ran ahead, or the clock set back since "
                                      "it did), was brought back to the clock, its buckets after now dropped.",
                                      registry=registry)  # fmt: skip
        self.http_auth_failures = Counter("fairness_exporter_http_auth_failures",
                                          "Requests and TLS handshakes the web configuration refused (401 or a "
                                          "failed handshake), by reason.", ["reason"], registry=registry)
        self.consumer_errors = Counter("fairness_exporter_consumer_errors",
                                       "Errors talking to Kafka (the consumer retries).", registry=registry)
        self.partitions_shared = Gauge("fairness_exporter_partitions_shared",
                                       "1 while another member of this direct-path replica's consumer group holds "
                                       "some partitions of its topics: it counts nothing until it holds them all "
                                       "again (kafka.stages: direct is one replica; use staged for several).",
                                       registry=registry)  # fmt: skip
        self.models = Gauge("fairness_exporter_models", "Models this daemon monitors (as of the last config load).",
                            registry=registry)  # fmt: skip
        self.reload_failures = Counter("fairness_exporter_config_reload_failures",
                                       "Config reloads refused (invalid, or a change that needs a restart); the "
                                       "previous config keeps running.", registry=registry)  # fmt: skip
        self.reload_successful = Gauge("fairness_exporter_config_last_reload_successful",
                                       "1 when the last config load or reload was applied, 0 when it was refused.",
                                       registry=registry)  # fmt: skip
        self.reload_timestamp = Gauge("fairness_exporter_config_last_reload_success_timestamp_seconds",
                                      "Unix time of the last config load or reload that was applied.",
                                      registry=registry)  # fmt: skip
        Info("fairness_exporter_build", "Build information.", registry=registry).info({"version": __version__})
        for reason in OUTCOME_EXPIRY_REASONS:
            self.labels_expired.labels(reason)
        for reason in OUTCOME_DROP_REASONS:
            self.labels_dropped.labels(reason)
        for reason in AUTH_FAILURES:
            self.http_auth_failures.labels(reason)
        for reason in DEAD_LETTER_FAILURES:
            self.dead_letter_failures.labels(reason)
        for reason in PARTITION_RESETS:
            self.log_resets.labels(reason)

    def payload_counters(self, reasons: Iterable[str]) -> tuple[Counter, Counter]:
        """The payload formats' pair counters (``events.format`` kserve or seldon), registered on first use so that a
        daemon of our own events shows none: calls whose request and response were joined, and halves never counted
        by reason (``reasons``, declared at 0: exporter/stream/payloads/payload.py UNMATCHED_REASONS, and the staged
        join's own)."""
        if self._payloads is None:
            joined = Counter("fairness_exporter_payload_pairs_joined", "Calls of a payload log (KServe, Seldon) whose "
                             "request and response were joined into rows.", registry=self.registry)  # fmt: skip
            unmatched = Counter("fairness_exporter_payload_halves_unmatched",
                                "Requests or responses of a payload log never counted, by reason: delivered twice, "
                                "no partner within events.pair_horizon, partner refused, or the join full.",
                                ["reason"], registry=self.registry)  # fmt: skip
            self._payloads = (joined, unmatched)
        for reason in reasons:  # each caller's reasons at 0, whichever asked first (the staged join's pieces_missing)
            self._payloads[1].labels(reason)
        return self._payloads

    def count_outcomes(self, given_up: Mapping[str, int]) -> None:
        """Count predictions and labels that will never be joined, under expired or dropped by reason."""
        for reason, n in given_up.items():
            family = self.labels_expired if reason in OUTCOME_EXPIRY_REASONS else self.labels_dropped
            family.labels(reason).inc(n)


RESTORE_RESULTS = ("restored", "fresh", "missing")
"""How a staged task's state began on assignment: from the snapshot its committed offset names, empty because
nothing was committed yet, or empty because the log no longer holds that snapshot (an error)."""
STAGES = ("join", "counts")


class StageHealth:
    """The staged path's own counters (registered only when ``kafka.stages`` is staged)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.replayed = Counter("fairness_exporter_replayed_rows",
                                "Rows of internal records skipped because their source position was already "
                                "applied (a stage re-read its input after a crash or a rebalance), by receiving "
                                "stage.", ["stage"], registry=registry)  # fmt: skip
        self.restores = Counter("fairness_exporter_state_restores",
                                "States of join or counts partitions begun on assignment, by result: restored "
                                "(from the snapshot the committed offset names), fresh (nothing committed yet) or "
                                "missing (the log no longer holds the snapshot: started empty).",
                                ["stage", "result"], registry=registry)  # fmt: skip
        self.unreadable = Counter("fairness_exporter_internal_records_unreadable",
                                  "Records of the internal topics that are no internal record of a format this "
                                  "daemon reads; skipped.", ["topic"], registry=registry)  # fmt: skip
        self.snapshots = Counter("fairness_exporter_state_snapshots",
                                 "Snapshots of join or counts partitions written and acknowledged.", ["stage"],
                                 registry=registry)  # fmt: skip
        self.snapshot_failures = Counter("fairness_exporter_state_snapshot_failures",
                                         "Snapshot rounds of this replica's join and counts partitions that failed (a "
                                         "snapshot not sent or not acknowledged): their offsets stay uncommitted "
                                         "until a round succeeds, so a restart re-reads ever more.",
                                         registry=registry)  # fmt: skip
        self.last_snapshot = Gauge("fairness_exporter_last_state_snapshot_timestamp_seconds",
                                   "Unix time of the last snapshot round in which every snapshot due was acknowledged "
                                   "(a round with none due counts: a replica with no task never ages; 0: no round "
                                   "since the start).", registry=registry)  # fmt: skip
        self.snapshot_interval = Gauge("fairness_exporter_state_snapshot_interval_seconds",
                                       "checkpoint.interval: how often the staged tasks' state is snapshotted (as of "
                                       "the last config load).", registry=registry)  # fmt: skip
        self.stopped = Gauge("fairness_exporter_stage_tasks_stopped",
                             "Join or counts partitions whose task stopped on an internal record it could not apply "
                             "in 3 tries (each from its last snapshot): read, never applied, until a restart or "
                             "another replica takes the partition; /readyz names each.", ["stage"],
                             registry=registry)  # fmt: skip
        for stage in STAGES:
            self.replayed.labels(stage)
            self.stopped.labels(stage)
            self.snapshots.labels(stage)
            for result in RESTORE_RESULTS:
                self.restores.labels(stage, result)


Owned = tuple[str, str, int, bool, float | None, float | None]
"""(model id, counts topic, partition, owned here, start of the bucket of its last detector step, start of its
window's newest bucket)."""
