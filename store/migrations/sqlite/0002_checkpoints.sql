-- A run's progress, saved while it works and read by the next attempt after a crash;
-- written only by the current open run, removed when a run records its result.
CREATE TABLE checkpoints (
    batch_id   TEXT NOT NULL REFERENCES batches (id),
    component  TEXT NOT NULL,
    data       TEXT NOT NULL,
    generation INTEGER NOT NULL,
    saved_at   INTEGER NOT NULL,
    PRIMARY KEY (batch_id, component)
) WITHOUT ROWID;
