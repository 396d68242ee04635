"""The maintenance steps, one module each (step.py says what a step is), and their registration: a run takes the
steps in this order on each of a sink's tables. A new step is its module and its line here (plus a migration, and its
counter in coordinator_service.log.maintenance_counters, when it counts something new)."""

from __future__ import annotations

from coordinator_service.engine.maintenance_steps import compaction, expiry, orphan_sweep, verification
from coordinator_service.engine.maintenance_steps.step import MaintenanceStep

STEPS: tuple[MaintenanceStep, ...] = (expiry.STEP, compaction.STEP, orphan_sweep.STEP, verification.STEP)
