//! BMC machines, their credentials and jobs in the store.

use super::{Outcome, Store, StoreError};
use crate::bmc::PowerState;
use crate::bmc::model::{Action, Connection, Credentials, Doc};
use crate::clock::now_ms;
use crate::hardware::Key;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::SqliteConnection;

/// The annotation on a Workflow's boot job naming the run (the id of the
/// Workflow's rendering) it was made for.
pub const RUN_ANNOTATION: &str = "tinkerbox.io/workflow-run";

/// Where a job or a task is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, sqlx::Type)]
#[serde(rename_all = "lowercase")]
#[sqlx(rename_all = "lowercase")]
pub enum State {
    #[default]
    Pending,
    Running,
    Completed,
    Failed,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Running => "running",
            State::Completed => "completed",
            State::Failed => "failed",
        }
    }
}

/// A Rufio `Job`, or a Rufio `Task` run as a one-task job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, sqlx::Type)]
pub enum JobKind {
    Job,
    Task,
}

/// One task's progress, kept in `bmc_jobs.task_states`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct TaskState {
    pub state: State,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default)]
    pub attempts: u32,
    /// Which protocol answered: ipmi | redfish.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// First sent (a Rufio Task's startTime).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_ms: Option<i64>,
    /// Completed or failed for good.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_ms: Option<i64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct JobRow {
    #[serde(skip)]
    pub id: i64,
    pub namespace: String,
    pub name: String,
    pub kind: JobKind,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub machine: Option<Key>,
    #[serde(skip)]
    pub connection: Option<Connection>,
    pub tasks: Vec<Action>,
    pub state: State,
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
    pub key: Key,
    pub doc: Value,
    pub power_state: PowerState,
    pub contactable: Option<Value>,
}

#[derive(sqlx::FromRow)]
struct JobTuple {
    id: i64,
    namespace: String,
    name: String,
    kind: JobKind,
    machine_ns: Option<String>,
    machine_name: Option<String>,
    connection: Option<String>,
    tasks: String,
    state: State,
    task_states: String,
    message: Option<String>,
    created_ms: i64,
    started_ms: Option<i64>,
    completed_ms: Option<i64>,
}

macro_rules! select_jobs {
    ($where:literal) => {
        concat!(
            "SELECT id, namespace, name, kind, machine_ns, machine_name, connection, tasks, state, task_states, message, created_ms, started_ms, completed_ms FROM bmc_jobs ",
            $where
        )
    };
}

fn job_row(t: JobTuple) -> Result<JobRow, StoreError> {
    let key = Key::new(t.namespace.clone(), t.name.clone());
    let corrupt = |e: serde_json::Error| StoreError::Corrupt(key.clone(), e.to_string());
    Ok(JobRow {
        id: t.id,
        namespace: t.namespace,
        name: t.name,
        kind: t.kind,
        machine: match (t.machine_ns, t.machine_name) {
            (Some(ns), Some(n)) => Some(Key::new(ns, n)),
            _ => None,
        },
        connection: t
            .connection
            .map(|c| serde_json::from_str(&c))
            .transpose()
            .map_err(corrupt)?,
        tasks: serde_json::from_str(&t.tasks).map_err(corrupt)?,
        state: t.state,
        task_states: serde_json::from_str(&t.task_states).map_err(corrupt)?,
        message: t.message,
        created_ms: t.created_ms,
        started_ms: t.started_ms,
        completed_ms: t.completed_ms,
    })
}

/// A new job for [`Store::apply_bmc`]: what the runner needs besides the
/// document.
pub struct NewJob<'a> {
    pub key: &'a Key,
    pub kind: JobKind,
    pub doc: &'a Value,
    pub machine: Option<&'a Key>,
    pub connection: Option<&'a Connection>,
    pub tasks: &'a [Action],
}

/// The Machine a Job document names (None for the other documents).
pub(super) fn job_machine(d: &Doc) -> Option<Key> {
    match d {
        Doc::Job { key, spec, .. } => Some(spec.machine_key(&key.namespace)),
        _ => None,
    }
}

