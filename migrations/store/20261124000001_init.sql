-- tinkerbox.db: the source of truth. One migration while there is no
-- release; a database from an older development build is refused with
-- advice (store::migrate).

-- Hardware objects, stored whole as applied (JSON text), plus the keys the
-- boot path looks machines up by. A MAC or an IP belongs to one Hardware:
-- the primary keys on hardware_mac/hardware_ip enforce it. `generation`
-- counts the changes (1 when created): the optimistic check of a
-- read-modify-write (Store::apply_expecting).
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

-- BMCs (Rufio's Machine), their credentials (Secrets) and jobs of ordered
-- tasks. Documents are kept whole as applied; credentials live apart and are
-- never returned by the API.
CREATE TABLE bmc_machines (
    id           INTEGER PRIMARY KEY,
    namespace    TEXT    NOT NULL,
    name         TEXT    NOT NULL,
    doc          TEXT    NOT NULL,
    power_state  TEXT    NOT NULL DEFAULT 'unknown',
    -- Rufio's Contactable condition: {"status": "True|False", "message", "time"}
    contactable  TEXT,
    created_ms   INTEGER NOT NULL,
    updated_ms   INTEGER NOT NULL,
    UNIQUE (namespace, name)
);

CREATE TABLE bmc_secrets (
    namespace   TEXT    NOT NULL,
    name        TEXT    NOT NULL,
    username    TEXT    NOT NULL,
    password    TEXT    NOT NULL,
    updated_ms  INTEGER NOT NULL,
    PRIMARY KEY (namespace, name)
) WITHOUT ROWID;

-- A Job (kind 'Job'), or a Rufio Task run as a one-task job (kind 'Task').
-- task_states is a JSON array, one entry per task: {"state", "message",
-- "attempts", "protocol"}. A task is marked running before it is sent, so
-- that after a crash it is never sent twice.
CREATE TABLE bmc_jobs (
    id            INTEGER PRIMARY KEY,
    namespace     TEXT    NOT NULL,
    name          TEXT    NOT NULL,
    kind          TEXT    NOT NULL,
    doc           TEXT    NOT NULL,
    machine_ns    TEXT,
    machine_name  TEXT,
    connection    TEXT,
    tasks         TEXT    NOT NULL,
    state         TEXT    NOT NULL,
    task_states   TEXT    NOT NULL,
    message       TEXT,
    created_ms    INTEGER NOT NULL,
    started_ms    INTEGER,
    completed_ms  INTEGER,
    UNIQUE (namespace, name)
);
CREATE INDEX bmc_jobs_state ON bmc_jobs (state, id);

-- Tink's Templates and Workflows, stored whole as applied (JSON text).
-- A Workflow's status is the engine's: apply never touches it. `state`
-- repeats status.state, and workflow_agents lists the agent of every
-- task, so that the engine and the agents' polls find their workflows by
-- index; `version` counts status writes, the optimistic check of every
-- status write.
CREATE TABLE templates (
    id          INTEGER PRIMARY KEY,
    namespace   TEXT    NOT NULL,
    name        TEXT    NOT NULL,
    doc         TEXT    NOT NULL,
    created_ms  INTEGER NOT NULL,
    updated_ms  INTEGER NOT NULL,
    UNIQUE (namespace, name)
);

-- Tinkerbell's WorkflowRuleSets (enrollment rules), stored whole as applied.
CREATE TABLE workflow_rulesets (
    id          INTEGER PRIMARY KEY,
    namespace   TEXT    NOT NULL,
    name        TEXT    NOT NULL,
    doc         TEXT    NOT NULL,
    created_ms  INTEGER NOT NULL,
    updated_ms  INTEGER NOT NULL,
    UNIQUE (namespace, name)
);

CREATE TABLE workflows (
    id          INTEGER PRIMARY KEY,
    namespace   TEXT    NOT NULL,
    name        TEXT    NOT NULL,
    doc         TEXT    NOT NULL,
    status      TEXT    NOT NULL DEFAULT '{}',
    state       TEXT    NOT NULL DEFAULT '',
    version     INTEGER NOT NULL DEFAULT 1,
    created_ms  INTEGER NOT NULL,
    updated_ms  INTEGER NOT NULL,
    UNIQUE (namespace, name)
);
CREATE INDEX workflows_state ON workflows (state);

-- Every task's agent (a Workflow of two tasks has two), written with the
-- status.
CREATE TABLE workflow_agents (
    agent_id     TEXT    NOT NULL,
    workflow_id  INTEGER NOT NULL REFERENCES workflows (id) ON DELETE CASCADE,
    PRIMARY KEY (agent_id, workflow_id)
) WITHOUT ROWID;
CREATE INDEX workflow_agents_workflow ON workflow_agents (workflow_id);

-- The discovery pool (discovery::pool): one row per address that is leased
-- to a machine no Hardware names, or that a client DECLINEd (in use on the
-- wire) and is kept out until `expires_ms`. A lease is written before its
-- ACK is sent; a RELEASE deletes its row; rows that ended are dropped when
-- the pool is loaded at start.
CREATE TABLE discovery_leases (
    ip          TEXT    PRIMARY KEY,
    mac         TEXT    NOT NULL,
    state       TEXT    NOT NULL CHECK (state IN ('leased', 'declined')),
    expires_ms  INTEGER NOT NULL,
    updated_ms  INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX discovery_leases_mac ON discovery_leases (mac);

-- Metal3 BareMetalHosts (metal3/): the document as applied, BMO's status
-- (written by the lifecycle controller, checked against `version`, which
-- every change of the document or the status bumps), and tinkerbox's own
-- bookkeeping of the host (`private`: its Workflow runs, the inspection's
-- report token, back-off), which the CRD's schema has no place for.
CREATE TABLE baremetalhosts (
    id          INTEGER PRIMARY KEY,
    namespace   TEXT    NOT NULL,
    name        TEXT    NOT NULL,
    doc         TEXT    NOT NULL,
    status      TEXT    NOT NULL DEFAULT '{}',
    private     TEXT    NOT NULL DEFAULT '{}',
    version     INTEGER NOT NULL DEFAULT 1,
    created_ms  INTEGER NOT NULL,
    updated_ms  INTEGER NOT NULL,
    UNIQUE (namespace, name)
);

-- Metal3 HardwareData: a host's inspection report, written by the
-- controller, named as its host.
CREATE TABLE hardware_data (
    id          INTEGER PRIMARY KEY,
    namespace   TEXT    NOT NULL,
    name        TEXT    NOT NULL,
    doc         TEXT    NOT NULL,
    created_ms  INTEGER NOT NULL,
    updated_ms  INTEGER NOT NULL,
    UNIQUE (namespace, name)
);

-- Secrets with a BareMetalHost's user data, network data or meta data
-- (keys userData, networkData, metaData, value): the values, decoded, as a
-- JSON object. Never shown by the API, as BMC credentials are not.
CREATE TABLE host_data_secrets (
    namespace   TEXT    NOT NULL,
    name        TEXT    NOT NULL,
    data        TEXT    NOT NULL,
    updated_ms  INTEGER NOT NULL,
    PRIMARY KEY (namespace, name)
) WITHOUT ROWID;
