//! Templates and Workflows in `tinkerbox.db`. Documents are stored whole
//! as applied; a Workflow's status lives beside its document and is written
//! only by the engine ([`Store::save_workflow_status`]), checked against
//! the version it read.

use super::{DocTable, Outcome, Store, StoreError, upsert_document};
use crate::clock::now_ms;
use crate::discovery::rules::RuleSet;
use crate::hardware::Key;
use crate::workflow::model::{Run, State, Status, Template, Workflow};
use serde_json::Value;

/// A stored Workflow: the document, its status and the status version.
#[derive(Debug, Clone)]
pub struct WorkflowRow {
    pub key: Key,
    pub doc: Value,
    pub status: Status,
    pub version: i64,
}

impl WorkflowRow {
    /// Where run `run` of this Workflow's maker stands (the run is the
    /// maker's `annotation` on it): a Workflow of an earlier run is not
    /// the current run's outcome.
    pub fn run(&self, annotation: &str, run: &str) -> Run {
        let this_run = self
            .doc
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(annotation))
            .and_then(Value::as_str)
            == Some(run);
        match self.status.state {
            _ if !this_run => Run::None,
            State::Success => Run::Succeeded,
            State::Failed | State::Timeout => Run::Failed(self.status.failure()),
            _ => Run::Running,
        }
    }

    /// The document with its status, as `get workflow -o json` shows it.
    pub fn with_status(&self) -> Value {
        let mut d = self.doc.clone();
        d["status"] = serde_json::to_value(&self.status).unwrap_or_default();
        d
    }
}

/// Status writes waiting for the next group commit, and the lock of the
/// one committing.
#[derive(Default)]
pub(super) struct StatusQueue {
    queue: std::sync::Mutex<Vec<StatusWrite>>,
    commit: std::sync::Arc<tokio::sync::Mutex<()>>,
    /// Bumped after every committed change of a Workflow (document or
    /// status): what a cache of answers derived from Workflows checks.
    generation: std::sync::atomic::AtomicU64,
    /// Bumped after every committed change of a WorkflowRuleSet: what
    /// enrollment's remembered refusals check.
    rulesets: std::sync::atomic::AtomicU64,
}

struct StatusWrite {
    key: Key,
    version: i64,
    text: String,
    state: State,
    agents: Vec<String>,
    reply: tokio::sync::oneshot::Sender<Result<i64, StoreError>>,
}

/// One version-checked status write inside a transaction: the outer error
/// aborts the transaction, the inner one (`Stale`) is this write's answer.
async fn write_status(
    tx: &mut sqlx::SqliteConnection,
    w: &StatusWrite,
) -> Result<Result<i64, StoreError>, StoreError> {
    let id: Option<i64> = sqlx::query_scalar(
        "UPDATE workflows SET status = ?, state = ?, version = version + 1, updated_ms = ?
         WHERE namespace = ? AND name = ? AND version = ? RETURNING id",
    )
    .bind(&w.text)
    .bind(w.state.as_str())
    .bind(now_ms())
    .bind(&w.key.namespace)
    .bind(&w.key.name)
    .bind(w.version)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(id) = id else {
        let found: Option<i64> =
            sqlx::query_scalar("SELECT version FROM workflows WHERE namespace = ? AND name = ?")
                .bind(&w.key.namespace)
                .bind(&w.key.name)
                .fetch_optional(&mut *tx)
                .await?;
        return Ok(Err(StoreError::Stale {
            key: w.key.clone(),
            expected: w.version,
            found: found.unwrap_or(0),
        }));
    };
    sqlx::query("DELETE FROM workflow_agents WHERE workflow_id = ?")
        .bind(id)
        .execute(&mut *tx)
        .await?;
    for a in &w.agents {
        sqlx::query("INSERT INTO workflow_agents (agent_id, workflow_id) VALUES (?, ?)")
            .bind(a)
            .bind(id)
            .execute(&mut *tx)
            .await?;
    }
    Ok(Ok(w.version + 1))
}