/// The job a Job or Task document is run as (`machine`: [`job_machine`]'s).
pub(super) fn new_job<'a>(d: &'a Doc, machine: Option<&'a Key>) -> Option<NewJob<'a>> {
    match d {
        Doc::Job { key, doc, spec } => Some(NewJob {
            key,
            kind: JobKind::Job,
            doc,
            machine,
            connection: None,
            tasks: &spec.tasks,
        }),
        Doc::Task {
            key,
            doc,
            connection,
            action,
        } => Some(NewJob {
            key,
            kind: JobKind::Task,
            doc,
            machine: None,
            connection: Some(connection),
            tasks: std::slice::from_ref(action),
        }),
        _ => None,
    }
}

impl Store {
    /// Write every document of a BMC apply in one transaction: all or
    /// nothing, like a Hardware apply.
    pub async fn apply_bmc(&self, docs: &[Doc]) -> Result<Vec<Outcome>, StoreError> {
        let mut tx = self.pool().begin_with("BEGIN IMMEDIATE").await?;
        let mut out = Vec::with_capacity(docs.len());
        for d in docs {
            let o = match d {
                Doc::Secret { key, credentials } => {
                    upsert_secret(&mut tx, key, credentials).await?
                }
                Doc::Machine { key, doc, .. } => {
                    super::upsert_document(&mut tx, super::DocTable::BmcMachines, key, doc).await?
                }
                Doc::Job { .. } | Doc::Task { .. } => {
                    let m = job_machine(d);
                    match new_job(d, m.as_ref()) {
                        Some(job) => insert_job(&mut tx, &job).await?,
                        None => Outcome::Unchanged,
                    }
                }
            };
            out.push(o);
        }
        tx.commit().await?;
        Ok(out)
    }

    /// A job under a fixed name (a Workflow's `netboot-<workflow>`): one
    /// of that name from an earlier run is deleted first, as Rufio's
    /// callers do; a running one is left to finish, and one made for this
    /// `run` (a Workflow's rendering, in [`RUN_ANNOTATION`]) is kept
    /// (Unchanged both).
    pub async fn replace_job(&self, job: &NewJob<'_>, run: &str) -> Result<Outcome, StoreError> {
        let mut tx = self.pool().begin_with("BEGIN IMMEDIATE").await?;
        let old: Option<(State, Option<String>)> = sqlx::query_as(
            "SELECT state, json_extract(doc, '$.metadata.annotations.\"tinkerbox.io/workflow-run\"') \
             FROM bmc_jobs WHERE namespace = ? AND name = ?",
        )
        .bind(&job.key.namespace)
        .bind(&job.key.name)
        .fetch_optional(&mut *tx)
        .await?;
        let running = old.as_ref().map(|(s, _)| *s);
        // Running, or made for this run already: kept, never made again.
        if running == Some(State::Running) || old.is_some_and(|(_, r)| r.as_deref() == Some(run)) {
            return Ok(Outcome::Unchanged);
        }
        sqlx::query("DELETE FROM bmc_jobs WHERE namespace = ? AND name = ?")
            .bind(&job.key.namespace)
            .bind(&job.key.name)
            .execute(&mut *tx)
            .await?;
        let o = insert_job(&mut tx, job).await?;
        tx.commit().await?;
        Ok(if running.is_some() {
            Outcome::Configured
        } else {
            o
        })
    }

    /// One new job in its own transaction.
    pub async fn insert_job(&self, job: &NewJob<'_>) -> Result<Outcome, StoreError> {
        let mut tx = self.pool().begin_with("BEGIN IMMEDIATE").await?;
        let o = insert_job(&mut tx, job).await?;
        tx.commit().await?;
        Ok(o)
    }

    pub async fn secret(&self, key: &Key) -> Result<Option<Credentials>, StoreError> {
        let mut conn = self.pool().acquire().await?;
        secret(&mut conn, key).await
    }

