-- Hardware objects, stored whole as applied (JSON text), plus the keys the
-- boot path looks machines up by. A MAC or an IP belongs to one Hardware:
-- the primary keys on hardware_mac/hardware_ip enforce it.
CREATE TABLE hardware (
    id          INTEGER PRIMARY KEY,
    namespace   TEXT    NOT NULL,
    name        TEXT    NOT NULL,
    doc         TEXT    NOT NULL,
    generation  INTEGER NOT NULL DEFAULT 1,
    created_ms  INTEGER NOT NULL,
    updated_ms  INTEGER NOT NULL,
    UNIQUE (namespace, name)
);

CREATE TABLE hardware_mac (
    mac          TEXT    PRIMARY KEY,
    hardware_id  INTEGER NOT NULL REFERENCES hardware (id) ON DELETE CASCADE
) WITHOUT ROWID;
CREATE INDEX hardware_mac_owner ON hardware_mac (hardware_id);

CREATE TABLE hardware_ip (
    ip           TEXT    PRIMARY KEY,
    hardware_id  INTEGER NOT NULL REFERENCES hardware (id) ON DELETE CASCADE
) WITHOUT ROWID;
CREATE INDEX hardware_ip_owner ON hardware_ip (hardware_id);

-- What happened to each machine (DHCP, TFTP, HTTP, metadata, syslog, power,
-- API changes). Machine columns are NULL for traffic from unknown clients.
-- AUTOINCREMENT keeps ids increasing after trimming, so `events --follow`
-- can page by id.
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
CREATE INDEX events_machine ON events (namespace, name, id);
CREATE INDEX events_ts ON events (ts_ms);
