-- What each component's recorded work came to, per result (success, failure, transient):
-- since it was registered, and per minute of store time for the last two hours (metrics
-- read the last hour). `buckets`: a JSON array of counts per duration bucket.
CREATE TABLE component_work_totals (
    component       TEXT NOT NULL,
    result          TEXT NOT NULL,
    results         INTEGER NOT NULL,
    duration_ms_sum INTEGER NOT NULL,
    buckets         TEXT NOT NULL,
    PRIMARY KEY (component, result)
) WITHOUT ROWID;
CREATE TABLE component_work_minutes (
    component       TEXT NOT NULL,
    minute          INTEGER NOT NULL,
    result          TEXT NOT NULL,
    results         INTEGER NOT NULL,
    duration_ms_sum INTEGER NOT NULL,
    buckets         TEXT NOT NULL,
    PRIMARY KEY (component, minute, result)
) WITHOUT ROWID;
