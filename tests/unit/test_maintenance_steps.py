"""The maintenance steps' registry against what stores, counts and shows their work: each counter a step declares is
a column of maintenance_runs, a Prometheus counter and a field of the admin API's run, and nothing else is; each
policy field a step reads is the policy's, and the policy has no field that neither a step nor the run reads."""

from __future__ import annotations

from collections import Counter

from sqlalchemy import BigInteger, Integer

from coordinator_service import metrics
from coordinator_service.admin.maintenance_schemas import MaintenanceRunResponse
from coordinator_service.engine.maintenance_steps import STEPS
from coordinator_service.log.models import MaintenanceRun
from coordinator_service.settings.maintenance import MaintenancePolicy

# What the run reads itself (whether and how often a sink is maintained), and what the commits set on the tables.
RUN_POLICY = frozenset(
    {
        "maintenance_enabled",
        "maintenance_interval_seconds",
        "maintenance_rate_limit_seconds",
        "manifest_merge_min_count",
    }
)


def test_every_step_has_a_name_of_its_own() -> None:
    names = Counter(step.name for step in STEPS)
    assert {name for name, count in names.items() if count > 1} == set()


def test_each_counter_of_a_run_is_exactly_one_steps_and_is_stored_counted_and_shown() -> None:
    declared = Counter(counter for step in STEPS for counter in step.counters)
    assert {counter for counter, count in declared.items() if count > 1} == set()
    columns = {
        column.name
        for column in MaintenanceRun.__table__.columns
        if isinstance(column.type, Integer | BigInteger) and not column.primary_key and not column.foreign_keys
    }
    assert set(declared) == columns
    assert set(declared) == set(metrics.MAINTENANCE_WORK)
    assert set(declared) <= set(MaintenanceRunResponse.model_fields)


def test_each_policy_field_is_read_by_the_run_or_by_exactly_one_step() -> None:
    read = Counter(field for step in STEPS for field in step.policy_fields)
    assert {field for field, count in read.items() if count > 1} == set()
    assert set(read) | RUN_POLICY == set(MaintenancePolicy.model_fields)
    assert not set(read) & RUN_POLICY
