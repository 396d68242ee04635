"""A sink's maintenance as the admin API shows it: the policy in force, the sink's overrides, the runs."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt

from coordinator_service.engine.operator.answers import MaintenanceView
from coordinator_service.settings.maintenance import MaintenancePolicy


class MaintenanceRunResponse(BaseModel):
    id: int
    trigger: str = Field(
        description="schedule (the coordinator's timing), threshold (a commit took a table past a bound: its "
        "snapshots, small files or delete files) or operator (POST .../maintenance/run)."
    )
    started_at: datetime
    finished_at: datetime | None
    outcome: str = Field(description="running, ok or failed.")
    error: str | None
    snapshots_expired: int
    expired_files_deleted: int = Field(description="Files only the expired snapshots referenced, deleted.")
    files_compacted: int
    files_written: int
    bytes_rewritten: int
    delete_files_merged: int = Field(
        description="Position delete files merged into one per partition (a keyed table's updates and deletes)."
    )
    swept: bool = Field(description="Whether the run looked for orphan files.")
    orphans_deleted: int

    model_config = ConfigDict(from_attributes=True)


class MaintenanceResponse(BaseModel):
    policy: MaintenancePolicy = Field(description="The settings in force for this sink's table.")
    overrides: dict[str, Any] = Field(description="The sink's own values, over the coordinator's defaults.")
    runs: list[MaintenanceRunResponse] = Field(description="The last runs, newest first.")

    @classmethod
    def of(cls, view: MaintenanceView) -> MaintenanceResponse:
        return cls(
            policy=view.policy,
            overrides=view.overrides,
            runs=[MaintenanceRunResponse.model_validate(run) for run in view.runs],
        )


class MaintenanceOverridesRequest(BaseModel):
    overrides: dict[str, StrictBool | StrictInt | StrictFloat] = Field(
        description="Settings of the maintenance policy (the names of GET .../maintenance's policy) that this "
        "sink's table uses instead of the coordinator's; {} goes back to the defaults.",
        max_length=50,
    )
