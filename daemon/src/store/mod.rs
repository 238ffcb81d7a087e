//! The store: SQLite through sqlx, the source of truth (`tinkerbox.db`).
//! Every write is one transaction with `synchronous = FULL`, so a write
//! that returned success survives kill -9 and power loss. Nothing on a
//! packet path reads from here; the [`crate::inventory`] is built from it.
//! The event log has a database of its own ([`crate::events::log`]).

use crate::clock::now_ms;
use crate::hardware::{Hardware, Key, Machine};
use serde::Serialize;
use serde_json::Value;
use sqlx::Row;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

pub mod bmc;
pub mod leases;
pub mod metal3;
pub mod mirror;
pub mod workflow;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/store");

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A MAC or IP already belongs to another Hardware.
    #[error("{field}: {message}")]
    Conflict {
        field: String,
        message: String,
        owner: Key,
    },
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    #[error("database migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// The file was made by a development build whose migrations were
    /// squashed since.
    #[error("{0}")]
    Outdated(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("stored document for {0} is corrupt: {1}")]
    Corrupt(Key, String),
    /// A read-modify-write lost a race: the object changed since it was read.
    #[error(
        "{key} changed while this change was made (generation {found}, not {expected}); read it again and retry"
    )]
    Stale { key: Key, expected: i64, found: i64 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Created,
    Configured,
    Unchanged,
}

impl StoreError {
    /// A conflict in item `i` of a batch: its field prefixed with `[i]`.
    fn within(self, i: usize) -> StoreError {
        match self {
            StoreError::Conflict {
                field,
                message,
                owner,
            } => StoreError::Conflict {
                field: format!("[{i}].{field}"),
                message,
                owner,
            },
            other => other,
        }
    }
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Created => "created",
            Outcome::Configured => "configured",
            Outcome::Unchanged => "unchanged",
        }
    }
}

/// The tables that keep documents whole by (namespace, name), for the
/// one upsert they share.
#[derive(Debug, Clone, Copy)]
pub(crate) enum DocTable {
    BmcMachines,
    Templates,
    Workflows,
    RuleSets,
}

/// The statements per table, static (sqlx refuses SQL built at run time).
pub(crate) struct DocSql {
    doc: &'static str,
    upsert: &'static str,
    pub(crate) delete: &'static str,
}

macro_rules! doc_sql {
    ($table:literal) => {
        DocSql {
            doc: concat!("SELECT doc FROM ", $table, " WHERE namespace = ? AND name = ?"),
            upsert: concat!(
                "INSERT INTO ", $table, " (namespace, name, doc, created_ms, updated_ms) VALUES (?, ?, ?, ?, ?) ",
                "ON CONFLICT (namespace, name) DO UPDATE SET doc = excluded.doc, updated_ms = excluded.updated_ms"
            ),
            delete: concat!("DELETE FROM ", $table, " WHERE namespace = ? AND name = ?"),
        }
    };
}

impl DocTable {
    pub(crate) fn sql(self) -> DocSql {
        match self {
            DocTable::BmcMachines => doc_sql!("bmc_machines"),
            DocTable::Templates => doc_sql!("templates"),
            DocTable::Workflows => doc_sql!("workflows"),
            DocTable::RuleSets => doc_sql!("workflow_rulesets"),
        }
    }
}

/// Create or replace a document: Unchanged when it is the same JSON.
pub(crate) async fn upsert_document(
    tx: &mut sqlx::SqliteConnection,
    table: DocTable,
    key: &Key,
    doc: &Value,
) -> Result<Outcome, StoreError> {
    let sql = table.sql();
    let old: Option<(String,)> = sqlx::query_as(sql.doc)
        .bind(&key.namespace)
        .bind(&key.name)
        .fetch_optional(&mut *tx)
        .await?;
    if let Some((o,)) = &old
        && serde_json::from_str::<Value>(o).ok().as_ref() == Some(doc)
    {
        return Ok(Outcome::Unchanged);
    }
    let now = crate::clock::now_ms();
    sqlx::query(sql.upsert)
        .bind(&key.namespace)
        .bind(&key.name)
        .bind(doc.to_string())
        .bind(now)
        .bind(now)
        .execute(&mut *tx)
        .await?;
    Ok(if old.is_some() {
        Outcome::Configured
    } else {
        Outcome::Created
    })
}