/// The cluster's status of a mirrored Workflow, written over the stored
/// one (the mirror's write; the engine's go through the version check).
/// False when it was the same.
pub(super) async fn import_status(
    tx: &mut sqlx::SqliteConnection,
    key: &Key,
    status: &Status,
) -> Result<bool, StoreError> {
    let text = serde_json::to_string(status)
        .map_err(|e| StoreError::Corrupt(key.clone(), e.to_string()))?;
    let id: Option<i64> = sqlx::query_scalar(
        "UPDATE workflows SET status = ?, state = ?, version = version + 1, updated_ms = ?
         WHERE namespace = ? AND name = ? AND status IS NOT ? RETURNING id",
    )
    .bind(&text)
    .bind(status.state.as_str())
    .bind(now_ms())
    .bind(&key.namespace)
    .bind(&key.name)
    .bind(&text)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(id) = id else { return Ok(false) };
    sqlx::query("DELETE FROM workflow_agents WHERE workflow_id = ?")
        .bind(id)
        .execute(&mut *tx)
        .await?;
    let agents: std::collections::BTreeSet<&str> =
        status.tasks.iter().map(|t| t.agent_id.as_str()).collect();
    for a in agents {
        sqlx::query("INSERT INTO workflow_agents (agent_id, workflow_id) VALUES (?, ?)")
            .bind(a)
            .bind(id)
            .execute(&mut *tx)
            .await?;
    }
    Ok(true)
}

/// Which of the two tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TinkKind {
    Template,
    Workflow,
    WorkflowRuleSet,
}

impl TinkKind {
    fn table(self) -> DocTable {
        match self {
            TinkKind::Template => DocTable::Templates,
            TinkKind::Workflow => DocTable::Workflows,
            TinkKind::WorkflowRuleSet => DocTable::RuleSets,
        }
    }
}

impl Store {
    /// Templates and Workflows in one transaction. A Workflow applied again
    /// keeps its status.
    pub async fn apply_tink(
        &self,
        templates: &[Template],
        workflows: &[Workflow],
    ) -> Result<(Vec<Outcome>, Vec<Outcome>), StoreError> {
        let mut tx = self.pool().begin_with("BEGIN IMMEDIATE").await?;
        let mut t_out = Vec::with_capacity(templates.len());
        for t in templates {
            t_out.push(upsert_document(&mut tx, DocTable::Templates, &t.key, &t.doc).await?);
        }
        let mut w_out = Vec::with_capacity(workflows.len());
        for w in workflows {
            w_out.push(upsert_document(&mut tx, DocTable::Workflows, &w.key, &w.doc).await?);
        }
        tx.commit().await?;
        self.bump_workflows();
        Ok((t_out, w_out))
    }

