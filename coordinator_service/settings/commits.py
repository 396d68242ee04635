"""The commit path's pace and bounds: how much a pass commits and how often, the cleaner's delays, the retries."""

from __future__ import annotations

from pydantic import (
    BaseModel,
    Field,
)

from coordinator_service.settings.bounds import DAY, INT32_MAX, THIRTY_DAYS


class CommitSettings(BaseModel):
    """The committer, the cleaner, the retries, what the admin API waits for."""

    commit_max_epochs: int = Field(
        default=100,
        ge=1,
        le=100_000,
        description="Most checkpointed epochs coalesced into one Iceberg snapshot (1: none).",
    )
    commit_interval_seconds: float = Field(
        default=10.0,
        ge=0.0,
        le=DAY,
        allow_inf_nan=False,
        description="Least time between two Iceberg commits of one sink: the epochs checkpointed meanwhile are "
        "committed together, as one snapshot (0: a commit as soon as a checkpoint arrives). 10 s keeps a "
        "streaming table to at most 8,640 snapshots a day and the data about 10 s from the stream.",
    )
    commit_concurrency: int = Field(
        default=4,
        ge=1,
        le=1024,
        description="Most sinks committed at the same time by this process (each commit holds two metastore "
        "connections while it runs).",
    )
    table_cache_seconds: float = Field(
        default=10.0,
        ge=0.0,
        le=3600.0,
        allow_inf_nan=False,
        description="How long table metadata read from the catalog is reused for pre-commit validation and as "
        "the committer's base before it is read again (0: read it every time). This process's own commits "
        "refresh it; a stale copy is detected (refused file, failed commit) and read again.",
    )
    retention_epochs: int = Field(
        default=1000,
        ge=0,
        le=INT32_MAX,
        description="COMMITTED epochs kept in the log per sink; older rows are pruned.",
    )
    cleanup_delay_seconds: float = Field(
        default=60.0,
        ge=0.0,
        le=THIRTY_DAYS,
        allow_inf_nan=False,
        description="Least time between the abort of an epoch (or the replacement of an attempt) and the deletion "
        "of its files, for an operator to look at them. Safety does not rest on it: an operator's abort fences "
        "the tables first, so no append built before it can land on files deleted after it.",
    )
    recovery_files_keep_seconds: float = Field(
        default=7 * 24 * 3600.0,
        ge=0.0,
        le=365 * DAY,
        allow_inf_nan=False,
        description="How long the files of an epoch aborted by recovery (a writer restarted below it) are kept "
        "while Spark has not run the batch again: if Kafka's retention removed the batch's records meanwhile, "
        "they are the last copy. The batch's new attempt releases them at once (after CLEANUP_DELAY_SECONDS). "
        "Default: Kafka's default retention, 7 days.",
    )
    maintenance_concurrency: int = Field(
        default=2,
        ge=1,
        le=64,
        description="Sinks maintained at the same time by this process (each run holds the sink's commit lock and "
        "two metastore connections).",
    )
    poll_interval_seconds: float = Field(
        default=2.0,
        gt=0.0,
        le=3600.0,
        allow_inf_nan=False,
        description="How often the committer looks for work recorded by other replicas.",
    )
    retry_initial_seconds: float = Field(
        default=0.2, gt=0.0, le=3600.0, allow_inf_nan=False, description="First backoff of a failed commit."
    )
    retry_max_seconds: float = Field(
        default=30.0, gt=0.0, le=DAY, allow_inf_nan=False, description="Longest backoff of a failed commit."
    )
    stalled_after_seconds: float = Field(
        default=300.0,
        ge=1.0,
        le=THIRTY_DAYS,
        allow_inf_nan=False,
        description="A sink whose oldest PENDING epoch has waited this long is stalled (the admin API, the console, "
        "status, the metric sink_coordinator_sink_stalled): its writer died or hangs before the checkpoint, or its "
        "commits fail. A writer that called more recently is live: a sink is not deleted under it.",
    )
    admin_lock_timeout_seconds: float = Field(
        default=5.0,
        gt=0.0,
        le=3600.0,
        allow_inf_nan=False,
        description="How long an abort, a reset, or a RegisterWriter that aborts epochs waits for a sink's "
        "commit lock (a committer finishing its Iceberg commit, the cleaner) before it answers 503 / UNAVAILABLE.",
    )
