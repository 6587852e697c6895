-- The component registry: each component as its binary last described itself (the
-- descriptor, JSON), and each host's last pass of it. Not batch changes: no seq, no feed.
CREATE TABLE components (
    name           TEXT PRIMARY KEY,
    event_type     TEXT NOT NULL,
    descriptor     TEXT NOT NULL,
    registered_at  INTEGER NOT NULL,
    changed_at     INTEGER NOT NULL,
    retired_at     INTEGER,
    retired_by     TEXT,
    retired_reason TEXT
) WITHOUT ROWID;
-- One producer per event type among the components still in the pipeline.
CREATE UNIQUE INDEX components_by_event_type ON components (event_type) WHERE retired_at IS NULL;

CREATE TABLE component_hosts (
    component        TEXT NOT NULL REFERENCES components (name),
    host             TEXT NOT NULL,
    version          TEXT NOT NULL,
    last_seen        INTEGER NOT NULL,
    pass_started_at  INTEGER,
    pass_ended_at    INTEGER,
    pass_outcome     TEXT,
    pass_summary     TEXT NOT NULL DEFAULT '',
    pass_duration_ms INTEGER,
    PRIMARY KEY (component, host)
) WITHOUT ROWID;
