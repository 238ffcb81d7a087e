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