    pub async fn bmc_machine(&self, key: &Key) -> Result<Option<BmcMachineRow>, StoreError> {
        let r: Option<(String, String, Option<String>)> = sqlx::query_as(
            "SELECT doc, power_state, contactable FROM bmc_machines WHERE namespace = ? AND name = ?",
        )
        .bind(&key.namespace)
        .bind(&key.name)
        .fetch_optional(self.pool())
        .await?;
        r.map(|(d, p, c)| machine_row(key.clone(), d, p, c))
            .transpose()
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
            .map(|(ns, n, d, p, c)| machine_row(Key::new(ns, n), d, p, c))
            .collect()
    }

    /// Rufio's status of a Machine. True when it changed other than in
    /// the condition's time (what is worth telling the cluster).
    pub async fn set_bmc_status(
        &self,
        key: &Key,
        power: Option<PowerState>,
        contactable: &Value,
    ) -> Result<bool, StoreError> {
        let old: Option<(String, Option<String>)> = sqlx::query_as(
            "SELECT power_state, contactable FROM bmc_machines WHERE namespace = ? AND name = ?",
        )
        .bind(&key.namespace)
        .bind(&key.name)
        .fetch_optional(self.pool())
        .await?;
        sqlx::query(
            "UPDATE bmc_machines SET power_state = COALESCE(?, power_state), contactable = ? WHERE namespace = ? AND name = ?",
        )
        .bind(power.map(PowerState::as_str))
        .bind(contactable.to_string())
        .bind(&key.namespace)
        .bind(&key.name)
        .execute(self.pool())
        .await?;
        let Some((old_power, old_cond)) = old else {
            return Ok(false);
        };
        let untimed = |v: &Value| (v.get("status").cloned(), v.get("message").cloned());
        let old_cond: Option<Value> = old_cond.and_then(|c| serde_json::from_str(&c).ok());
        let power_changed = power.is_some_and(|p| p.as_str() != old_power);
        Ok(power_changed || old_cond.as_ref().map(untimed) != Some(untimed(contactable)))
    }

    pub async fn job(&self, key: &Key) -> Result<Option<JobRow>, StoreError> {
        let r: Option<JobTuple> = sqlx::query_as(select_jobs!("WHERE namespace = ? AND name = ?"))
            .bind(&key.namespace)
            .bind(&key.name)
            .fetch_optional(self.pool())
            .await?;
        r.map(job_row).transpose()
    }

    /// Jobs in one state (or all), oldest first.
    pub async fn jobs(&self, state: Option<State>) -> Result<Vec<JobRow>, StoreError> {
        let rows: Vec<JobTuple> =
            sqlx::query_as(select_jobs!("WHERE ?1 IS NULL OR state = ?1 ORDER BY id"))
                .bind(state)
                .fetch_all(self.pool())
                .await?;
        rows.into_iter().map(job_row).collect()
    }

    /// The newest `limit` jobs of BMC Machine `machine`, newest first.
    pub async fn jobs_of_machine(
        &self,
        machine: &Key,
        limit: u32,
    ) -> Result<Vec<JobRow>, StoreError> {
        let rows: Vec<JobTuple> = sqlx::query_as(select_jobs!(
            "WHERE machine_ns = ?1 AND machine_name = ?2 ORDER BY id DESC LIMIT ?3"
        ))
        .bind(&machine.namespace)
        .bind(&machine.name)
        .bind(i64::from(limit))
        .fetch_all(self.pool())
        .await?;
        rows.into_iter().map(job_row).collect()
    }

    /// Persist a job's progress (synchronous = FULL: it survives a crash).
    pub async fn save_job(&self, j: &JobRow) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE bmc_jobs SET state = ?, task_states = ?, message = ?, started_ms = ?, completed_ms = ? WHERE id = ?",
        )
        .bind(j.state)
        .bind(json(&j.task_states)?)
        .bind(&j.message)
        .bind(j.started_ms)
        .bind(j.completed_ms)
        .bind(j.id)
        .execute(self.pool())
        .await?;
        Ok(())
    }
}

