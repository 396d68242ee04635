"""An operator's verification of a sink (`sink-coordinator verify`, POST /api/v1/sinks/{sink}/verify) and where the
verification of its tables stands (GET .../verification)."""

from __future__ import annotations

from coordinator_service.engine.operator.base import OperationsBase, check_known_name
from coordinator_service.engine.verification.findings import Verification
from coordinator_service.engine.verification.runs import VerificationRuns
from coordinator_service.engine.verification.topic_offsets import KafkaAccess
from coordinator_service.log.models import VerificationRecord


class VerificationActions(OperationsBase):
    @property
    def verifications(self) -> VerificationRuns:
        return VerificationRuns(self.database, self.iceberg)

    async def verify_sink(self, name: str, kafka: KafkaAccess | None = None, incremental: bool = False) -> Verification:
        """Verify the sink's tables (from the start, or from where each was proven with `incremental`), and record
        the outcome; a verification reads and changes no table."""
        check_known_name(name)
        return await self.verifications.run(name, kafka, incremental)

    async def verification(self, name: str) -> list[VerificationRecord]:
        check_known_name(name)
        return await self.verifications.records(name)