#[derive(Clone)]
pub struct Store {
    pool: SqlitePool,
    /// Workflow status writes waiting for a group commit.
    statuses: Arc<workflow::StatusQueue>,
}

/// Why [`migrate`] failed.
pub(crate) enum MigrateFailed {
    Db(sqlx::Error),
    Migrate(sqlx::migrate::MigrateError),
    /// The file's history is not this build's (its migrations were squashed
    /// before the first release): what to do about it, in words.
    Outdated(String),
}

/// Run `migrator` on `pool` (the database at `path`). Until the first
/// release each database has one migration, edited in place as the schema
/// grows, so a database made by an older development build (a migration
/// it applied is gone, or was since changed) is refused with what to do,
/// not with sqlx's "previously applied but is missing/modified".
pub(crate) async fn migrate(
    migrator: &sqlx::migrate::Migrator,
    pool: &SqlitePool,
    path: &Path,
) -> Result<(), MigrateFailed> {
    let has_history: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations')",
    )
    .fetch_one(pool)
    .await
    .map_err(MigrateFailed::Db)?;
    if has_history {
        let applied: Vec<(i64, Vec<u8>)> =
            sqlx::query_as("SELECT version, checksum FROM _sqlx_migrations")
                .fetch_all(pool)
                .await
                .map_err(MigrateFailed::Db)?;
        let stale = applied.iter().find(|(v, sum)| {
            !migrator
                .iter()
                .any(|m| m.version == *v && m.checksum.as_ref() == sum.as_slice())
        });
        if let Some((v, _)) = stale {
            return Err(MigrateFailed::Outdated(format!(
                "{}: made by an older development build of tinkerbox (its migration {v} is not this build's); \
                 there has been no release with a stable schema yet: stop tinkerbox, move tinkerbox.db and events.db \
                 out of the state directory, start it again and apply your documents again",
                path.display()
            )));
        }
    }
    migrator.run(pool).await.map_err(MigrateFailed::Migrate)
}

/// Make `path` and its WAL files readable by the owner only, whatever the
/// umask: the store holds BMC credentials.
pub(crate) fn owner_only(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    for suffix in ["", "-wal", "-shm"] {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        if let Ok(meta) = std::fs::metadata(&p)
            && meta.permissions().mode() & 0o077 != 0
        {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600))?;
        }
    }
    Ok(())
}

