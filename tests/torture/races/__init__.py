"""Races of the coordinator's own paths, fast and in one process: the torture kinds of issue 23.

Each kind is a module with `SETTINGS` (the coordinator's settings it needs) and `act(run)`: actors started at
random moments from the run's seed against the coordinator's runtime, whose background work (committer, cleaner,
maintenance) runs meanwhile. `python -m tests.torture.races --runs N` runs them; a short seeded run is part of the
test suite (test_races_short.py). What every run is checked for is in harness.py.

* lock_loss_mid_append: appends slowed after their lock verification, the commit lock's connection terminated
  at random, forced aborts of PENDING epochs (checkpointed or not), the cleaner without delay;
* sweep_vs_claim: orphans older than a one-second grace under the names a writer writes its files next (writers
  with deterministic names), the orphan sweep running all along;
* multi_writer_slow_part: a two-writer sink whose second writer sends its part late, the first part's files aged
  past the grace meanwhile, the sweep running all along;
* reset_mid_fan_out: a fan-out sink of three tables, epochs with files in some of them, commit passes dying
  between two tables' appends, resets at random moments followed by a writer on a new checkpoint.
"""

from __future__ import annotations

KINDS = ("lock_loss_mid_append", "sweep_vs_claim", "multi_writer_slow_part", "reset_mid_fan_out")
