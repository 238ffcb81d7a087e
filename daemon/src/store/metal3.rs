//! BareMetalHosts and HardwareData in `tinkerbox.db`. A host's document
//! is kept as applied; its status and tinkerbox's bookkeeping of it
//! beside it, written only by the lifecycle controller and checked against
//! the version it read (a change of the document bumps it too, so a pass
//! that read an older document never writes over a newer one's status).

use super::{Outcome, Store, StoreError};
use crate::clock::now_ms;
use crate::hardware::Key;
use crate::metal3::model::{DataSecret, Host, Status};
use crate::metal3::state::Private;
use serde_json::Value;

/// A stored host.
#[derive(Debug, Clone)]
pub struct HostRow {
    pub key: Key,
    pub doc: Value,
    pub status: Status,
    pub private: Private,
    pub version: i64,
    pub created_ms: i64,
}

/// RFC 3339 (seconds) of a time in ms since the epoch.
pub fn rfc3339(ms: i64) -> String {
    let t =
        std::time::UNIX_EPOCH + std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    humantime::format_rfc3339_seconds(t).to_string()
}

impl HostRow {
    /// The document as `get -o json` shows it: with its status, and the
    /// creation time the API server would have set.
    pub fn with_status(&self) -> Value {
        let mut d = self.doc.clone();
        if let Some(m) = d.get_mut("metadata").and_then(Value::as_object_mut) {
            m.entry("creationTimestamp")
                .or_insert_with(|| Value::String(rfc3339(self.created_ms)));
        }
        d["status"] = serde_json::to_value(&self.status).unwrap_or_default();
        d
    }
}

fn parse(key: &Key, text: &str, what: &str) -> Result<Value, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(key.clone(), format!("{what}: {e}")))
}

type Raw = (String, String, String, String, String, i64, i64);

fn host_row(
    (ns, name, doc, status, private, version, created_ms): Raw,
) -> Result<HostRow, StoreError> {
    let key = Key::new(ns, name);
    let doc = parse(&key, &doc, "document")?;
    let status = serde_json::from_value(parse(&key, &status, "status")?)
        .map_err(|e| StoreError::Corrupt(key.clone(), format!("status: {e}")))?;
    let private = serde_json::from_value(parse(&key, &private, "bookkeeping")?)
        .map_err(|e| StoreError::Corrupt(key.clone(), format!("bookkeeping: {e}")))?;
    Ok(HostRow {
        key,
        doc,
        status,
        private,
        version,
        created_ms,
    })
}

/// The columns of [`Raw`] (a macro: sqlx takes only static SQL).
macro_rules! select_hosts {
    ($where:literal) => {
        concat!(
            "SELECT namespace, name, doc, status, private, version, created_ms FROM baremetalhosts ",
            $where
        )
    };
}

/// What a user's apply cannot change: the deletion under way.
fn carry_over(old: &Value, new: &mut Value) {
    if let Some(ts) = old.pointer("/metadata/deletionTimestamp").cloned()
        && let Some(m) = new.get_mut("metadata").and_then(Value::as_object_mut)
    {
        m.insert("deletionTimestamp".into(), ts);
    }
}

/// A host's document, created or replaced (its status kept); a change
/// bumps its version.
pub(super) async fn upsert_host(
    tx: &mut sqlx::SqliteConnection,
    h: &Host,
) -> Result<Outcome, StoreError> {
    let old: Option<String> =
        sqlx::query_scalar("SELECT doc FROM baremetalhosts WHERE namespace = ? AND name = ?")
            .bind(&h.key.namespace)
            .bind(&h.key.name)
            .fetch_optional(&mut *tx)
            .await?;
    let mut doc = h.doc.clone();
    let outcome = match &old {
        Some(o) => {
            let old = parse(&h.key, o, "document")?;
            carry_over(&old, &mut doc);
            if old == doc {
                return Ok(Outcome::Unchanged);
            }
            Outcome::Configured
        }
        None => Outcome::Created,
    };
    let now = now_ms();
    sqlx::query(
        "INSERT INTO baremetalhosts (namespace, name, doc, created_ms, updated_ms) VALUES (?, ?, ?, ?, ?)
         ON CONFLICT (namespace, name) DO UPDATE SET doc = excluded.doc, version = version + 1,
         updated_ms = excluded.updated_ms",
    )
    .bind(&h.key.namespace)
    .bind(&h.key.name)
    .bind(doc.to_string())
    .bind(now)
    .bind(now)
    .execute(&mut *tx)
    .await?;
    Ok(outcome)
}