impl Store {
    /// Open (creating if needed) and migrate the database at `path`.
    pub async fn open(path: &Path) -> Result<Store, StoreError> {
        let opts = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(5));
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(opts)
            .await?;
        migrate(&MIGRATOR, &pool, path).await.map_err(|e| match e {
            MigrateFailed::Db(e) => StoreError::Db(e),
            MigrateFailed::Migrate(e) => StoreError::Migrate(e),
            MigrateFailed::Outdated(m) => StoreError::Outdated(m),
        })?;
        owner_only(path)?;
        Ok(Store {
            pool,
            statuses: Arc::default(),
        })
    }

    /// Every stored Hardware as the inventory holds it.
    ///
    /// Documents come a page per row, joined by SQLite: sqlx passes each row
    /// from its SQLite thread to ours through a channel, and at 100,000 rows
    /// the thread wake-ups took longer (~0.6 s) than SQLite and parsing
    /// together. The separators are ASCII RS and US, which neither names
    /// (RFC 1123) nor JSON text (control characters only escaped) contain.
    /// The next page is read while this one is parsed. Parsing stays on one
    /// thread: spread over threads (and so malloc arenas) it was 30% faster
    /// but left 15-30 MiB more resident, in holes between records.
    pub async fn load_machines(&self) -> Result<Vec<Machine>, StoreError> {
        // Small enough that a page (~200 KB) does not leave a large hole.
        const PAGE: i64 = 500;
        // One connection for the whole scan, so that one page cache fills
        // (not one per pooled connection), and is emptied at the end.
        let mut conn = self.pool.acquire().await?;
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM hardware")
            .fetch_one(&mut *conn)
            .await?;
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<SqliteRow, sqlx::Error>>(2);
        let reader = tokio::spawn(async move {
            let mut after = 0i64;
            loop {
                let page = sqlx::query(
                    "SELECT max(id), group_concat(namespace || char(31) || name || char(31) || doc, char(30))
                     FROM (SELECT id, namespace, name, doc FROM hardware WHERE id > ? ORDER BY id LIMIT ?)",
                )
                .bind(after)
                .bind(PAGE)
                .fetch_one(&mut *conn)
                .await;
                let next = match page.and_then(|r| Ok((r.try_get::<Option<i64>, _>(0)?, r))) {
                    Ok((Some(last), row)) => {
                        after = last;
                        Ok(row)
                    }
                    Ok((None, _)) => break,
                    Err(e) => Err(e),
                };
                let stop = next.is_err();
                if tx.send(next).await.is_err() || stop {
                    break;
                }
            }
            // The scan filled this connection's page cache (~8 MB at
            // 100,000 machines); nothing reads those pages again soon.
            if let Err(e) = sqlx::query("PRAGMA shrink_memory")
                .execute(&mut *conn)
                .await
            {
                tracing::debug!(error = %e, "store: shrink_memory failed");
            }
        });
        let mut out = Vec::with_capacity(usize::try_from(n).unwrap_or(0));
        while let Some(page) = rx.recv().await {
            machines_of_page(page?.try_get::<&str, _>(1)?, &mut out)?;
        }
        // The reader has ended (its channel closed); a panic in it is a bug.
        if let Err(e) = reader.await {
            return Err(StoreError::Io(std::io::Error::other(e)));
        }
        Ok(out)
    }

    // Write transactions start with BEGIN IMMEDIATE: a deferred transaction
    // that reads first cannot upgrade to a writer while another connection
    // writes (SQLITE_BUSY without waiting for busy_timeout).

    /// Create or update every item in one transaction: all or nothing.
    /// A MAC or IP owned by another Hardware refuses the whole batch.
    pub async fn apply(&self, items: &[Hardware]) -> Result<Vec<Outcome>, StoreError> {
        self.apply_expecting(items, &[]).await
    }

    /// [`Store::apply`], where item `i` is written only if its stored
    /// generation is still `expect[i]` (`Some(0)`: it must not exist yet);
    /// else the batch is refused with [`StoreError::Stale`]. The optimistic
    /// check of a read-modify-write.
    pub async fn apply_expecting(
        &self,
        items: &[Hardware],
        expect: &[Option<i64>],
    ) -> Result<Vec<Outcome>, StoreError> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let now = now_ms();
        let mut outcomes = Vec::with_capacity(items.len());
        for (i, hw) in items.iter().enumerate() {
            let m = &hw.machine;
            let existing: Option<(i64, String, i64)> = sqlx::query_as(
                "SELECT id, doc, generation FROM hardware WHERE namespace = ? AND name = ?",
            )
            .bind(&m.key.namespace)
            .bind(&m.key.name)
            .fetch_optional(&mut *tx)
            .await?;
            if let Some(Some(want)) = expect.get(i) {
                let found = existing.as_ref().map_or(0, |e| e.2);
                if found != *want {
                    return Err(StoreError::Stale {
                        key: m.key.clone(),
                        expected: *want,
                        found,
                    });
                }
            }
            let self_id = existing.as_ref().map(|e| e.0).unwrap_or(-1);
            if let Err(e) = check_keys_free(&mut tx, m, self_id).await? {
                return Err(if items.len() > 1 { e.within(i) } else { e });
            }
            let old = existing.as_ref().map(|e| e.1.as_str());
            outcomes.push(write_hardware(&mut tx, hw, old, now, Keys::Own).await?);
        }
        tx.commit().await?;
        Ok(outcomes)
    }

    /// The Kubernetes mirror's write: the cluster is the truth, so a MAC or
    /// IP another Hardware claims is stored anyway (the inventory answers
    /// neither) and only the first owner is indexed. `replace`: `items` is
    /// the whole set (a list's `InitDone`), and every other Hardware is
    /// deleted in the same transaction. Returns each item's outcome and the
    /// keys deleted.
    pub async fn mirror_hardware(
        &self,
        items: &[Hardware],
        replace: bool,
    ) -> Result<(Vec<Outcome>, Vec<Key>), StoreError> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let now = now_ms();
        let mut deleted = vec![];
        if replace {
            let keep: std::collections::HashSet<(&str, &str)> = items
                .iter()
                .map(|h| {
                    (
                        h.machine.key.namespace.as_str(),
                        h.machine.key.name.as_str(),
                    )
                })
                .collect();
            let all: Vec<(String, String)> = sqlx::query_as("SELECT namespace, name FROM hardware")
                .fetch_all(&mut *tx)
                .await?;
            for (ns, name) in all {
                if !keep.contains(&(ns.as_str(), name.as_str())) {
                    sqlx::query("DELETE FROM hardware WHERE namespace = ? AND name = ?")
                        .bind(&ns)
                        .bind(&name)
                        .execute(&mut *tx)
                        .await?;
                    deleted.push(Key::new(ns, name));
                }
            }
        }
        let mut outcomes = Vec::with_capacity(items.len());
        for hw in items {
            let m = &hw.machine;
            let old: Option<String> =
                sqlx::query_scalar("SELECT doc FROM hardware WHERE namespace = ? AND name = ?")
                    .bind(&m.key.namespace)
                    .bind(&m.key.name)
                    .fetch_optional(&mut *tx)
                    .await?;
            outcomes.push(write_hardware(&mut tx, hw, old.as_deref(), now, Keys::Shared).await?);
        }
        tx.commit().await?;
        Ok((outcomes, deleted))
    }

    /// How many Hardware carry upstream's discovered label (the bound on
    /// what discovery may make).
    pub async fn count_discovered(&self) -> Result<usize, StoreError> {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM hardware WHERE json_extract(doc, '$.metadata.labels.\"tinkerbell.org/auto-discovered\"') = 'true'",
        )
        .fetch_one(self.pool())
        .await?;
        Ok(usize::try_from(n).unwrap_or(0))
    }

    pub async fn get(&self, key: &Key) -> Result<Option<Value>, StoreError> {
        Ok(self.get_versioned(key).await?.map(|(doc, _)| doc))
    }

    /// The document and its generation (1 when created, one more for each
    /// change), for a read-modify-write ([`Store::apply_expecting`]).
    pub async fn get_versioned(&self, key: &Key) -> Result<Option<(Value, i64)>, StoreError> {
        let row: Option<(String, i64)> =
            sqlx::query_as("SELECT doc, generation FROM hardware WHERE namespace = ? AND name = ?")
                .bind(&key.namespace)
                .bind(&key.name)
                .fetch_optional(&self.pool)
                .await?;
        row.map(|(d, g)| {
            serde_json::from_str(&d)
                .map(|v| (v, g))
                .map_err(|e| StoreError::Corrupt(key.clone(), e.to_string()))
        })
        .transpose()
    }

    /// Documents in one namespace, or all, ordered by namespace and name.
    pub async fn list(&self, namespace: Option<&str>) -> Result<Vec<Value>, StoreError> {
        let rows: Vec<(String, String, String)> = sqlx::query_as(
            "SELECT namespace, name, doc FROM hardware WHERE ?1 IS NULL OR namespace = ?1 ORDER BY namespace, name",
        )
        .bind(namespace)
        .fetch_all(&self.pool)
        .await?;
        parsed(rows)
    }

    /// The Hardware with label `label` or annotation `annotation` (cleaning
    /// on release: claimed, or with a cleaning phase), matched in SQLite so
    /// that a pass over a large inventory parses only these.
    pub async fn list_labelled(
        &self,
        label: &str,
        annotation: &str,
    ) -> Result<Vec<Value>, StoreError> {
        let path = |section: &str, name: &str| format!("$.metadata.{section}.\"{name}\"");
        let rows: Vec<(String, String, String)> = sqlx::query_as(
            "SELECT namespace, name, doc FROM hardware \
             WHERE json_extract(doc, ?1) IS NOT NULL OR json_extract(doc, ?2) IS NOT NULL \
             ORDER BY namespace, name",
        )
        .bind(path("labels", label))
        .bind(path("annotations", annotation))
        .fetch_all(&self.pool)
        .await?;
        parsed(rows)
    }

    /// True when something was deleted.
    pub async fn delete(&self, key: &Key) -> Result<bool, StoreError> {
        let r = sqlx::query("DELETE FROM hardware WHERE namespace = ? AND name = ?")
            .bind(&key.namespace)
            .bind(&key.name)
            .execute(&self.pool)
            .await?;
        Ok(r.rows_affected() > 0)
    }

    /// `PRAGMA integrity_check`: "ok" when the file is sound.
    pub async fn integrity_check(&self) -> Result<String, StoreError> {
        let r: (String,) = sqlx::query_as("PRAGMA integrity_check")
            .fetch_one(&self.pool)
            .await?;
        Ok(r.0)
    }

    /// A cheap round trip, for the systemd watchdog and /healthz.
    pub async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    pub(crate) fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }
}