    /// Changes with every committed change of a Workflow. Read it before
    /// reading Workflows: an answer derived from them is current while the
    /// generation is the one read.
    pub fn workflow_generation(&self) -> u64 {
        self.statuses
            .generation
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// A WorkflowRuleSet changed since a read of this value if it differs.
    pub fn ruleset_generation(&self) -> u64 {
        self.statuses
            .rulesets
            .load(std::sync::atomic::Ordering::Acquire)
    }

    pub(super) fn bump_rulesets(&self) {
        self.statuses
            .rulesets
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// Whether any Workflow is the agent's: a rendered one that has a task
    /// of it, or one not rendered yet whose `hardwareMap` names it (an
    /// operator's new Workflow, before the engine's first pass).
    pub async fn agent_has_workflows(&self, agent: &str) -> Result<bool, StoreError> {
        let found: Option<i64> = sqlx::query_scalar(
            "SELECT 1 FROM workflow_agents WHERE agent_id = ?1
             UNION ALL
             SELECT 1 FROM workflows w, json_each(w.doc, '$.spec.hardwareMap') m
              WHERE w.state = '' AND m.value = ?1
             LIMIT 1",
        )
        .bind(agent)
        .fetch_optional(self.pool())
        .await?;
        Ok(found.is_some())
    }

    /// How many Workflows enrollment made (upstream's label on them).
    pub async fn count_enrolled(&self) -> Result<usize, StoreError> {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM workflows WHERE json_extract(doc, '$.metadata.labels.\"tinkerbell.org/auto-enrollment\"') = 'true'",
        )
        .fetch_one(self.pool())
        .await?;
        Ok(usize::try_from(n).unwrap_or(0))
    }

    pub(super) fn bump_workflows(&self) {
        self.statuses
            .generation
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// WorkflowRuleSets in one transaction. A change bumps the workflow
    /// generation: refusals remembered for agents with no Workflow (no
    /// ruleset matched them) are derived anew.
    pub async fn apply_rulesets(&self, sets: &[RuleSet]) -> Result<Vec<Outcome>, StoreError> {
        let mut tx = self.pool().begin_with("BEGIN IMMEDIATE").await?;
        let mut out = Vec::with_capacity(sets.len());
        for s in sets {
            out.push(upsert_document(&mut tx, DocTable::RuleSets, &s.key, &s.doc).await?);
        }
        tx.commit().await?;
        self.bump_rulesets();
        Ok(out)
    }

    /// Every WorkflowRuleSet (in `namespace`, when given), in namespace and
    /// name order: the order ties are broken in.
    pub async fn rulesets(&self, namespace: Option<&str>) -> Result<Vec<Value>, StoreError> {
        let rows: Vec<(String, String, String)> = sqlx::query_as(
            "SELECT namespace, name, doc FROM workflow_rulesets WHERE ?1 IS NULL OR namespace = ?1 ORDER BY namespace, name",
        )
        .bind(namespace)
        .fetch_all(self.pool())
        .await?;
        rows.into_iter()
            .map(|(ns, name, doc)| parse(&Key::new(ns, name), &doc))
            .collect()
    }

    pub async fn ruleset(&self, key: &Key) -> Result<Option<Value>, StoreError> {
        let doc: Option<String> = sqlx::query_scalar(DocTable::RuleSets.sql().doc)
            .bind(&key.namespace)
            .bind(&key.name)
            .fetch_optional(self.pool())
            .await?;
        doc.map(|d| parse(key, &d)).transpose()
    }

    pub async fn template(&self, key: &Key) -> Result<Option<Value>, StoreError> {
        let r: Option<(String,)> =
            sqlx::query_as("SELECT doc FROM templates WHERE namespace = ? AND name = ?")
                .bind(&key.namespace)
                .bind(&key.name)
                .fetch_optional(self.pool())
                .await?;
        r.map(|(d,)| parse(key, &d)).transpose()
    }

    pub async fn templates(&self, namespace: Option<&str>) -> Result<Vec<Value>, StoreError> {
        let rows: Vec<(String, String, String)> = sqlx::query_as(
            "SELECT namespace, name, doc FROM templates WHERE ?1 IS NULL OR namespace = ?1 ORDER BY namespace, name",
        )
        .bind(namespace)
        .fetch_all(self.pool())
        .await?;
        rows.into_iter()
            .map(|(ns, name, d)| parse(&Key::new(ns, name), &d))
            .collect()
    }

    pub async fn workflow(&self, key: &Key) -> Result<Option<WorkflowRow>, StoreError> {
        let r: Option<(String, String, String, String, i64)> = sqlx::query_as(
            "SELECT namespace, name, doc, status, version FROM workflows WHERE namespace = ? AND name = ?",
        )
        .bind(&key.namespace)
        .bind(&key.name)
        .fetch_optional(self.pool())
        .await?;
        r.map(row).transpose()
    }

    /// Workflows, by namespace and name; `states` narrows them (by index).
    pub async fn workflows(
        &self,
        namespace: Option<&str>,
        states: &[State],
    ) -> Result<Vec<WorkflowRow>, StoreError> {
        let states: Vec<&str> = states.iter().map(|s| s.as_str()).collect();
        let rows: Vec<(String, String, String, String, i64)> = sqlx::query_as(
            "SELECT namespace, name, doc, status, version FROM workflows
             WHERE (?1 IS NULL OR namespace = ?1)
               AND (?2 = '[]' OR state IN (SELECT value FROM json_each(?2)))
             ORDER BY namespace, name",
        )
        .bind(namespace)
        .bind(serde_json::to_string(&states).unwrap_or_else(|_| "[]".into()))
        .fetch_all(self.pool())
        .await?;
        rows.into_iter().map(row).collect()
    }

    /// The Workflows whose `spec.hardwareRef` is Hardware `hw`.
    pub async fn workflows_of_hardware(&self, hw: &Key) -> Result<Vec<WorkflowRow>, StoreError> {
        let rows: Vec<(String, String, String, String, i64)> = sqlx::query_as(
            "SELECT namespace, name, doc, status, version FROM workflows
             WHERE namespace = ?1 AND json_extract(doc, '$.spec.hardwareRef') = ?2
             ORDER BY name",
        )
        .bind(&hw.namespace)
        .bind(&hw.name)
        .fetch_all(self.pool())
        .await?;
        rows.into_iter().map(row).collect()
    }

    /// The workflows with a task for `agent`, oldest first. (Upstream
    /// finds them by status.agentID, the first task's agent, so the agent
    /// of a second task is never served.)
    pub async fn workflows_of_agent(&self, agent: &str) -> Result<Vec<WorkflowRow>, StoreError> {
        let rows: Vec<(String, String, String, String, i64)> = sqlx::query_as(
            "SELECT w.namespace, w.name, w.doc, w.status, w.version
             FROM workflow_agents a JOIN workflows w ON w.id = a.workflow_id
             WHERE a.agent_id = ? ORDER BY w.id",
        )
        .bind(agent)
        .fetch_all(self.pool())
        .await?;
        rows.into_iter().map(row).collect()
    }

    /// Write a Workflow's status over `version` (the one it was read
    /// with); `Stale` when someone wrote it since. Returns the new version.
    ///
    /// Writes are group-committed: every write is `synchronous = FULL`
    /// (a report acknowledged to an agent survives a crash), and one fsync
    /// per write capped a rack of agents at the disk's fsync rate. A writer
    /// queues its write, then whoever holds the commit lock commits all
    /// queued writes in one transaction, each still checked against its
    /// own version. The commit runs in its own task, so a caller that goes
    /// away (a gRPC client that hung up) cannot cut it short for the others.
    pub async fn save_workflow_status(
        &self,
        key: &Key,
        version: i64,
        status: &Status,
    ) -> Result<i64, StoreError> {
        let text = serde_json::to_string(status)
            .map_err(|e| StoreError::Corrupt(key.clone(), e.to_string()))?;
        let agents: std::collections::BTreeSet<String> =
            status.tasks.iter().map(|t| t.agent_id.clone()).collect();
        let (reply, done) = tokio::sync::oneshot::channel();
        let write = StatusWrite {
            key: key.clone(),
            version,
            text,
            state: status.state,
            agents: agents.into_iter().collect(),
            reply,
        };
        self.statuses
            .queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(write);
        let lock = self.statuses.commit.clone().lock_owned().await;
        let batch = std::mem::take(
            &mut *self
                .statuses
                .queue
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        if !batch.is_empty() {
            let store = self.clone();
            // Ours is in this batch or an earlier one: either way it is
            // answered before the lock is given up.
            let _ = tokio::spawn(async move {
                store.commit_statuses(batch).await;
                drop(lock);
            })
            .await;
        } else {
            drop(lock);
        }
        done.await.unwrap_or_else(|_| {
            Err(StoreError::Io(std::io::Error::other(
                "workflow status write lost (commit task ended)",
            )))
        })
    }

    /// One transaction for the batch; if it fails as a whole, each write
    /// again alone, so that each gets its own answer.
    async fn commit_statuses(&self, batch: Vec<StatusWrite>) {
        let all = async {
            let mut tx = self.pool().begin_with("BEGIN IMMEDIATE").await?;
            let mut results = Vec::with_capacity(batch.len());
            for w in &batch {
                results.push(write_status(&mut tx, w).await?);
            }
            tx.commit().await?;
            Ok::<_, StoreError>(results)
        }
        .await;
        self.bump_workflows();
        match all {
            Ok(results) => {
                for (w, r) in batch.into_iter().zip(results) {
                    let _ = w.reply.send(r);
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, writes = batch.len(), "workflow status group commit failed: writing one by one");
                for w in batch {
                    let one = async {
                        let mut tx = self.pool().begin_with("BEGIN IMMEDIATE").await?;
                        let r = write_status(&mut tx, &w).await?;
                        tx.commit().await?;
                        Ok::<_, StoreError>(r)
                    }
                    .await;
                    self.bump_workflows();
                    let _ = w.reply.send(one.and_then(|r| r));
                }
            }
        }
    }

    pub async fn delete_tink(&self, kind: TinkKind, key: &Key) -> Result<bool, StoreError> {
        let r = sqlx::query(kind.table().sql().delete)
            .bind(&key.namespace)
            .bind(&key.name)
            .execute(self.pool())
            .await?;
        match kind {
            TinkKind::WorkflowRuleSet => self.bump_rulesets(),
            _ => self.bump_workflows(),
        }
        Ok(r.rows_affected() > 0)
    }
}

fn parse(key: &Key, doc: &str) -> Result<Value, StoreError> {
    serde_json::from_str(doc).map_err(|e| StoreError::Corrupt(key.clone(), e.to_string()))
}

fn row(
    (ns, name, doc, status, version): (String, String, String, String, i64),
) -> Result<WorkflowRow, StoreError> {
    let key = Key::new(ns, name);
    let doc = parse(&key, &doc)?;
    let status = serde_json::from_str(&status)
        .map_err(|e| StoreError::Corrupt(key.clone(), format!("status: {e}")))?;
    Ok(WorkflowRow {
        key,
        doc,
        status,
        version,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workflow::model;
    use serde_json::json;

    fn wf(name: &str) -> Workflow {
        model::workflow(json!({"apiVersion": model::API_VERSION, "kind": "Workflow",
            "metadata": {"name": name}, "spec": {"templateRef": "t", "hardwareRef": "h"}}))
        .unwrap()
    }

    #[tokio::test]
    async fn status_survives_apply_and_writes_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("t.db")).await.unwrap();
        let w = wf("w1");
        let g0 = store.workflow_generation();
        let (_, o) = store
            .apply_tink(&[], std::slice::from_ref(&w))
            .await
            .unwrap();
        assert_eq!(o, [Outcome::Created]);
        // Every committed change moves the generation (GetAction's cache).
        let g1 = store.workflow_generation();
        assert!(g1 > g0);
        let row = store.workflow(&w.key).await.unwrap().unwrap();
        assert_eq!(row.status.state, State::New);
        let mut s = row.status.clone();
        s.state = State::Pending;
        s.agent_id = Some("02:00:00:00:00:01".into());
        s.tasks = vec![model::Task {
            agent_id: "02:00:00:00:00:01".into(),
            ..model::Task::default()
        }];
        let v = store
            .save_workflow_status(&w.key, row.version, &s)
            .await
            .unwrap();
        let g2 = store.workflow_generation();
        assert!(g2 > g1);
        // A second writer that read the old version loses, and says so.
        let e = store
            .save_workflow_status(&w.key, row.version, &s)
            .await
            .unwrap_err();
        assert!(
            matches!(e, StoreError::Stale { found, .. } if found == v),
            "{e}"
        );
        // Applying the document again (changed or not) keeps the status.
        let mut w2 = w.clone();
        w2.doc["metadata"]["labels"] = json!({"a": "b"});
        let (_, o) = store.apply_tink(&[], &[w.clone(), w2]).await.unwrap();
        assert_eq!(o, [Outcome::Unchanged, Outcome::Configured]);
        let row = store.workflow(&w.key).await.unwrap().unwrap();
        assert_eq!(row.status.state, State::Pending);
        assert_eq!(row.with_status()["status"]["state"], "PENDING");
        let mine = store.workflows_of_agent("02:00:00:00:00:01").await.unwrap();
        assert_eq!(mine.len(), 1);
        assert_eq!(
            store
                .workflows(None, &[State::Pending])
                .await
                .unwrap()
                .len(),
            1
        );
        assert_eq!(
            store
                .workflows(None, &[State::Running])
                .await
                .unwrap()
                .len(),
            0
        );
        assert_eq!(
            store.workflows(Some("default"), &[]).await.unwrap().len(),
            1
        );
        let g3 = store.workflow_generation();
        assert!(store.delete_tink(TinkKind::Workflow, &w.key).await.unwrap());
        assert!(store.workflow_generation() > g3);
        assert!(!store.delete_tink(TinkKind::Workflow, &w.key).await.unwrap());
    }

    /// Many writers at once are committed together, each still checked
    /// against its own version; a cancelled writer does not lose the others'.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_writes_are_group_committed_and_each_checked() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("t.db")).await.unwrap();
        let wfs: Vec<Workflow> = (0..64).map(|i| wf(&format!("w{i}"))).collect();
        store.apply_tink(&[], &wfs).await.unwrap();
        let v0 = store.workflow(&wfs[0].key).await.unwrap().unwrap().version;
        let mut tasks = vec![];
        for (i, w) in wfs.iter().enumerate() {
            // Two writers per Workflow read the same version: one wins.
            for n in 0..2 {
                let (store, key) = (store.clone(), w.key.clone());
                tasks.push(tokio::spawn(async move {
                    let s = Status {
                        state: State::Pending,
                        agent_id: Some(format!("agent-{i}-{n}")),
                        ..Status::default()
                    };
                    let r = store.save_workflow_status(&key, v0, &s).await;
                    (i, r)
                }));
            }
        }
        // And one writer given up on at once (as a gRPC call whose client
        // hung up).
        let (s2, k2) = (store.clone(), wfs[0].key.clone());
        let dropped =
            tokio::spawn(async move { s2.save_workflow_status(&k2, 99, &Status::default()).await });
        dropped.abort();
        let mut won = vec![0; wfs.len()];
        for t in tasks {
            let (i, r) = t.await.unwrap();
            match r {
                Ok(v) => {
                    assert_eq!(v, v0 + 1);
                    won[i] += 1;
                }
                Err(StoreError::Stale { found, .. }) if found == v0 + 1 => {}
                Err(e) => panic!("{e}"),
            }
        }
        assert!(won.iter().all(|w| *w == 1), "{won:?}");
        let rows = store.workflows(None, &[State::Pending]).await.unwrap();
        assert_eq!(rows.len(), wfs.len());
        assert!(rows.iter().all(|r| r.version == v0 + 1));
    }
}
