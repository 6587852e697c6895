-- Watchers that offered to be handed batches (`HandOnStore`): an append that makes a batch
-- ready for a taker's component opens the component's run for it in the append's own
-- transaction. One row per (component, liveness): the holder its handed runs name and the
-- descriptor appenders judge readiness by. A hint, not a lock: the handed run is the lock.
CREATE TABLE takers (
    component TEXT NOT NULL,
    liveness TEXT NOT NULL,
    holder TEXT NOT NULL,
    descriptor TEXT NOT NULL,
    offered_at INTEGER NOT NULL,
    PRIMARY KEY (component, liveness)
);
CREATE INDEX takers_by_liveness ON takers (liveness);
-- A taker's open runs of its step: what a hand-on checks it is idle by, and its wake reads.
CREATE INDEX runs_open_by_liveness ON runs (component, liveness) WHERE state = 'open';
