-- The registry's longer history, for the monitor's charts: result tallies per hour of store
-- time (kept 31 days, like the minutes' two hours), and each component's backlog (batches
-- ready for it) as the monitor samples it, the newest sample per minute and per hour.
CREATE TABLE component_work_hours (
    component       TEXT NOT NULL,
    hour            INTEGER NOT NULL,
    result          TEXT NOT NULL,
    results         INTEGER NOT NULL,
    duration_ms_sum INTEGER NOT NULL,
    buckets         TEXT NOT NULL,
    PRIMARY KEY (component, hour, result)
) WITHOUT ROWID;
CREATE TABLE component_backlog (
    component TEXT NOT NULL,
    step      TEXT NOT NULL,
    at        INTEGER NOT NULL,
    ready     INTEGER NOT NULL,
    PRIMARY KEY (component, step, at)
) WITHOUT ROWID;
