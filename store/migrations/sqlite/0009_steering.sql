-- Steering the pipeline: one record of the holds, pools and breaker counts (the model's
-- `Steering`, as JSON), and the append-only log of the changes operators and breakers made.
CREATE TABLE steering (
    id    INTEGER PRIMARY KEY CHECK (id = 1),
    state TEXT NOT NULL
);
INSERT INTO steering (id, state) VALUES (1, '{"version":0}');
CREATE TABLE steering_log (
    version INTEGER PRIMARY KEY,
    at      INTEGER NOT NULL,
    entry   TEXT NOT NULL
);

-- The notification outbox: each item once per channel (its key), claimed by one notifier at
-- a time (a lease) and marked sent once; the notifiers' cursor in the change feed.
CREATE TABLE notices (
    key         TEXT PRIMARY KEY,
    channel     TEXT NOT NULL,
    subject     TEXT NOT NULL,
    body        TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    attempts    INTEGER NOT NULL DEFAULT 0,
    last_error  TEXT,
    due_at      INTEGER NOT NULL,
    holder      TEXT,
    lease_until INTEGER,
    sent_at     INTEGER
);
CREATE INDEX notices_pending ON notices (due_at) WHERE sent_at IS NULL;
CREATE INDEX notices_recent ON notices (created_at);
CREATE TABLE notice_cursor (
    id  INTEGER PRIMARY KEY CHECK (id = 1),
    seq INTEGER NOT NULL
);
-- -1: no notifier has run yet (the first one starts at the head, whatever it is).
INSERT INTO notice_cursor (id, seq) VALUES (1, -1);
