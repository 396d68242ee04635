"""The last hour of each sink's commits as this process measured them: what the console charts.

Kept in memory, per process: a replica shows the commits it made (the metrics
say the same). Bounded by the window and by MAX_SAMPLES per sink, so a sink
committing many times a second keeps its newest samples only.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Final

WINDOW_SECONDS: Final = 3600.0
MAX_SAMPLES: Final = 3600


@dataclass(frozen=True)
class CommitSample:
    at: float  # Unix time
    seconds: float  # the commit's own time: the append and the COMMITTED record
    epochs: int  # epochs it committed
    lag_epochs: int  # checkpointed epochs still waiting once it was recorded


class CommitHistory:
    def __init__(self, window_seconds: float = WINDOW_SECONDS, max_samples: int = MAX_SAMPLES) -> None:
        self.window_seconds = window_seconds
        self._max_samples = max_samples
        self._samples: dict[str, deque[CommitSample]] = {}

    def record(self, sink: str, seconds: float, epochs: int, lag_epochs: int, at: float | None = None) -> None:
        samples = self._samples.setdefault(sink, deque(maxlen=self._max_samples))
        samples.append(CommitSample(time.time() if at is None else at, seconds, epochs, max(lag_epochs, 0)))

    def samples(self, sink: str, now: float | None = None) -> list[CommitSample]:
        """The sink's samples of the window, oldest first."""
        since = (time.time() if now is None else now) - self.window_seconds
        return [sample for sample in self._samples.get(sink, ()) if sample.at >= since]
