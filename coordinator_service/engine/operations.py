"""What operators may see and do to sinks: list them, read their epochs, abort an epoch, reset, reconcile or resume a
sink, remove a table from it, delete it, set and run its maintenance, verify it.

Like coordinator_service.engine.protocol, this knows no transport: the admin API
(admin.routes_sinks, admin.api) and the command line map its results and errors.
Operations is made of one part per concern in coordinator_service.engine.operator
(epochs.py: reads, abort, reset; tables.py: a table removed, a sink deleted;
reconcile.py: reconcile, resume; verification.py: verify; answers.py: what they answer); the lists and the
maintenance settings are here.
"""

from __future__ import annotations

import structlog
from pydantic import ValidationError

from coordinator_service.contract.errors import InvalidArgument, quote
from coordinator_service.engine.maintenance import policy_of
from coordinator_service.engine.operator.answers import MaintenanceView, Operator, SinkOverview
from coordinator_service.engine.operator.base import check_known_name, sink_named, sink_overviews
from coordinator_service.engine.operator.epochs import EpochActions
from coordinator_service.engine.operator.reconcile import ReconcileActions
from coordinator_service.engine.operator.tables import TableActions
from coordinator_service.engine.operator.verification import VerificationActions
from coordinator_service.log import maintenance_log
from coordinator_service.log.models import MaintenanceRun
from coordinator_service.log.sink_rows import RowLock

log = structlog.get_logger(__name__)


class Operations(EpochActions, TableActions, ReconcileActions, VerificationActions):
    """Every operator action (the admin API's and the command line's), made of one part per concern."""

    async def sinks(self) -> list[SinkOverview]:
        async with self.database.transaction() as session:
            return await sink_overviews(session, self.committer.health, self.settings.stalled_after_seconds)

    async def maintenance(self, name: str, runs: int) -> MaintenanceView:
        check_known_name(name)
        async with self.database.transaction() as session:
            sink = await sink_named(session, name)
            recorded = await maintenance_log.maintenance_runs(session, sink.id, runs)
        return MaintenanceView(policy_of(self.settings, sink), dict(sink.maintenance_overrides or {}), recorded)

    async def set_maintenance_overrides(
        self, name: str, overrides: dict[str, object], operator: Operator, runs: int
    ) -> MaintenanceView:
        """Replace the sink's overrides of the maintenance defaults ({} goes back to the defaults); a name that
        is no setting or a value out of range is refused, nothing changed."""
        check_known_name(name)
        try:
            self.settings.with_overrides(overrides)
        except ValidationError as error:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
            raise InvalidArgument(f"maintenance overrides refused: {quote(problems)}") from None
        async with self.database.transaction() as session:
            sink = await sink_named(session, name, lock=RowLock.UPDATE)
            sink.maintenance_overrides = overrides or None
        log.warning(
            "maintenance settings of a sink changed",
            sink=name,
            who=operator.identity,
            client=operator.address,
            overrides=overrides,
        )
        return await self.maintenance(name, runs)

    async def run_maintenance(self, name: str, operator: Operator) -> MaintenanceRun:
        """Maintain the sink's table now (the orphan sweep included), holding its commit lock; Unavailable,
        nothing done, when its committer keeps the lock past ADMIN_LOCK_TIMEOUT_SECONDS."""
        check_known_name(name)
        async with self.database.transaction() as session:
            sink = await sink_named(session, name)
        log.info("maintenance run asked by an operator", sink=name, who=operator.identity, client=operator.address)
        return await self.maintainer.run_now(sink.id)
