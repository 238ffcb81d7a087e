//! Templates and Workflows in `tinkerbox.db`. Documents are stored whole
//! as applied; a Workflow's status lives beside its document and is written
//! only by the engine ([`Store::save_workflow_status`]), checked against
//! the version it read.

use super::{DocTable, Outcome, Store, StoreError, upsert_document};
use crate::clock::now_ms;
use crate::hardware::Key;
use crate::workflow::model::{State, Status, Template, Workflow};
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
    /// The document with its status, as `get workflow -o json` shows it.
    pub fn with_status(&self) -> Value {
        let mut d = self.doc.clone();
        d["status"] = serde_json::to_value(&self.status).unwrap_or_default();
        d
    }
}

/// Which of the two tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TinkKind {
    Template,
    Workflow,
}

impl TinkKind {
    fn table(self) -> DocTable {
        match self {
            TinkKind::Template => DocTable::Templates,
            TinkKind::Workflow => DocTable::Workflows,
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
        Ok((t_out, w_out))
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

    /// Write a Workflow's status if it is still at `version`; returns the
    /// new version. [`StoreError::Stale`] if another writer came first.
    pub async fn save_workflow_status(
        &self,
        key: &Key,
        version: i64,
        status: &Status,
    ) -> Result<i64, StoreError> {
        let text = serde_json::to_string(status)
            .map_err(|e| StoreError::Corrupt(key.clone(), e.to_string()))?;
        let mut tx = self.pool().begin_with("BEGIN IMMEDIATE").await?;
        let id: Option<i64> = sqlx::query_scalar(
            "UPDATE workflows SET status = ?, state = ?, version = version + 1, updated_ms = ?
             WHERE namespace = ? AND name = ? AND version = ? RETURNING id",
        )
        .bind(text)
        .bind(status.state.as_str())
        .bind(now_ms())
        .bind(&key.namespace)
        .bind(&key.name)
        .bind(version)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(id) = id else {
            let found: Option<i64> = sqlx::query_scalar(
                "SELECT version FROM workflows WHERE namespace = ? AND name = ?",
            )
            .bind(&key.namespace)
            .bind(&key.name)
            .fetch_optional(&mut *tx)
            .await?;
            return Err(StoreError::Stale {
                key: key.clone(),
                expected: version,
                found: found.unwrap_or(0),
            });
        };
        let agents: std::collections::BTreeSet<&str> =
            status.tasks.iter().map(|t| t.agent_id.as_str()).collect();
        sqlx::query("DELETE FROM workflow_agents WHERE workflow_id = ?")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        for a in agents {
            sqlx::query("INSERT INTO workflow_agents (agent_id, workflow_id) VALUES (?, ?)")
                .bind(a)
                .bind(id)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(version + 1)
    }

    pub async fn delete_tink(&self, kind: TinkKind, key: &Key) -> Result<bool, StoreError> {
        let r = sqlx::query(kind.table().sql().delete)
            .bind(&key.namespace)
            .bind(&key.name)
            .execute(self.pool())
            .await?;
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
        let (_, o) = store
            .apply_tink(&[], std::slice::from_ref(&w))
            .await
            .unwrap();
        assert_eq!(o, [Outcome::Created]);
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
        assert!(store.delete_tink(TinkKind::Workflow, &w.key).await.unwrap());
        assert!(!store.delete_tink(TinkKind::Workflow, &w.key).await.unwrap());
    }
}