/// A host data Secret, created or replaced.
pub(super) async fn upsert_data_secret(
    tx: &mut sqlx::SqliteConnection,
    d: &DataSecret,
) -> Result<Outcome, StoreError> {
    let text = serde_json::to_string(&d.data)
        .map_err(|e| StoreError::Corrupt(d.key.clone(), e.to_string()))?;
    let old: Option<String> =
        sqlx::query_scalar("SELECT data FROM host_data_secrets WHERE namespace = ? AND name = ?")
            .bind(&d.key.namespace)
            .bind(&d.key.name)
            .fetch_optional(&mut *tx)
            .await?;
    if old.as_deref() == Some(text.as_str()) {
        return Ok(Outcome::Unchanged);
    }
    sqlx::query(
        "INSERT INTO host_data_secrets (namespace, name, data, updated_ms) VALUES (?, ?, ?, ?)
         ON CONFLICT (namespace, name) DO UPDATE SET data = excluded.data, updated_ms = excluded.updated_ms",
    )
    .bind(&d.key.namespace)
    .bind(&d.key.name)
    .bind(text)
    .bind(now_ms())
    .execute(&mut *tx)
    .await?;
    Ok(if old.is_some() {
        Outcome::Configured
    } else {
        Outcome::Created
    })
}

impl Store {
    pub async fn apply_data_secrets(
        &self,
        secrets: &[DataSecret],
    ) -> Result<Vec<Outcome>, StoreError> {
        let mut tx = self.pool().begin_with("BEGIN IMMEDIATE").await?;
        let mut out = Vec::with_capacity(secrets.len());
        for d in secrets {
            out.push(upsert_data_secret(&mut tx, d).await?);
        }
        tx.commit().await?;
        Ok(out)
    }

    pub async fn delete_data_secret(&self, key: &Key) -> Result<bool, StoreError> {
        let n = sqlx::query("DELETE FROM host_data_secrets WHERE namespace = ? AND name = ?")
            .bind(&key.namespace)
            .bind(&key.name)
            .execute(self.pool())
            .await?
            .rows_affected();
        Ok(n > 0)
    }

    /// A host data Secret's values, if there is one.
    pub async fn data_secret(
        &self,
        key: &Key,
    ) -> Result<Option<std::collections::BTreeMap<String, String>>, StoreError> {
        let r: Option<String> = sqlx::query_scalar(
            "SELECT data FROM host_data_secrets WHERE namespace = ? AND name = ?",
        )
        .bind(&key.namespace)
        .bind(&key.name)
        .fetch_optional(self.pool())
        .await?;
        r.map(|t| {
            serde_json::from_str(&t).map_err(|e| StoreError::Corrupt(key.clone(), e.to_string()))
        })
        .transpose()
    }

    /// Hosts as applied, in one transaction; a host applied again keeps
    /// its status.
    pub async fn apply_hosts(&self, hosts: &[Host]) -> Result<Vec<Outcome>, StoreError> {
        let mut tx = self.pool().begin_with("BEGIN IMMEDIATE").await?;
        let mut out = Vec::with_capacity(hosts.len());
        for h in hosts {
            out.push(upsert_host(&mut tx, h).await?);
        }
        tx.commit().await?;
        Ok(out)
    }

    /// Every host (in `namespace`, when given), by namespace and name.
    pub async fn hosts(&self, namespace: Option<&str>) -> Result<Vec<HostRow>, StoreError> {
        let rows: Vec<Raw> = sqlx::query_as(select_hosts!(
            "WHERE ?1 IS NULL OR namespace = ?1 ORDER BY namespace, name"
        ))
        .bind(namespace)
        .fetch_all(self.pool())
        .await?;
        rows.into_iter().map(host_row).collect()
    }