/// Whether the machine's MACs and IPs are free, or held by itself
/// (`self_id`): the conflict names the field and the owner.
async fn check_keys_free(
    tx: &mut sqlx::SqliteConnection,
    m: &Machine,
    self_id: i64,
) -> Result<Result<(), StoreError>, StoreError> {
    for (i, mac) in m
        .interfaces
        .iter()
        .enumerate()
        .filter_map(|(i, f)| Some((i, f.mac?)))
    {
        if let Some(owner) = owner_of(tx, Index::Mac, &mac.to_string(), self_id).await? {
            return Ok(Err(StoreError::Conflict {
                field: format!("spec.interfaces[{i}].dhcp.mac"),
                message: format!("MAC {mac} already belongs to Hardware {owner}"),
                owner,
            }));
        }
    }
    for ip in m.ips() {
        if let Some(owner) = owner_of(tx, Index::Ip, &ip.to_string(), self_id).await? {
            let i = m
                .interfaces
                .iter()
                .position(|f| f.address == Some(ip))
                .unwrap_or(0);
            return Ok(Err(StoreError::Conflict {
                field: format!("spec.interfaces[{i}].dhcp.ip.address"),
                message: format!("IP {ip} already belongs to Hardware {owner}"),
                owner,
            }));
        }
    }
    Ok(Ok(()))
}

