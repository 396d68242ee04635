"""The torture harness's registry of fault kinds (tests/torture/fault_kinds/) against the faults a run can draw.

A name in fault_kinds.FAULTS without a registered kind would be drawn and never
injected; a kind registered twice would be injected by whichever came last.
"""

from __future__ import annotations

from collections import Counter

import pytest

from tests.torture.fault_kinds import FAULTS, KINDS, REGISTRY, FaultKind, Trigger, drawn
from tests.torture.faults import FaultPlan, FaultRecord


def test_every_fault_has_exactly_one_registered_kind_and_every_kind_a_fault() -> None:
    registered = Counter(kind.name for kind in KINDS)
    assert {name: count for name, count in registered.items() if count != 1} == {}
    assert set(registered) == set(FAULTS)
    assert set(REGISTRY) == set(FAULTS)


def test_a_kind_without_a_thread_acts_through_a_hook_of_the_run() -> None:
    for kind in KINDS:
        if kind.trigger is Trigger.SUPERVISOR:
            hooks = (kind.configure, kind.prepare, kind.plan_writers, kind.first_job, kind.after_failure)
            assert any(hook is not None for hook in hooks), kind.name


def test_a_kind_with_a_thread_has_an_act_and_one_without_has_none() -> None:
    for kind in KINDS:
        assert (kind.act is None) == (kind.trigger is Trigger.SUPERVISOR), kind.name
    with pytest.raises(ValueError, match="an act"):
        FaultKind("nameless", Trigger.AT_BATCH)


def test_the_run_calls_the_hooks_in_faults_order_whatever_order_the_plan_drew() -> None:
    names = ("topic_recreated", "coordinator_kill", "many_sinks")
    records_of = {name: FaultRecord(FaultPlan(name, 1, 0.0)) for name in names}
    assert [kind.name for kind, _ in drawn(records_of)] == sorted(names, key=FAULTS.index)