async fn secret(tx: &mut SqliteConnection, key: &Key) -> Result<Option<Credentials>, StoreError> {
    let r: Option<(String, String)> = sqlx::query_as(
        "SELECT username, password FROM bmc_secrets WHERE namespace = ? AND name = ?",
    )
    .bind(&key.namespace)
    .bind(&key.name)
    .fetch_optional(&mut *tx)
    .await?;
    Ok(r.map(|(username, password)| Credentials { username, password }))
}

pub(super) async fn upsert_secret(
    tx: &mut SqliteConnection,
    key: &Key,
    c: &Credentials,
) -> Result<Outcome, StoreError> {
    let old = secret(tx, key).await?;
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
    .execute(&mut *tx)
    .await?;
    Ok(if old.is_some() {
        Outcome::Configured
    } else {
        Outcome::Created
    })
}

/// A new job; jobs are immutable, so an existing name with another
/// document is refused (a Conflict naming the job).
pub(super) async fn insert_job(
    tx: &mut SqliteConnection,
    j: &NewJob<'_>,
) -> Result<Outcome, StoreError> {
    let key = j.key;
    let old: Option<(String,)> =
        sqlx::query_as("SELECT doc FROM bmc_jobs WHERE namespace = ? AND name = ?")
            .bind(&key.namespace)
            .bind(&key.name)
            .fetch_optional(&mut *tx)
            .await?;
    if let Some((o,)) = old {
        if serde_json::from_str::<Value>(&o).ok().as_ref() == Some(j.doc) {
            return Ok(Outcome::Unchanged);
        }
        return Err(StoreError::Conflict {
            field: "metadata.name".into(),
            message: format!(
                "{:?} {key} exists and jobs cannot be changed; use a new name",
                j.kind
            ),
            owner: key.clone(),
        });
    }
    let states = vec![TaskState::default(); j.tasks.len()];
    sqlx::query(
        "INSERT INTO bmc_jobs (namespace, name, kind, doc, machine_ns, machine_name, connection, tasks, state, task_states, created_ms)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(&key.namespace)
    .bind(&key.name)
    .bind(j.kind)
    .bind(j.doc.to_string())
    .bind(j.machine.map(|m| m.namespace.clone()))
    .bind(j.machine.map(|m| m.name.clone()))
    .bind(j.connection.map(json).transpose()?)
    .bind(json(j.tasks)?)
    .bind(State::Pending)
    .bind(json(&states)?)
    .bind(now_ms())
    .execute(&mut *tx)
    .await?;
    Ok(Outcome::Created)
}

/// Typed values as JSON text for a column. They are plain structs of
/// strings, numbers and enums, which serialise; should one not, the write
/// fails with the reason rather than storing an empty value.
fn json<T: Serialize + ?Sized>(v: &T) -> Result<String, StoreError> {
    serde_json::to_string(v).map_err(|e| StoreError::Io(std::io::Error::other(e)))
}

fn machine_row(
    key: Key,
    d: String,
    p: String,
    c: Option<String>,
) -> Result<BmcMachineRow, StoreError> {
    Ok(BmcMachineRow {
        doc: serde_json::from_str(&d)
            .map_err(|e| StoreError::Corrupt(key.clone(), e.to_string()))?,
        key,
        power_state: PowerState::from_str_lossy(&p),
        contactable: c.and_then(|c| serde_json::from_str(&c).ok()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bmc::model;
    use crate::hardware::parse_documents;

    fn docs(text: &str) -> Vec<Doc> {
        parse_documents(text)
            .unwrap()
            .into_iter()
            .map(|d| model::parse(d).unwrap())
            .collect()
    }

    const MACHINE: &str = "apiVersion: bmc.tinkerbell.org/v1alpha1\nkind: Machine\nmetadata: {name: NAME}\nspec:\n  connection: {host: 10.0.0.9, authSecretRef: {name: s}}\n";
    const SECRET: &str = "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\nstringData: {username: u, password: p}\n";
    const JOB: &str = "apiVersion: bmc.tinkerbell.org/v1alpha1\nkind: Job\nmetadata: {name: j1}\nspec:\n  machineRef: {name: m1}\n  tasks:\n  - powerAction: POWER\n";

    /// A Workflow's boot job is made once per run: asked again for the
    /// same run (its record was lost after the job was made), the job is
    /// kept, finished or not; another run replaces a finished one.
    #[tokio::test]
    async fn a_boot_job_is_made_once_per_run() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("t.db")).await.unwrap();
        let key = Key::new("default", "netboot-wf");
        let tasks = vec![Action {
            power_action: Some(crate::bmc::PowerAction::On),
            ..Action::default()
        }];
        let doc = |run: &str| {
            serde_json::json!({"apiVersion": model::API_VERSION, "kind": "Job",
                "metadata": {"name": "netboot-wf", "namespace": "default", "annotations": {RUN_ANNOTATION: run}},
                "spec": {"machineRef": {"name": "m1"}, "tasks": [{"powerAction": "on"}]}})
        };
        let (d1, d2) = (doc("run-1"), doc("run-2"));
        let job = |d| NewJob {
            key: &key,
            kind: JobKind::Job,
            doc: d,
            machine: None,
            connection: None,
            tasks: &tasks,
        };
        assert_eq!(
            store.replace_job(&job(&d1), "run-1").await.unwrap(),
            Outcome::Created
        );
        let mut j = store.job(&key).await.unwrap().unwrap();
        j.state = State::Completed;
        store.save_job(&j).await.unwrap();
        assert_eq!(
            store.replace_job(&job(&d1), "run-1").await.unwrap(),
            Outcome::Unchanged,
            "this run's job, completed: kept, not made again"
        );
        assert_eq!(
            store.job(&key).await.unwrap().unwrap().state,
            State::Completed
        );
        assert_eq!(
            store.replace_job(&job(&d2), "run-2").await.unwrap(),
            Outcome::Configured,
            "an earlier run's finished job is replaced"
        );
        assert_eq!(
            store.job(&key).await.unwrap().unwrap().state,
            State::Pending
        );
    }

    /// A BMC apply is all or nothing: a document the store refuses (a job
    /// of that name exists with other tasks) leaves the others unwritten.
    #[tokio::test]
    async fn an_apply_is_all_or_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("t.db")).await.unwrap();
        let first = format!(
            "{}---\n{}",
            MACHINE.replace("NAME", "m1"),
            JOB.replace("POWER", "\"on\"")
        );
        let o = store.apply_bmc(&docs(&first)).await.unwrap();
        assert_eq!(o, [Outcome::Created, Outcome::Created]);
        let second = format!(
            "{SECRET}---\n{}---\n{}",
            MACHINE.replace("NAME", "m2"),
            JOB.replace("POWER", "\"off\"")
        );
        match store.apply_bmc(&docs(&second)).await {
            Err(StoreError::Conflict { field, .. }) => assert_eq!(field, "metadata.name"),
            other => panic!("{other:?}"),
        }
        let k = |n: &str| Key::new("default", n);
        assert!(store.bmc_machine(&k("m2")).await.unwrap().is_none());
        assert!(store.secret(&k("s")).await.unwrap().is_none());
        let j = store.job(&k("j1")).await.unwrap().unwrap();
        assert_eq!((j.kind, j.state), (JobKind::Job, State::Pending));
        assert_eq!(j.tasks[0].describe(), "power on");
        // Applied again unchanged: nothing to do, nothing refused.
        let o = store.apply_bmc(&docs(&first)).await.unwrap();
        assert_eq!(o, [Outcome::Unchanged, Outcome::Unchanged]);
        assert_eq!(store.jobs(Some(State::Pending)).await.unwrap().len(), 1);
        assert!(store.jobs(Some(State::Running)).await.unwrap().is_empty());
    }
}