/// The MAC and IP rows of Hardware `id`, replaced by the machine's.
/// Who may hold a MAC or IP in `hardware_mac`/`hardware_ip`.
#[derive(Clone, Copy)]
enum Keys {
    /// Checked free first (`check_keys_free`): the row is this Hardware's.
    Own,
    /// The mirror: a key another Hardware already holds stays with it.
    Shared,
}

/// Write `hw` unless its stored document (`old`) is the same, and index its
/// keys.
async fn write_hardware(
    tx: &mut sqlx::SqliteConnection,
    hw: &Hardware,
    old: Option<&str>,
    now: i64,
    index: Keys,
) -> Result<Outcome, StoreError> {
    let m = &hw.machine;
    let outcome = match old {
        Some(o) if serde_json::from_str::<Value>(o).ok().as_ref() == Some(&hw.doc) => {
            return Ok(Outcome::Unchanged);
        }
        Some(_) => Outcome::Configured,
        None => Outcome::Created,
    };
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO hardware (namespace, name, doc, created_ms, updated_ms) VALUES (?, ?, ?, ?, ?)
         ON CONFLICT (namespace, name) DO UPDATE
         SET doc = excluded.doc, updated_ms = excluded.updated_ms, generation = generation + 1
         RETURNING id",
    )
    .bind(&m.key.namespace)
    .bind(&m.key.name)
    .bind(hw.doc.to_string())
    .bind(now)
    .bind(now)
    .fetch_one(&mut *tx)
    .await?;
    for table in [
        "DELETE FROM hardware_mac WHERE hardware_id = ?",
        "DELETE FROM hardware_ip WHERE hardware_id = ?",
    ] {
        sqlx::query(table).bind(id).execute(&mut *tx).await?;
    }
    let (mac_sql, ip_sql) = match index {
        Keys::Own => (
            "INSERT INTO hardware_mac (mac, hardware_id) VALUES (?, ?)",
            "INSERT INTO hardware_ip (ip, hardware_id) VALUES (?, ?)",
        ),
        Keys::Shared => (
            "INSERT OR IGNORE INTO hardware_mac (mac, hardware_id) VALUES (?, ?)",
            "INSERT OR IGNORE INTO hardware_ip (ip, hardware_id) VALUES (?, ?)",
        ),
    };
    for mac in m.macs() {
        sqlx::query(mac_sql)
            .bind(mac.to_string())
            .bind(id)
            .execute(&mut *tx)
            .await?;
    }
    for ip in m.ips() {
        sqlx::query(ip_sql)
            .bind(ip.to_string())
            .bind(id)
            .execute(&mut *tx)
            .await?;
    }
    Ok(outcome)
}

