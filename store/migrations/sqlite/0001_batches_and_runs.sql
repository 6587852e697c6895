-- One counter for the whole store: events, claims and batch changes share it, so any two
-- seqs compare across kinds ("is this event older than the last content change?").
CREATE TABLE store_head (
    id  INTEGER PRIMARY KEY CHECK (id = 1),
    seq INTEGER NOT NULL
);
INSERT INTO store_head (id, seq) VALUES (1, 0);

CREATE TABLE batches (
    id           TEXT PRIMARY KEY,
    type         TEXT NOT NULL,
    priority     INTEGER NOT NULL,
    metadata     TEXT NOT NULL,
    created_seq  INTEGER NOT NULL,
    modified_seq INTEGER NOT NULL,
    changed_seq  INTEGER NOT NULL,
    created_at   INTEGER NOT NULL,
    modified_at  INTEGER NOT NULL
);
CREATE UNIQUE INDEX batches_by_change ON batches (changed_seq);

CREATE TABLE events (
    seq             INTEGER PRIMARY KEY,
    batch_id        TEXT NOT NULL REFERENCES batches (id),
    type            TEXT NOT NULL,
    outcome         TEXT NOT NULL CHECK (outcome IN ('success', 'failure')),
    agent           TEXT NOT NULL,
    at              INTEGER NOT NULL,
    details         TEXT NOT NULL,
    run_component   TEXT,
    run_generation  INTEGER,
    resets          TEXT,
    idempotency_key TEXT UNIQUE
);
CREATE INDEX events_by_batch ON events (batch_id, seq);

-- The current claim generation of each (batch, component); bumped by every claim.
CREATE TABLE claims (
    batch_id   TEXT NOT NULL REFERENCES batches (id),
    component  TEXT NOT NULL,
    generation INTEGER NOT NULL,
    PRIMARY KEY (batch_id, component)
) WITHOUT ROWID;

CREATE TABLE runs (
    batch_id   TEXT NOT NULL REFERENCES batches (id),
    component  TEXT NOT NULL,
    generation INTEGER NOT NULL,
    agent      TEXT NOT NULL,
    host       TEXT NOT NULL,
    pid        INTEGER NOT NULL,
    started_at INTEGER NOT NULL,
    claim_seq  INTEGER NOT NULL,
    state      TEXT NOT NULL CHECK (state IN ('open', 'recorded', 'released', 'abandoned')),
    ended_at   INTEGER,
    transient  INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (batch_id, component, generation)
) WITHOUT ROWID;
CREATE INDEX runs_open ON runs (component, batch_id) WHERE state = 'open';
