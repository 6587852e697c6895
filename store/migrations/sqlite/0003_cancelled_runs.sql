-- Runs may end 'cancelled' (an operator's `autocomp cancel`). SQLite cannot alter a CHECK
-- constraint, so the table is rebuilt with the wider one and its rows copied over.
CREATE TABLE runs_v3 (
    batch_id   TEXT NOT NULL REFERENCES batches (id),
    component  TEXT NOT NULL,
    generation INTEGER NOT NULL,
    agent      TEXT NOT NULL,
    host       TEXT NOT NULL,
    pid        INTEGER NOT NULL,
    started_at INTEGER NOT NULL,
    claim_seq  INTEGER NOT NULL,
    state      TEXT NOT NULL CHECK (state IN ('open', 'recorded', 'released', 'abandoned', 'cancelled')),
    ended_at   INTEGER,
    transient  INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (batch_id, component, generation)
) WITHOUT ROWID;
INSERT INTO runs_v3 (batch_id, component, generation, agent, host, pid, started_at, claim_seq, state, ended_at, transient)
    SELECT batch_id, component, generation, agent, host, pid, started_at, claim_seq, state, ended_at, transient FROM runs;
DROP TABLE runs;
ALTER TABLE runs_v3 RENAME TO runs;
CREATE INDEX runs_open ON runs (component, batch_id) WHERE state = 'open';