/// The machines of one page from [`Store::load_machines`]: items separated
/// by RS, each `namespace US name US doc`. A document that no longer gives
/// a view (a database edited by hand, a schema made stricter since) is
/// loaded as a machine with no interfaces, and the log says why: one bad
/// row must not stop the whole appliance.
fn machines_of_page(page: &str, out: &mut Vec<Machine>) -> Result<(), StoreError> {
    for item in page.split('\x1e') {
        let mut parts = item.splitn(3, '\x1f');
        let (Some(ns), Some(name), Some(doc)) = (parts.next(), parts.next(), parts.next()) else {
            let key = Key::new("?", item.chars().take(64).collect::<String>());
            return Err(StoreError::Corrupt(key, "unreadable row".into()));
        };
        let key = Key::new(ns, name);
        match Machine::from_doc(key.clone(), doc) {
            Ok(m) => out.push(m),
            // Not even JSON: the row is damaged, not merely outdated.
            Err(e) if serde_json::from_str::<serde::de::IgnoredAny>(doc).is_err() => {
                return Err(StoreError::Corrupt(key, e.to_string()));
            }
            Err(e) => {
                tracing::error!(hardware = %key, error = %e, "stored Hardware has no usable view; it boots nothing");
                out.push(Machine::empty(key));
            }
        }
    }
    Ok(())
}

#[derive(Clone, Copy)]
enum Index {
    Mac,
    Ip,
}

/// Which other Hardware (not `self_id`) holds this MAC or IP.
async fn owner_of(
    tx: &mut sqlx::SqliteConnection,
    index: Index,
    value: &str,
    self_id: i64,
) -> Result<Option<Key>, StoreError> {
    let sql = match index {
        Index::Mac => {
            "SELECT h.namespace, h.name FROM hardware_mac t JOIN hardware h ON h.id = t.hardware_id
             WHERE t.mac = ? AND h.id != ?"
        }
        Index::Ip => {
            "SELECT h.namespace, h.name FROM hardware_ip t JOIN hardware h ON h.id = t.hardware_id
             WHERE t.ip = ? AND h.id != ?"
        }
    };
    let row: Option<(String, String)> = sqlx::query_as(sql)
        .bind(value)
        .bind(self_id)
        .fetch_optional(&mut *tx)
        .await?;
    Ok(row.map(|(ns, n)| Key::new(ns, n)))
}

