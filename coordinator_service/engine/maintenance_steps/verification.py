"""The verification step (VERIFICATION_ENABLED, off by default): every VERIFICATION_INTERVAL_SECONDS (and at an
operator's run) the sink is verified from where its last verification stood, once a run (at its own table: the
verifier takes all of the sink's tables), with Kafka when VERIFICATION_BOOTSTRAP_SERVERS is set. A fault found fails
no maintenance: it is recorded (sink_verifications, the verification_failed gauge, the alert); a table or the metastore
that cannot be read fails the run as any step's failure does."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from coordinator_service.engine.maintenance_steps.step import MaintenanceStep, RunOccasion, StepContext
from coordinator_service.engine.verification.runs import VerificationRuns
from coordinator_service.engine.verification.topic_offsets import KafkaAccess
from coordinator_service.log.commit_lock import CommitLock
from coordinator_service.log.models import MaintenanceRun, MaintenanceTrigger, Sink
from coordinator_service.settings import Settings
from coordinator_service.settings.maintenance import MaintenancePolicy


class Verification(MaintenanceStep):
    name = "verify"
    policy_fields: tuple[str, ...] = ("verification_enabled", "verification_interval_seconds")
    counters: tuple[str, ...] = ()

    def wanted(self, policy: MaintenancePolicy, occasion: RunOccasion) -> bool:
        return policy.verification_enabled

    async def run(
        self,
        context: StepContext,
        sink: Sink,
        identifier: str,
        policy: MaintenancePolicy,
        lock: CommitLock,
        run: MaintenanceRun,
    ) -> None:
        if identifier != sink.table_identifier:
            return
        runs = VerificationRuns(context.database, context.tables)
        checked = [record.checked_at for record in await runs.records(sink.name)]
        interval = timedelta(seconds=policy.verification_interval_seconds)
        if run.trigger != MaintenanceTrigger.OPERATOR and checked and datetime.now(UTC) - min(checked) < interval:
            return
        await runs.run(sink.name, kafka_of(context.settings), incremental=True)


def kafka_of(settings: Settings) -> KafkaAccess | None:
    servers = settings.verification_bootstrap_servers
    return None if servers is None else KafkaAccess(servers, settings.verification_kafka_options)


STEP = Verification()
