"""How the coordinator maintains a sink's tables: the defaults, and each sink's overrides of them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from pydantic import (
    BaseModel,
    ByteSize,
    ConfigDict,
    Field,
)

from coordinator_service.settings.bounds import INT32_MAX, TEN_YEARS, THIRTY_DAYS, FileBytes


class MaintenancePolicy(BaseModel):
    """How the coordinator maintains a sink's table: the coordinator's settings, or a sink's overrides of them
    (the admin API's PUT /api/v1/sinks/{sink}/maintenance), validated by the same rules."""

    model_config: ClassVar[ConfigDict] = ConfigDict(extra="forbid")

    maintenance_enabled: bool = Field(
        default=True,
        description="Keep every sink's table healthy between its commits: expire snapshots, merge manifests, "
        "compact small files, sweep orphan files (docs/operations.md, Maintenance).",
    )
    maintenance_interval_seconds: float = Field(
        default=300.0,
        ge=0.1,
        le=THIRTY_DAYS,
        allow_inf_nan=False,
        description="How often a table's snapshots are expired and its small files compacted (per sink).",
    )
    maintenance_rate_limit_seconds: float = Field(
        default=60.0,
        ge=0.0,
        le=THIRTY_DAYS,
        allow_inf_nan=False,
        description="A run a commit asks for because of the table's files (small files, position delete files a "
        "compaction would rewrite) starts no sooner than this after the sink's last run started (Iceberg's Flink "
        "TableMaintenance rateLimit, also 1 minute): a busy sink's run then merges a minute of commits' files, not "
        "each commit's, and its table gains a compaction snapshot a minute, not one per commit; with no run within "
        "it, at a random moment within it, so that sinks started together spread their runs. A commit past the "
        "snapshot bound asks for its run at once. 0: at once after every such commit.",
    )
    snapshot_max_age_seconds: float = Field(
        default=24 * 3600.0,
        ge=1.0,
        le=TEN_YEARS,
        allow_inf_nan=False,
        description="Snapshots older than this are expired (time travel reaches this far back at most).",
    )
    snapshot_max_count: int = Field(
        default=500,
        ge=1,
        le=1_000_000,
        description="At most this many snapshots are kept, the newest; older ones are expired whatever their "
        "age. Bounds the table's metadata.json, which every commit rewrites.",
    )
    manifest_merge_min_count: int = Field(
        default=16,
        ge=2,
        le=1_000_000,
        description="A commit merges the table's manifests once this many have accumulated "
        "(Iceberg's commit.manifest.min-count-to-merge, set on the tables the coordinator commits to).",
    )
    compaction_target_file_bytes: FileBytes = Field(
        default=ByteSize(128 * 1024 * 1024),
        description="Compaction rewrites data files smaller than 3/4 of this into files of about this size "
        "(bytes, or 128MiB, 1GB, ...).",
    )
    compaction_min_files: int = Field(
        default=5,
        ge=2,
        le=INT32_MAX,
        description="Fewest small files of one partition that a compaction merges (smallest first, as many as keep "
        "the largest no larger than the others together, so that a byte is rewritten about log2(target / its first "
        "file's size) times at most).",
    )
    compaction_max_bytes_per_run: FileBytes = Field(
        default=ByteSize(1024 * 1024 * 1024),
        description="Most bytes of data files one maintenance run rewrites (the rest waits for the next run; "
        "bytes, or 1GiB, 500MB, ...).",
    )
    compaction_delete_files_min: int = Field(
        default=5,
        ge=1,
        le=INT32_MAX,
        description="A partition with at least this many position delete files (a keyed table's updates and "
        "deletes) has them merged into one (the rows they delete of data files still live), which costs what they "
        "hold, not what the table holds; readers then open one delete file, not one per commit.",
    )
    compaction_deleted_rows_ratio: float = Field(
        default=0.1,
        gt=0.0,
        le=1.0,
        allow_inf_nan=False,
        description="A data file whose position deletes delete at least this share of its rows is rewritten with "
        "them applied (the most deleted first, within COMPACTION_MAX_BYTES_PER_RUN), and a delete file that no live "
        "data file is left to refer to is dropped.",
    )
    orphan_sweep_interval_seconds: float = Field(
        default=3600.0,
        ge=1.0,
        le=THIRTY_DAYS,
        allow_inf_nan=False,
        description="How often the files under a table's location that nothing references are looked for.",
    )
    orphan_grace_seconds: float = Field(
        default=24 * 3600.0,
        ge=1.0,
        le=THIRTY_DAYS,
        allow_inf_nan=False,
        description="An unreferenced file is deleted only once it is this old: a writer may be about to "
        "pre-commit it (Spark tasks write their files before the batch's pre-commit). A pre-commit refuses a "
        "file older than the coordinator's value, and the mark of a file deleted stays this long; a sink's "
        "override can only lengthen it.",
    )
    orphan_max_files_per_run: int = Field(
        default=10_000, ge=1, le=1_000_000, description="Most orphan files one maintenance run deletes."
    )
    verification_enabled: bool = Field(
        default=False,
        description="Verify the sink's tables as part of its maintenance, each time from where the last verification "
        "stood (docs/operations.md, Verification): its sink_coordinator_verified_epoch and "
        "sink_coordinator_verification_failed gauges say how far, and whether it found a fault.",
    )
    verification_interval_seconds: float = Field(
        default=600.0,
        ge=1.0,
        le=THIRTY_DAYS,
        allow_inf_nan=False,
        description="How often the verification step runs (at the first maintenance run after this long).",
    )

    def with_overrides(self, overrides: Mapping[str, object] | None) -> MaintenancePolicy:
        """This policy with a sink's overrides; ValidationError for an unknown name or a value out of range."""
        policy: MaintenancePolicy = MaintenancePolicy.model_validate(
            {**self.model_dump(include=set(MaintenancePolicy.model_fields)), **(overrides or {})}
        )
        return policy