/// Stored (namespace, name, document) rows, parsed.
fn parsed(rows: Vec<(String, String, String)>) -> Result<Vec<Value>, StoreError> {
    rows.into_iter()
        .map(|(ns, n, d)| {
            serde_json::from_str(&d)
                .map_err(|e| StoreError::Corrupt(Key::new(ns, n), e.to_string()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware;
    use serde_json::json;

    fn hw(i: usize) -> Hardware {
        hardware::validate(json!({
            "apiVersion": hardware::API_VERSION, "kind": "Hardware",
            "metadata": {"name": format!("m{i}"), "namespace": if i.is_multiple_of(2) { "default" } else { "lab" }},
            "spec": {"interfaces": [{"dhcp": {"mac": format!("02:00:00:00:{:02x}:{:02x}", i >> 8, i & 255),
                "ip": {"address": format!("10.0.{}.{}", i >> 8, i & 255)}}}],
                "userData": format!("#cloud-config\n# \u{1e}{i}\u{1f} \"x\"\n")}
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn machines_load_back_across_pages() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("t.db")).await.unwrap();
        assert!(store.load_machines().await.unwrap().is_empty());
        let items: Vec<Hardware> = (0..2100).map(hw).collect();
        store.apply(&items).await.unwrap();
        let loaded = store.load_machines().await.unwrap();
        assert_eq!(loaded.len(), items.len());
        for (m, h) in loaded.iter().zip(&items) {
            assert_eq!(m, &h.machine);
        }
    }

    /// A read-modify-write that lost a race is refused, not applied over
    /// the newer document.
    #[tokio::test]
    async fn stale_generations_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("t.db")).await.unwrap();
        let k = hw(1).machine.key.clone();
        assert_eq!(store.get_versioned(&k).await.unwrap(), None);
        store.apply_expecting(&[hw(1)], &[Some(0)]).await.unwrap();
        let (_, g1) = store.get_versioned(&k).await.unwrap().unwrap();
        assert_eq!(g1, 1);
        let mut changed = hw(1);
        changed.doc["spec"]["userData"] = "changed".into();
        let changed = hardware::validate(changed.doc).unwrap();
        store.apply(std::slice::from_ref(&changed)).await.unwrap();
        let (_, g2) = store.get_versioned(&k).await.unwrap().unwrap();
        assert_eq!(g2, 2, "a change is a new generation");
        store.apply(std::slice::from_ref(&changed)).await.unwrap();
        assert_eq!(
            store.get_versioned(&k).await.unwrap().unwrap().1,
            2,
            "no change, same generation"
        );
        match store.apply_expecting(&[hw(1)], &[Some(g1)]).await {
            Err(StoreError::Stale {
                expected: 1,
                found: 2,
                ..
            }) => {}
            other => panic!("{other:?}"),
        }
        assert_eq!(
            store.get(&k).await.unwrap().unwrap()["spec"]["userData"],
            "changed"
        );
        match store.apply_expecting(&[hw(2)], &[Some(1)]).await {
            Err(StoreError::Stale {
                expected: 1,
                found: 0,
                ..
            }) => {}
            other => panic!("{other:?}"),
        }
    }

    /// A database from a development build before the migrations were
    /// squashed is refused with what to do.
    #[tokio::test]
    async fn an_outdated_development_database_is_refused_with_advice() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let store = Store::open(&path).await.unwrap();
        sqlx::query("INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) VALUES (20261123000005, 'events to own file', 1, x'00', 0)")
            .execute(store.pool())
            .await
            .unwrap();
        store.close().await;
        match Store::open(&path).await {
            Err(StoreError::Outdated(m)) => assert!(m.contains("older development build"), "{m}"),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("opened"),
        }
        // A database whose one migration was since edited (the schema grew).
        let path = dir.path().join("u.db");
        let store = Store::open(&path).await.unwrap();
        sqlx::query("UPDATE _sqlx_migrations SET checksum = x'00'")
            .execute(store.pool())
            .await
            .unwrap();
        store.close().await;
        match Store::open(&path).await {
            Err(StoreError::Outdated(m)) => assert!(m.contains("is not this build's"), "{m}"),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("opened"),
        }
    }

    #[tokio::test]
    async fn a_corrupt_document_names_its_hardware() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("t.db")).await.unwrap();
        store.apply(&[hw(1)]).await.unwrap();
        sqlx::query("INSERT INTO hardware (namespace, name, doc, created_ms, updated_ms) VALUES ('default', 'bad', '{\"spec\": 5', 0, 0)")
            .execute(store.pool())
            .await
            .unwrap();
        match store.load_machines().await {
            Err(StoreError::Corrupt(k, _)) => assert_eq!(k, Key::new("default", "bad")),
            other => panic!("{other:?}"),
        }
        // A document that parses but no longer gives a view (a schema made
        // stricter since it was stored) loads as a machine with nothing to
        // boot: one bad row does not stop the appliance.
        sqlx::query("UPDATE hardware SET doc = '{\"spec\": {\"interfaces\": [{\"dhcp\": {\"mac\": \"nope\"}}]}}' WHERE name = 'bad'")
            .execute(store.pool())
            .await
            .unwrap();
        let loaded = store.load_machines().await.unwrap();
        let bad = loaded.iter().find(|m| m.key.name == "bad").unwrap();
        assert!(bad.interfaces.is_empty());
        assert_eq!(loaded.len(), 2);
    }
}
