"""The chart refuses, at render time, several replicas of the direct path in one consumer group.

docs/sre/scale-out.md ("The direct path is one replica"): two direct replicas with `assignment: subscribe` in one
group would each hold part of every model, so a second one refuses (`serve` exits 2, the pod crash-loops), and one
that loses partitions later counts nothing (FairnessExporterPartitionsShared, critical). `replicaCount: 2` with
`config.kafka.stages: direct`, which values.yaml invites ("set `config.kafka.stages` to override"), would render a
Deployment, or with checkpoints a StatefulSet, of two members of one group: a release that can never be whole, so
`helm template` fails naming both keys. `assignment: manual` (each replica reads every partition) makes several
direct replicas valid, and they still render.
"""

from __future__ import annotations

import pytest
from test_helm import CHART, CI, RELEASE, daemon_config, helm, render, run_helm, workload  # noqa: F401

pytestmark = pytest.mark.helm

DIRECT_PAIR = ("--set", "replicaCount=2", "--set", "config.kafka.stages=direct")


@pytest.mark.parametrize("extra", [(), ("--set", "checkpoint.enabled=true")], ids=["deployment", "statefulset"])
def test_two_subscribed_direct_replicas_are_refused_at_render_time(helm: str, extra: tuple[str, ...]) -> None:  # noqa: F811
    result = run_helm(helm, "template", RELEASE, str(CHART), "--values", str(CI["default"]), *DIRECT_PAIR, *extra)
    if result.returncode == 0:
        kind = workload(render(helm, "default", *DIRECT_PAIR, *extra))["kind"]
        pytest.fail(f"replicaCount=2 with kafka.stages: direct (assignment: subscribe) was accepted: it rendered "
                    f"{kind} of 2")
    assert "stages" in result.stderr and "replicaCount" in result.stderr, result.stderr


def test_two_direct_replicas_reading_every_partition_still_render(helm: str) -> None:  # noqa: F811
    """The case the refusal must not catch: assignment: manual, each replica whole (duplicates, not splits)."""
    objects = render(helm, "default", *DIRECT_PAIR, "--set", "config.kafka.assignment=manual")
    assert workload(objects)["spec"]["replicas"] == 2
    kafka = daemon_config(objects)["kafka"]
    assert (kafka["stages"], kafka["assignment"]) == ("direct", "manual")