    pub async fn host(&self, key: &Key) -> Result<Option<HostRow>, StoreError> {
        let r: Option<Raw> = sqlx::query_as(select_hosts!("WHERE namespace = ? AND name = ?"))
            .bind(&key.namespace)
            .bind(&key.name)
            .fetch_optional(self.pool())
            .await?;
        r.map(host_row).transpose()
    }

    /// The controller's write: status and bookkeeping, and the document
    /// when it changed it (an annotation removed), if the host is still
    /// at `version`. Returns the new version.
    pub async fn save_host(
        &self,
        key: &Key,
        version: i64,
        doc: Option<&Value>,
        status: &Status,
        private: &Private,
    ) -> Result<i64, StoreError> {
        let text = |v: serde_json::Result<String>| {
            v.map_err(|e| StoreError::Corrupt(key.clone(), e.to_string()))
        };
        let status = text(serde_json::to_string(status))?;
        let private = text(serde_json::to_string(private))?;
        self.update_host(key, version, doc, Some(&status), Some(&private))
            .await
    }

    /// A host's document replaced (a claim or a release), if the host is
    /// still at `version`.
    pub async fn replace_host_doc(
        &self,
        key: &Key,
        version: i64,
        doc: &Value,
    ) -> Result<i64, StoreError> {
        self.update_host(key, version, Some(doc), None, None).await
    }

    /// The one version-checked write of a host: what is given replaced.
    async fn update_host(
        &self,
        key: &Key,
        version: i64,
        doc: Option<&Value>,
        status: Option<&str>,
        private: Option<&str>,
    ) -> Result<i64, StoreError> {
        let n = sqlx::query(
            "UPDATE baremetalhosts SET status = coalesce(?, status), private = coalesce(?, private),
             doc = coalesce(?, doc), version = version + 1, updated_ms = ?
             WHERE namespace = ? AND name = ? AND version = ?",
        )
        .bind(status)
        .bind(private)
        .bind(doc.map(Value::to_string))
        .bind(now_ms())
        .bind(&key.namespace)
        .bind(&key.name)
        .bind(version)
        .execute(self.pool())
        .await?
        .rows_affected();
        if n == 0 {
            let found: Option<i64> = sqlx::query_scalar(
                "SELECT version FROM baremetalhosts WHERE namespace = ? AND name = ?",
            )
            .bind(&key.namespace)
            .bind(&key.name)
            .fetch_optional(self.pool())
            .await?;
            return Err(StoreError::Stale {
                key: key.clone(),
                expected: version,
                found: found.unwrap_or(0),
            });
        }
        Ok(version + 1)
    }

    /// A delete asked for: the time is set on the document (as the API
    /// server sets `deletionTimestamp` on an object with a finalizer) and
    /// the controller takes the host down. False when there is no host.
    pub async fn mark_host_deleted(&self, key: &Key, at: &str) -> Result<bool, StoreError> {
        let n = sqlx::query(
            "UPDATE baremetalhosts SET doc = json_set(doc, '$.metadata.deletionTimestamp', ?),
             version = version + 1, updated_ms = ?
             WHERE namespace = ? AND name = ? AND json_extract(doc, '$.metadata.deletionTimestamp') IS NULL",
        )
        .bind(at)
        .bind(now_ms())
        .bind(&key.namespace)
        .bind(&key.name)
        .execute(self.pool())
        .await?
        .rows_affected();
        if n > 0 {
            return Ok(true);
        }
        Ok(self.host(key).await?.is_some())
    }

    /// The host gone, with its HardwareData (the finalizer's last step).
    pub async fn remove_host(&self, key: &Key) -> Result<bool, StoreError> {
        let mut tx = self.pool().begin_with("BEGIN IMMEDIATE").await?;
        let n = sqlx::query("DELETE FROM baremetalhosts WHERE namespace = ? AND name = ?")
            .bind(&key.namespace)
            .bind(&key.name)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        sqlx::query("DELETE FROM hardware_data WHERE namespace = ? AND name = ?")
            .bind(&key.namespace)
            .bind(&key.name)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(n > 0)
    }

