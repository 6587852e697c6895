-- What a run printed, saved apart from a result while the run has none: a running run's output
-- so far (its runner saves it every few seconds) and a cancelled run's whole output (saved once
-- its work returns). A run that records its result removes its row (the result carries the output).
-- Removed with its run.
CREATE TABLE run_outputs (
    batch_id   TEXT NOT NULL,
    component  TEXT NOT NULL,
    generation INTEGER NOT NULL,
    output     TEXT NOT NULL,
    -- Whether the output is all the run printed (its work returned), or what it printed so far.
    whole      INTEGER NOT NULL,
    saved_at   INTEGER NOT NULL,
    PRIMARY KEY (batch_id, component, generation),
    FOREIGN KEY (batch_id, component, generation) REFERENCES runs (batch_id, component, generation) ON DELETE CASCADE
);
