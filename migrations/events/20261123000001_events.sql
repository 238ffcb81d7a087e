-- The event log, in a database file of its own (events.db beside
-- tinkerbox.db): its writer runs at the lowest CPU priority, and in the
-- same file its transactions held the write lock that API changes need.
-- The same shape as the table it replaces (migrations 1, 3 and 4 of the
-- store); Store::open moves those rows here once.
CREATE TABLE events (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    ts_ms      INTEGER NOT NULL,
    namespace  TEXT,
    name       TEXT,
    mac        TEXT,
    ip         TEXT,
    kind       TEXT    NOT NULL,
    message    TEXT    NOT NULL,
    fields     TEXT
);
-- A machine's events by the id's bucket of 8192 first: a batch's index
-- entries stay inside the newest bucket's pages (see migration 4 of the
-- store, and store::event_buckets).
CREATE INDEX events_machine ON events ((id >> 13), namespace, name);
