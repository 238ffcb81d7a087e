-- events.db: what happened to each machine (DHCP, TFTP, HTTP, metadata,
-- syslog, power, API changes), in a database file of its own beside
-- tinkerbox.db: its writer runs at the lowest CPU priority, and in the same
-- file its transactions would hold the write lock that API changes need.
-- Machine columns are NULL for traffic from unknown clients.
-- AUTOINCREMENT keeps ids increasing after trimming, so `events --follow`
-- can page by id; expiry finds its cutoff by walking ids (they follow
-- time), so there is no index on ts_ms (it cost every insert a third
-- B-tree write).
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
-- A machine's events by the id's bucket of 8192 first: with 100k machines
-- an index led by (namespace, name) put every event on its own leaf page,
-- so each batch dirtied (and wrote to the WAL) one 4 KiB page per event.
-- Leading with the bucket keeps a batch's index entries inside the newest
-- bucket's ~60 pages: 12x fewer bytes written per event. One machine's
-- events are found by probing each bucket (events::log).
CREATE INDEX events_machine ON events ((id >> 13), namespace, name);
