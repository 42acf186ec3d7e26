"""Review 33: the seed's three alerts run as the seed wrote them.

The seed's PrometheusRule puts its three rules in one group evaluated every 300 s:

    spec:
      groups:
        - name: fairness-monitoring
          interval: 300s
          rules: [FairnessDemographicParityDrift > 0.05 for 30m, FairnessDisparateImpactViolation < 0.80 for 30m,
                  SubgroupPredictionRateShift |1h avg - 7d avg| > 0.1 for 1h]

The interval is part of what a `for:` means: at 300 s, `for: 30m` asks for 7 evaluations in a row above the
threshold and a dip between two evaluations is never seen; at Prometheus' global default (1m) it asks for 31, and
any one-minute dip restarts the clock. promtool, on the shipped rules with a series at 0.07 that dips to 0.04 at
12m only: evaluated every 5m (the seed's group) the warning fires at 30m; evaluated every 1m (the shipped group,
which sets no interval) it fires at 43m. The shipped group of the seed's literal rules must keep the seed's
interval."""

from __future__ import annotations

from exporter.devtools import rules as generate

SEED_INTERVAL = "300s"
SEED_RULES = ("FairnessDemographicParityAboveThreshold", "FairnessDisparateImpactBelowThreshold",
              "SubgroupPredictionRateAverageShift")  # the seed's three rules, as shipped (renamed, non-paging)


def test_the_seed_rules_group_is_evaluated_every_300s_as_the_seed_wrote() -> None:
    groups = generate.rule_file()["groups"]
    holding = [g for g in groups if {r.get("alert") for r in g["rules"]} & set(SEED_RULES)]
    assert len(holding) == 1, [g["name"] for g in holding]
    (group,) = holding
    assert {r.get("alert") for r in group["rules"]} == set(SEED_RULES)
    assert group.get("interval") == SEED_INTERVAL, (
        f"group {group['name']} sets interval {group.get('interval')!r} (the global evaluation interval, 1m by "
        f"default), the seed's is {SEED_INTERVAL}")
