//! BMC machines, their credentials and jobs in the store.

use super::{Outcome, Store, StoreError, now_ms};
use crate::bmc::model::{Action, Connection, Credentials};
use crate::hardware::Key;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One task's progress, kept in `bmc_jobs.task_states`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct TaskState {
    /// pending | running | completed | failed
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default)]
    pub attempts: u32,
    /// Which protocol answered: ipmi | redfish.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct JobRow {
    #[serde(skip)]
    pub id: i64,
    pub namespace: String,
    pub name: String,
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub machine: Option<Key>,
    #[serde(skip)]
    pub connection: Option<Connection>,
    pub tasks: Vec<Action>,
    pub state: String,
    pub task_states: Vec<TaskState>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    pub created_ms: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completed_ms: Option<i64>,
}

impl JobRow {
    pub fn key(&self) -> Key {
        Key::new(self.namespace.clone(), self.name.clone())
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct BmcMachineRow {
    pub doc: Value,
    pub power_state: String,
    pub contactable: Option<Value>,
}

type JobTuple = (
    i64,
    String,
    String,
    String,
    Option<String>,
    Option<String>,
    Option<String>,
    String,
    String,
    String,
    Option<String>,
    i64,
    Option<i64>,
    Option<i64>,
);

fn job_row(t: JobTuple) -> Result<JobRow, StoreError> {
    let key = Key::new(t.1.clone(), t.2.clone());
    let corrupt = |e: serde_json::Error| StoreError::Corrupt(key.clone(), e.to_string());
    Ok(JobRow {
        id: t.0,
        namespace: t.1,
        name: t.2,
        kind: t.3,
        machine: match (t.4, t.5) {
            (Some(ns), Some(n)) => Some(Key::new(ns, n)),
            _ => None,
        },
        connection: t
            .6
            .map(|c| serde_json::from_str(&c))
            .transpose()
            .map_err(corrupt)?,
        tasks: serde_json::from_str(&t.7).map_err(corrupt)?,
        state: t.8,
        task_states: serde_json::from_str(&t.9).map_err(corrupt)?,
        message: t.10,
        created_ms: t.11,
        started_ms: t.12,
        completed_ms: t.13,
    })
}

impl Store {
    pub async fn upsert_bmc_machine(&self, key: &Key, doc: &Value) -> Result<Outcome, StoreError> {
        let text = doc.to_string();
        let old: Option<(String,)> =
            sqlx::query_as("SELECT doc FROM bmc_machines WHERE namespace = ? AND name = ?")
                .bind(&key.namespace)
                .bind(&key.name)
                .fetch_optional(self.pool())
                .await?;
        if let Some((o,)) = &old
            && serde_json::from_str::<Value>(o).ok().as_ref() == Some(doc)
        {
            return Ok(Outcome::Unchanged);
        }
        let now = now_ms();
        sqlx::query(
            "INSERT INTO bmc_machines (namespace, name, doc, created_ms, updated_ms) VALUES (?, ?, ?, ?, ?)
             ON CONFLICT (namespace, name) DO UPDATE SET doc = excluded.doc, updated_ms = excluded.updated_ms",
        )
        .bind(&key.namespace)
        .bind(&key.name)
        .bind(text)
        .bind(now)
        .bind(now)
        .execute(self.pool())
        .await?;
        Ok(if old.is_some() {
            Outcome::Configured
        } else {
            Outcome::Created
        })
    }

    pub async fn upsert_secret(&self, key: &Key, c: &Credentials) -> Result<Outcome, StoreError> {
        let old = self.secret(key).await?;
        if old.as_ref() == Some(c) {
            return Ok(Outcome::Unchanged);
        }
        sqlx::query(
            "INSERT INTO bmc_secrets (namespace, name, username, password, updated_ms) VALUES (?, ?, ?, ?, ?)
             ON CONFLICT (namespace, name) DO UPDATE
             SET username = excluded.username, password = excluded.password, updated_ms = excluded.updated_ms",
        )
        .bind(&key.namespace)
        .bind(&key.name)
        .bind(&c.username)
        .bind(&c.password)
        .bind(now_ms())
        .execute(self.pool())
        .await?;
        Ok(if old.is_some() {
            Outcome::Configured
        } else {
            Outcome::Created
        })
    }

    pub async fn secret(&self, key: &Key) -> Result<Option<Credentials>, StoreError> {
        let r: Option<(String, String)> = sqlx::query_as(
            "SELECT username, password FROM bmc_secrets WHERE namespace = ? AND name = ?",
        )
        .bind(&key.namespace)
        .bind(&key.name)
        .fetch_optional(self.pool())
        .await?;
        Ok(r.map(|(username, password)| Credentials { username, password }))
    }

    pub async fn bmc_machine(&self, key: &Key) -> Result<Option<BmcMachineRow>, StoreError> {
        let r: Option<(String, String, Option<String>)> = sqlx::query_as(
            "SELECT doc, power_state, contactable FROM bmc_machines WHERE namespace = ? AND name = ?",
        )
        .bind(&key.namespace)
        .bind(&key.name)
        .fetch_optional(self.pool())
        .await?;
        r.map(|(d, p, c)| machine_row(key, d, p, c)).transpose()
    }

    pub async fn bmc_machines(
        &self,
        namespace: Option<&str>,
    ) -> Result<Vec<BmcMachineRow>, StoreError> {
        let rows: Vec<(String, String, String, String, Option<String>)> = sqlx::query_as(
            "SELECT namespace, name, doc, power_state, contactable FROM bmc_machines
             WHERE ?1 IS NULL OR namespace = ?1 ORDER BY namespace, name",
        )
        .bind(namespace)
        .fetch_all(self.pool())
        .await?;
        rows.into_iter()
            .map(|(ns, n, d, p, c)| machine_row(&Key::new(ns, n), d, p, c))
            .collect()
    }

    pub async fn set_bmc_status(
        &self,
        key: &Key,
        power: Option<&str>,
        contactable: &Value,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE bmc_machines SET power_state = COALESCE(?, power_state), contactable = ? WHERE namespace = ? AND name = ?",
        )
        .bind(power)
        .bind(contactable.to_string())
        .bind(&key.namespace)
        .bind(&key.name)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// A new job; jobs are immutable, so an existing name with another
    /// document is refused (a Conflict naming the job).
    #[allow(clippy::too_many_arguments)]
    pub async fn insert_job(
        &self,
        key: &Key,
        kind: &str,
        doc: &Value,
        machine: Option<&Key>,
        connection: Option<&Connection>,
        tasks: &[Action],
    ) -> Result<Outcome, StoreError> {
        let old: Option<(String,)> =
            sqlx::query_as("SELECT doc FROM bmc_jobs WHERE namespace = ? AND name = ?")
                .bind(&key.namespace)
                .bind(&key.name)
                .fetch_optional(self.pool())
                .await?;
        if let Some((o,)) = old {
            if serde_json::from_str::<Value>(&o).ok().as_ref() == Some(doc) {
                return Ok(Outcome::Unchanged);
            }
            return Err(StoreError::Conflict {
                field: "metadata.name".into(),
                message: format!("{kind} {key} exists and jobs cannot be changed; use a new name"),
                owner: key.clone(),
            });
        }
        let states: Vec<TaskState> = tasks
            .iter()
            .map(|_| TaskState {
                state: "pending".into(),
                ..TaskState::default()
            })
            .collect();
        sqlx::query(
            "INSERT INTO bmc_jobs (namespace, name, kind, doc, machine_ns, machine_name, connection, tasks, state, task_states, created_ms)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?, ?)",
        )
        .bind(&key.namespace)
        .bind(&key.name)
        .bind(kind)
        .bind(doc.to_string())
        .bind(machine.map(|m| m.namespace.clone()))
        .bind(machine.map(|m| m.name.clone()))
        .bind(connection.map(json))
        .bind(json(tasks))
        .bind(json(&states))
        .bind(now_ms())
        .execute(self.pool())
        .await?;
        Ok(Outcome::Created)
    }

    pub async fn job(&self, key: &Key) -> Result<Option<JobRow>, StoreError> {
        let r: Option<JobTuple> = sqlx::query_as(
            "SELECT id, namespace, name, kind, machine_ns, machine_name, connection, tasks, state, task_states,
                    message, created_ms, started_ms, completed_ms
             FROM bmc_jobs WHERE namespace = ? AND name = ?",
        )
            .bind(&key.namespace)
            .bind(&key.name)
            .fetch_optional(self.pool())
            .await?;
        r.map(job_row).transpose()
    }

    /// Jobs in one state (or all), oldest first.
    pub async fn jobs(&self, state: Option<&str>) -> Result<Vec<JobRow>, StoreError> {
        let rows: Vec<JobTuple> = sqlx::query_as(
            "SELECT id, namespace, name, kind, machine_ns, machine_name, connection, tasks, state, task_states,
                    message, created_ms, started_ms, completed_ms
             FROM bmc_jobs WHERE ?1 IS NULL OR state = ?1 ORDER BY id",
        )
            .bind(state)
            .fetch_all(self.pool())
            .await?;
        rows.into_iter().map(job_row).collect()
    }

    /// Persist a job's progress (synchronous = FULL: it survives a crash).
    pub async fn save_job(&self, j: &JobRow) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE bmc_jobs SET state = ?, task_states = ?, message = ?, started_ms = ?, completed_ms = ? WHERE id = ?",
        )
        .bind(&j.state)
        .bind(json(&j.task_states))
        .bind(&j.message)
        .bind(j.started_ms)
        .bind(j.completed_ms)
        .bind(j.id)
        .execute(self.pool())
        .await?;
        Ok(())
    }
}

fn json<T: Serialize + ?Sized>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

fn machine_row(
    key: &Key,
    d: String,
    p: String,
    c: Option<String>,
) -> Result<BmcMachineRow, StoreError> {
    Ok(BmcMachineRow {
        doc: serde_json::from_str(&d)
            .map_err(|e| StoreError::Corrupt(key.clone(), e.to_string()))?,
        power_state: p,
        contactable: c.and_then(|c| serde_json::from_str(&c).ok()),
    })
}
