-- Tink's Templates and Workflows, stored whole as applied (JSON text).
-- A Workflow's status is the engine's: apply never touches it. `state`
-- and `agent_id` repeat status.state and status.agentID so that the
-- engine and the agents' polls find their workflows by index; `version`
-- counts status writes, the optimistic check of the engine's writes.
CREATE TABLE templates (
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
    agent_id    TEXT,
    version     INTEGER NOT NULL DEFAULT 1,
    created_ms  INTEGER NOT NULL,
    updated_ms  INTEGER NOT NULL,
    UNIQUE (namespace, name)
);
CREATE INDEX workflows_agent ON workflows (agent_id, state);
CREATE INDEX workflows_state ON workflows (state);