    pub async fn save_hardware_data(&self, key: &Key, doc: &Value) -> Result<(), StoreError> {
        let now = now_ms();
        sqlx::query(
            "INSERT INTO hardware_data (namespace, name, doc, created_ms, updated_ms) VALUES (?, ?, ?, ?, ?)
             ON CONFLICT (namespace, name) DO UPDATE SET doc = excluded.doc, updated_ms = excluded.updated_ms",
        )
        .bind(&key.namespace)
        .bind(&key.name)
        .bind(doc.to_string())
        .bind(now)
        .bind(now)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    pub async fn hardware_data(&self, key: &Key) -> Result<Option<Value>, StoreError> {
        let r: Option<(String, i64)> = sqlx::query_as(
            "SELECT doc, created_ms FROM hardware_data WHERE namespace = ? AND name = ?",
        )
        .bind(&key.namespace)
        .bind(&key.name)
        .fetch_optional(self.pool())
        .await?;
        r.map(|(d, c)| with_created(parse(key, &d, "document")?, c))
            .transpose()
    }

    pub async fn hardware_datas(&self, namespace: Option<&str>) -> Result<Vec<Value>, StoreError> {
        let rows: Vec<(String, String, String, i64)> = sqlx::query_as(
            "SELECT namespace, name, doc, created_ms FROM hardware_data WHERE ?1 IS NULL OR namespace = ?1
             ORDER BY namespace, name",
        )
        .bind(namespace)
        .fetch_all(self.pool())
        .await?;
        rows.into_iter()
            .map(|(ns, name, d, c)| with_created(parse(&Key::new(ns, name), &d, "document")?, c))
            .collect()
    }
}

/// A BMC job as the lifecycle controller reads it: its state, the run it
/// was made for, its message.
#[derive(Debug, Clone)]
pub struct JobRun {
    pub state: crate::store::bmc::State,
    pub run: Option<String>,
    pub message: Option<String>,
}

impl Store {
    pub async fn job_run(&self, key: &Key) -> Result<Option<JobRun>, StoreError> {
        let r: Option<(crate::store::bmc::State, Option<String>, Option<String>)> = sqlx::query_as(
            "SELECT state, json_extract(doc, '$.metadata.annotations.\"tinkerbox.io/workflow-run\"'), message
             FROM bmc_jobs WHERE namespace = ? AND name = ?",
        )
        .bind(&key.namespace)
        .bind(&key.name)
        .fetch_optional(self.pool())
        .await?;
        Ok(r.map(|(state, run, message)| JobRun {
            state,
            run,
            message,
        }))
    }

    /// When a BMC Secret was last written (its version, as a host's
    /// `goodCredentials` records it), if there is one.
    pub async fn secret_version(&self, key: &Key) -> Result<Option<i64>, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT updated_ms FROM bmc_secrets WHERE namespace = ? AND name = ?",
        )
        .bind(&key.namespace)
        .bind(&key.name)
        .fetch_optional(self.pool())
        .await?)
    }

    /// A BMC Machine a host owned, and every job of it, gone.
    pub async fn remove_bmc_machine(&self, key: &Key) -> Result<bool, StoreError> {
        let mut tx = self.pool().begin_with("BEGIN IMMEDIATE").await?;
        sqlx::query(
            "DELETE FROM bmc_jobs WHERE machine_ns = ? AND machine_name = ? AND state != 'running'",
        )
        .bind(&key.namespace)
        .bind(&key.name)
        .execute(&mut *tx)
        .await?;
        let n = sqlx::query("DELETE FROM bmc_machines WHERE namespace = ? AND name = ?")
            .bind(&key.namespace)
            .bind(&key.name)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        Ok(n > 0)
    }
}

fn with_created(mut d: Value, created_ms: i64) -> Result<Value, StoreError> {
    if let Some(m) = d.get_mut("metadata").and_then(Value::as_object_mut) {
        m.entry("creationTimestamp")
            .or_insert_with(|| Value::String(rfc3339(created_ms)));
    }
    Ok(d)
}
