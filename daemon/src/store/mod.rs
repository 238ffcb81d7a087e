//! The store: SQLite through sqlx, the source of truth. Every write is one
//! transaction with `synchronous = FULL`, so a write that returned success
//! survives kill -9 and power loss. Nothing on a packet path reads from here;
//! the [`crate::inventory`] is rebuilt from it.

use crate::events::Event;
use crate::hardware::{Hardware, Key, Record};
use serde::Serialize;
use serde_json::Value;
use sqlx::Row;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub mod bmc;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");
static EVENTS_MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/events");

/// The event log's database, beside the store's: its writer runs at the
/// lowest CPU priority ([`lower_this_thread`]), and sharing the store's
/// file it held the write lock an API change waits for.
pub const EVENTS_FILE: &str = "events.db";

/// The buckets of 8192 ids the per-machine event index leads with
/// (migration 4), newest first, down to the bucket of `max(min(id), ?3)`:
/// a machine's events are one index probe per bucket. The `id >> 13` must
/// stay as written: SQLite uses an expression index only for the same
/// expression (`events_use_the_bucketed_index` checks the plans).
macro_rules! event_buckets {
    () => {
        "WITH RECURSIVE b(k) AS (
           SELECT max(id) >> 13 FROM events
           UNION ALL
           SELECT k - 1 FROM b
           WHERE k > (SELECT max(coalesce(min(id), 0), ?3) >> 13 FROM events)) "
    };
}

/// One machine's events (`IS`: the key may be NULL for the events that
/// name none), bucket by bucket; `b` must stay the outer loop.
macro_rules! machine_events {
    ($cols:literal) => {
        concat!(
            event_buckets!(),
            "SELECT ",
            $cols,
            " FROM b CROSS JOIN events e
             ON (e.id >> 13) = b.k AND e.namespace IS ?1 AND e.name IS ?2 AND e.id > ?3
             ORDER BY e.id DESC"
        )
    };
}

const TRIM_MACHINE: &str = concat!(
    "DELETE FROM events WHERE id IN (",
    machine_events!("e.id"),
    " LIMIT -1 OFFSET ?4)"
);

const MACHINE_EVENTS: &str = concat!(
    machine_events!("e.id, e.ts_ms, e.namespace, e.name, e.mac, e.ip, e.kind, e.message, e.fields"),
    " LIMIT ?4"
);

/// Rows per multi-row event INSERT, largest first (8 binds a row).
const EVENT_CHUNKS: [usize; 8] = [128, 64, 32, 16, 8, 4, 2, 1];

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
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("stored document for {0} is corrupt: {1}")]
    Corrupt(Key, String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Created,
    Configured,
    Unchanged,
}

/// A stored event as read back.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct EventRow {
    pub id: i64,
    /// RFC 3339 UTC time.
    pub time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
    pub kind: String,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fields: Option<Value>,
}

#[derive(Debug, Clone, Default)]
pub struct EventQuery {
    pub machine: Option<Key>,
    /// Only events with a larger id (for following).
    pub after: Option<i64>,
    pub limit: u32,
}

#[derive(Clone)]
pub struct Store {
    pool: SqlitePool,
    /// The event log's writing connection, whose SQLite thread runs at the
    /// lowest CPU priority (see [`background_pool`]).
    events: SqlitePool,
    /// Readers of the event log, at normal priority: a WAL reader never
    /// waits for the writer, which on a busy host may be starved.
    events_read: SqlitePool,
}

/// How many steps nicer than the rest the event log's threads run where
/// `SCHED_IDLE` is refused (see [`lower_this_thread`]).
pub(crate) const BACKGROUND_NICE: i32 = 10;

/// Linux's `SCHED_IDLE` policy number, as /proc/PID/stat shows it.
#[cfg(test)]
pub(crate) const SCHED_IDLE: i64 = 5;

/// WAL pages before a commit checkpoints them into the database (SQLite's
/// default is 1000). Each event dirties a page of the per-machine index,
/// and those pages are dirtied again and again: with a longer WAL a page is
/// copied back once per many commits rather than once per few. Measured at
/// 2000 DORA/s with 100k machines and a grown event table: written bytes
/// halved (~20 to ~10 KB per DORA). The WAL file grows to ~40 MB.
const WAL_AUTOCHECKPOINT: u32 = 10_000;

/// The event log connection's page cache, KiB (SQLite's default: 2000):
/// the per-machine index's pages are read back for every batch, and from
/// the OS cache that was a `pread` each (a third of the writer's time in
/// the kernel went away with it). It fills only under event load.
const EVENTS_CACHE_KIB: u32 = 32 * 1024;

/// A pool of one connection whose SQLite thread runs at the lowest CPU
/// priority ([`lower_this_thread`]). sqlx gives no hook into the thread it
/// starts for a connection, but a thread inherits its creator's policy and
/// nice value, so the connection is opened from a short-lived thread that
/// lowered itself first. The pool never drops an idle connection, so the
/// thread lasts; should sqlx ever reopen it after an error, it runs at
/// normal priority.
async fn background_pool(opts: SqliteConnectOptions) -> Result<SqlitePool, StoreError> {
    let rt = tokio::runtime::Handle::current();
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("store-open".into())
        .spawn(move || {
            lower_this_thread();
            let pool = rt.block_on(
                SqlitePoolOptions::new()
                    .max_connections(1)
                    .idle_timeout(None)
                    .max_lifetime(None)
                    .acquire_timeout(Duration::from_secs(10))
                    .connect_with(opts),
            );
            let _ = tx.send(pool);
        })?;
    let pool = rx
        .await
        .map_err(|_| std::io::Error::other("opening the event log's connection failed"))??;
    Ok(pool)
}

/// Puts the calling thread (and the threads it starts from now on) under
/// `SCHED_IDLE`, for the event log's work: it then runs only when nothing
/// else wants the CPU, and a DHCP packet's wake-up preempts it at once.
/// Nice 10 (the fallback, where the policy is refused) still left the DHCP
/// thread waiting in the run queue: pinned to one core at 20000-24000
/// DORA/s with 100k machines, the DHCP thread's run-queue wait was 93-169
/// ms per 2 s step at nice 10 and 23-40 ms under SCHED_IDLE (8-31 with the
/// event log off), and the reply p99 0.51-1.11 ms against 0.23-0.53 ms
/// (BENCHMARKS.md). A starved writer delays only events: the queue drops
/// and counts what does not fit, and the log's own file (`EVENTS_FILE`)
/// keeps its write lock away from the store.
pub(crate) fn lower_this_thread() {
    use thread_priority::{
        NormalThreadSchedulePolicy, ThreadPriority, ThreadSchedulePolicy,
        set_thread_priority_and_policy, thread_native_id,
    };
    let me = rustix::thread::gettid();
    let base = rustix::process::getpriority_process(Some(me)).unwrap_or(0);
    if let Err(e) = set_thread_priority_and_policy(
        thread_native_id(),
        ThreadPriority::Min,
        ThreadSchedulePolicy::Normal(NormalThreadSchedulePolicy::Idle),
    ) {
        tracing::debug!(error = ?e, "SCHED_IDLE refused for a background thread");
    }
    // Also nicer, for where SCHED_IDLE was refused (under it, nice is not
    // used); the call above may have reset it.
    let nice = (base + BACKGROUND_NICE).min(19);
    if let Err(e) = rustix::process::setpriority_process(Some(me), nice) {
        tracing::debug!(error = %e, "cannot lower a background thread's priority");
    }
}

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl Store {
    /// Open (creating if needed) and migrate the database at `path` and
    /// the event log's beside it ([`EVENTS_FILE`]).
    pub async fn open(path: &Path) -> Result<Store, StoreError> {
        let opts = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(5))
            .pragma("wal_autocheckpoint", WAL_AUTOCHECKPOINT.to_string());
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(opts)
            .await?;
        // The event log may lose its last commits to a power cut (WAL with
        // `synchronous = NORMAL` stays consistent), never the store.
        let events_path = path.with_file_name(EVENTS_FILE);
        let ev_opts = SqliteConnectOptions::new()
            .filename(&events_path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(5))
            .pragma("wal_autocheckpoint", WAL_AUTOCHECKPOINT.to_string());
        let events = background_pool(
            ev_opts
                .clone()
                .pragma("cache_size", format!("-{EVENTS_CACHE_KIB}"))
                .pragma("temp_store", "memory"),
        )
        .await?;
        EVENTS_MIGRATOR.run(&events).await?;
        let moved = move_old_events(&pool, &events, path).await?;
        MIGRATOR.run(&pool).await?;
        if moved {
            // The old table's pages are free now: give them back to the
            // file system (~190 MB for 1M events), once.
            let t0 = std::time::Instant::now();
            sqlx::query("VACUUM").execute(&pool).await?;
            tracing::info!(
                ms = t0.elapsed().as_millis() as u64,
                "store compacted after the move"
            );
        }
        let events_read = SqlitePoolOptions::new()
            .max_connections(2)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(ev_opts)
            .await?;
        // BMC credentials live in the store: owner only, whatever the
        // umask; the event log names machines and addresses: the same.
        for db in [path, events_path.as_path()] {
            for suffix in ["", "-wal", "-shm"] {
                let mut p = db.as_os_str().to_owned();
                p.push(suffix);
                if let Ok(meta) = std::fs::metadata(&p) {
                    use std::os::unix::fs::PermissionsExt;
                    if meta.permissions().mode() & 0o077 != 0 {
                        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600))?;
                    }
                }
            }
        }
        Ok(Store {
            pool,
            events,
            events_read,
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
    pub async fn load_records(&self) -> Result<Vec<Record>, StoreError> {
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
            records_of_page(page?.try_get::<&str, _>(1)?, &mut out)?;
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
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let now = now_ms();
        let mut outcomes = Vec::with_capacity(items.len());
        for (i, hw) in items.iter().enumerate() {
            let m = &hw.machine;
            let doc = hw.doc.to_string();
            let existing: Option<(i64, String)> =
                sqlx::query_as("SELECT id, doc FROM hardware WHERE namespace = ? AND name = ?")
                    .bind(&m.key.namespace)
                    .bind(&m.key.name)
                    .fetch_optional(&mut *tx)
                    .await?;
            let self_id = existing.as_ref().map(|e| e.0).unwrap_or(-1);
            let prefix = |f: String| {
                if items.len() > 1 {
                    format!("[{i}].{f}")
                } else {
                    f
                }
            };
            for (j, mac) in m.macs.iter().enumerate() {
                if let Some(owner) =
                    owner_of(&mut tx, Index::Mac, &mac.to_string(), self_id).await?
                {
                    return Err(StoreError::Conflict {
                        field: prefix(mac_field(hw, j)),
                        message: format!("MAC {mac} already belongs to Hardware {owner}"),
                        owner,
                    });
                }
            }
            for ip in &m.ips {
                if let Some(owner) = owner_of(&mut tx, Index::Ip, &ip.to_string(), self_id).await? {
                    return Err(StoreError::Conflict {
                        field: prefix(ip_field(hw, ip)),
                        message: format!("IP {ip} already belongs to Hardware {owner}"),
                        owner,
                    });
                }
            }
            let outcome = match &existing {
                Some((_, old))
                    if serde_json::from_str::<Value>(old).ok().as_ref() == Some(&hw.doc) =>
                {
                    outcomes.push(Outcome::Unchanged);
                    continue;
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
            .bind(&doc)
            .bind(now)
            .bind(now)
            .fetch_one(&mut *tx)
            .await?;
            sqlx::query("DELETE FROM hardware_mac WHERE hardware_id = ?")
                .bind(id)
                .execute(&mut *tx)
                .await?;
            sqlx::query("DELETE FROM hardware_ip WHERE hardware_id = ?")
                .bind(id)
                .execute(&mut *tx)
                .await?;
            for mac in &m.macs {
                sqlx::query("INSERT INTO hardware_mac (mac, hardware_id) VALUES (?, ?)")
                    .bind(mac.to_string())
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
            }
            for ip in &m.ips {
                sqlx::query("INSERT INTO hardware_ip (ip, hardware_id) VALUES (?, ?)")
                    .bind(ip.to_string())
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
            }
            outcomes.push(outcome);
        }
        tx.commit().await?;
        Ok(outcomes)
    }

    pub async fn get(&self, key: &Key) -> Result<Option<Value>, StoreError> {
        let row: Option<(String,)> =
            sqlx::query_as("SELECT doc FROM hardware WHERE namespace = ? AND name = ?")
                .bind(&key.namespace)
                .bind(&key.name)
                .fetch_optional(&self.pool)
                .await?;
        row.map(|(d,)| {
            serde_json::from_str(&d).map_err(|e| StoreError::Corrupt(key.clone(), e.to_string()))
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
        rows.into_iter()
            .map(|(ns, n, d)| {
                serde_json::from_str(&d)
                    .map_err(|e| StoreError::Corrupt(Key::new(ns, n), e.to_string()))
            })
            .collect()
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

    /// Append a batch of events in one transaction, then trim the given
    /// machines (`None`: the events that name none) to their `per_machine`
    /// newest rows. Which machines need trimming is the caller's choice
    /// (see [`crate::events::writer`]).
    pub async fn insert_events(
        &self,
        batch: &[Event],
        trim: &[Option<Key>],
        per_machine: u32,
    ) -> Result<(), StoreError> {
        let mut tx = self.events.begin_with("BEGIN IMMEDIATE").await?;
        // Multi-row INSERTs, in chunks of power-of-two sizes so that a few
        // prepared statements (cached per connection) serve every batch.
        let mut rest = batch;
        while !rest.is_empty() {
            let n = EVENT_CHUNKS
                .iter()
                .copied()
                .find(|&c| c <= rest.len())
                .unwrap_or(1);
            let (chunk, tail) = rest.split_at(n);
            rest = tail;
            let mut q = sqlx::QueryBuilder::new(
                "INSERT INTO events (ts_ms, namespace, name, mac, ip, kind, message, fields) ",
            );
            q.push_values(chunk, |mut b, e| {
                let (ns, name) = match &e.machine {
                    Some(k) => (Some(k.namespace.as_str()), Some(k.name.as_str())),
                    None => (None, None),
                };
                b.push_bind(e.ts_ms)
                    .push_bind(ns)
                    .push_bind(name)
                    .push_bind(e.mac.map(|m| m.to_string()))
                    .push_bind(e.ip.map(|i| i.to_string()))
                    .push_bind(e.kind)
                    .push_bind(e.message.as_str())
                    .push_bind(e.fields.as_deref());
            });
            q.build().persistent(true).execute(&mut *tx).await?;
        }
        for k in trim {
            let (ns, name) = match k {
                Some(k) => (Some(k.namespace.as_str()), Some(k.name.as_str())),
                None => (None, None),
            };
            sqlx::query(TRIM_MACHINE)
                .bind(ns)
                .bind(name)
                .bind(0i64)
                .bind(per_machine as i64)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Trim every machine's events (and those naming none) to the
    /// `per_machine` newest; returns how many went. One pass over the table,
    /// for start-up.
    pub async fn trim_all_events(&self, per_machine: u32) -> Result<u64, StoreError> {
        let r = sqlx::query(
            "DELETE FROM events WHERE id IN (
               SELECT id FROM (
                 SELECT id, row_number() OVER (
                   PARTITION BY namespace, name ORDER BY id DESC) AS n
                 FROM events)
               WHERE n > ?1)",
        )
        .bind(per_machine as i64)
        .execute(&self.events)
        .await?;
        Ok(r.rows_affected())
    }

    /// Delete events older than `max_age`; returns how many went.
    ///
    /// Events are inserted in the order they were made, so ids follow
    /// time: everything before the first event at or after the cutoff goes,
    /// found by walking the primary key from its start (through the rows
    /// being deleted anyway). No index on `ts_ms` is needed, which would
    /// cost every insert a third B-tree write. After a clock step back a
    /// few events may stay a little longer than `max_age`.
    pub async fn expire_events(&self, max_age: Duration) -> Result<u64, StoreError> {
        let cutoff = now_ms() - max_age.as_millis() as i64;
        let r = sqlx::query(
            "DELETE FROM events WHERE id < COALESCE(
                (SELECT id FROM events WHERE ts_ms >= ?1 ORDER BY id LIMIT 1),
                (SELECT max(id) + 1 FROM events))",
        )
        .bind(cutoff)
        .execute(&self.events)
        .await?;
        Ok(r.rows_affected())
    }

    /// The newest `limit` events matching, oldest first.
    pub async fn events(&self, q: &EventQuery) -> Result<Vec<EventRow>, StoreError> {
        let (ns, name) = match &q.machine {
            Some(k) => (Some(k.namespace.as_str()), Some(k.name.as_str())),
            None => (None, None),
        };
        // Two statements: with an `OR` on the machine, SQLite would not use
        // the per-machine index for one machine's events.
        let sql = if q.machine.is_some() {
            MACHINE_EVENTS
        } else {
            "SELECT id, ts_ms, namespace, name, mac, ip, kind, message, fields FROM events
             WHERE ?1 IS NULL AND ?2 IS NULL AND id > ?3
             ORDER BY id DESC LIMIT ?4"
        };
        let rows = sqlx::query(sql)
            .bind(ns)
            .bind(name)
            .bind(q.after.unwrap_or(0))
            .bind(q.limit as i64)
            .fetch_all(&self.events_read)
            .await?;
        let mut out: Vec<EventRow> = rows
            .into_iter()
            .map(|r| {
                let ts: i64 = r.get(1);
                let time = UNIX_EPOCH + Duration::from_millis(ts.max(0) as u64);
                EventRow {
                    id: r.get(0),
                    time: humantime::format_rfc3339_millis(time).to_string(),
                    namespace: r.get(2),
                    name: r.get(3),
                    mac: r.get(4),
                    ip: r.get(5),
                    kind: r.get(6),
                    message: r.get(7),
                    fields: r
                        .get::<Option<String>, _>(8)
                        .and_then(|f| serde_json::from_str(&f).ok()),
                }
            })
            .collect();
        out.reverse();
        Ok(out)
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
        self.events_read.close().await;
        self.events.close().await;
        self.pool.close().await;
    }
}

/// Before migration 5 drops the store's `events` table: its rows go to
/// the event log's own file, once (in one transaction, and only into an
/// empty log: a start that stopped between the copy and the migration
/// copies nothing the second time). True when the store had the table
/// (1M events: ~1 s here, the drop included).
async fn move_old_events(
    store: &SqlitePool,
    events: &SqlitePool,
    store_path: &Path,
) -> Result<bool, StoreError> {
    let old: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'events')",
    )
    .fetch_one(store)
    .await?;
    if !old {
        return Ok(false);
    }
    let mut conn = events.acquire().await?;
    let empty: bool = sqlx::query_scalar("SELECT NOT EXISTS (SELECT 1 FROM events)")
        .fetch_one(&mut *conn)
        .await?;
    if !empty {
        return Ok(true);
    }
    // An error rather than a move skipped: migration 5 would drop them.
    let from = store_path.to_str().ok_or_else(|| {
        std::io::Error::other(format!(
            "{}: the events cannot be moved to {EVENTS_FILE} from a path that is not UTF-8",
            store_path.display()
        ))
    })?;
    sqlx::query("ATTACH DATABASE ?1 AS old")
        .bind(from)
        .execute(&mut *conn)
        .await?;
    let moved = sqlx::query(
        "INSERT INTO events (id, ts_ms, namespace, name, mac, ip, kind, message, fields)
         SELECT id, ts_ms, namespace, name, mac, ip, kind, message, fields
         FROM old.events ORDER BY id",
    )
    .execute(&mut *conn)
    .await;
    // Detach whatever the copy did: the connection lives on in the pool.
    sqlx::query("DETACH DATABASE old")
        .execute(&mut *conn)
        .await?;
    let n = moved?.rows_affected();
    if n > 0 {
        tracing::info!(
            moved = n,
            file = EVENTS_FILE,
            "event log moved to its own file"
        );
    }
    Ok(true)
}

/// The records of one page from [`Store::load_records`]: items separated
/// by RS, each `namespace US name US doc`.
fn records_of_page(page: &str, out: &mut Vec<Record>) -> Result<(), StoreError> {
    for item in page.split('\x1e') {
        let mut parts = item.splitn(3, '\x1f');
        let (Some(ns), Some(name), Some(doc)) = (parts.next(), parts.next(), parts.next()) else {
            let key = Key::new("?", item.chars().take(64).collect::<String>());
            return Err(StoreError::Corrupt(key, "unreadable row".into()));
        };
        let key = Key::new(ns, name);
        match Record::from_stored(key, doc) {
            Ok(r) => out.push(r),
            Err(e) => return Err(StoreError::Corrupt(Key::new(ns, name), e)),
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

/// The path of the j-th indexed MAC in the document.
fn mac_field(hw: &Hardware, j: usize) -> String {
    let mut seen = 0;
    for (i, iface) in hw.machine.spec.interfaces.iter().enumerate() {
        if iface.dhcp.as_ref().and_then(|d| d.mac.as_ref()).is_some() {
            if seen == j {
                return format!("spec.interfaces[{i}].dhcp.mac");
            }
            seen += 1;
        }
    }
    "spec.interfaces".into()
}

fn ip_field(hw: &Hardware, ip: &std::net::IpAddr) -> String {
    for (i, iface) in hw.machine.spec.interfaces.iter().enumerate() {
        let a = iface
            .dhcp
            .as_ref()
            .and_then(|d| d.ip.as_ref())
            .and_then(|p| p.address.as_deref());
        if a.and_then(|a| a.trim().parse::<std::net::IpAddr>().ok()) == Some(*ip) {
            return format!("spec.interfaces[{i}].dhcp.ip.address");
        }
    }
    "spec.interfaces".into()
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
    async fn records_load_back_across_pages() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("t.db")).await.unwrap();
        assert!(store.load_records().await.unwrap().is_empty());
        let items: Vec<Hardware> = (0..2100).map(hw).collect();
        store.apply(&items).await.unwrap();
        let loaded = store.load_records().await.unwrap();
        assert_eq!(loaded.len(), items.len());
        for (r, h) in loaded.iter().zip(&items) {
            assert_eq!(r.machine(), h.machine);
        }
    }

    /// Whether the store's own file still has an `events` table (it went
    /// to [`EVENTS_FILE`] with migration 5).
    async fn store_has_events_table(store: &Store) -> bool {
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE name = 'events')")
            .fetch_one(&store.pool)
            .await
            .unwrap()
    }

    /// (comm, nice, scheduling policy) of this process's threads.
    fn threads() -> Vec<(String, i64, i64)> {
        let mut out = Vec::new();
        for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
            let Ok(stat) = std::fs::read_to_string(t.path().join("stat")) else {
                continue; // gone meanwhile
            };
            let (head, rest) = stat.rsplit_once(')').unwrap();
            let comm = head.split_once('(').unwrap().1.to_string();
            // Fields after the comm start at field 3 (state); nice is 19,
            // policy 41.
            let f: Vec<&str> = rest.split_whitespace().collect();
            out.push((comm, f[16].parse().unwrap(), f[38].parse().unwrap()));
        }
        out
    }

    #[tokio::test]
    async fn connections_have_the_long_wal_and_the_event_log_its_cache() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("t.db")).await.unwrap();
        let q = |pool: &SqlitePool, pragma: &'static str| {
            let pool = pool.clone();
            async move {
                sqlx::query_scalar::<_, i64>(pragma)
                    .fetch_one(&pool)
                    .await
                    .unwrap()
            }
        };
        for pool in [&store.pool, &store.events, &store.events_read] {
            assert_eq!(
                q(pool, "PRAGMA wal_autocheckpoint").await,
                WAL_AUTOCHECKPOINT as i64
            );
        }
        assert_eq!(
            q(&store.events, "PRAGMA cache_size").await,
            -(EVENTS_CACHE_KIB as i64)
        );
        assert_eq!(q(&store.events, "PRAGMA temp_store").await, 2);
        assert_ne!(
            q(&store.pool, "PRAGMA cache_size").await,
            -(EVENTS_CACHE_KIB as i64)
        );
        // FULL (2) for the store, NORMAL (1) for the event log.
        assert_eq!(q(&store.pool, "PRAGMA synchronous").await, 2);
        assert_eq!(q(&store.events, "PRAGMA synchronous").await, 1);
        // Two files: the store has no events table any more.
        let file = |pool: &SqlitePool| {
            let pool = pool.clone();
            async move {
                sqlx::query_scalar::<_, String>(
                    "SELECT file FROM pragma_database_list WHERE name = 'main'",
                )
                .fetch_one(&pool)
                .await
                .unwrap()
            }
        };
        assert!(file(&store.pool).await.ends_with("/t.db"));
        assert!(
            file(&store.events)
                .await
                .ends_with(&format!("/{EVENTS_FILE}"))
        );
        assert!(
            file(&store.events_read)
                .await
                .ends_with(&format!("/{EVENTS_FILE}"))
        );
        assert!(!store_has_events_table(&store).await);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join(EVENTS_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "{mode:o}");
        store.close().await;
    }

    #[tokio::test]
    async fn event_log_sqlite_thread_runs_below_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("t.db")).await.unwrap();
        store
            .insert_events(&[Event::new("t.x", "x")], &[], 10)
            .await
            .unwrap();
        let sqlite: Vec<(i64, i64)> = threads()
            .into_iter()
            .filter(|(c, _, _)| c.starts_with("sqlx-sqlite"))
            .map(|(_, n, p)| (n, p))
            .collect();
        // One event-log writer under SCHED_IDLE and BACKGROUND_NICE below
        // us; the store's and the event readers' at our priority.
        let ours = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
        let ours: i64 = ours
            .rsplit_once(')')
            .unwrap()
            .1
            .split_whitespace()
            .nth(16)
            .unwrap()
            .parse()
            .unwrap();
        let low = (ours + BACKGROUND_NICE as i64).min(19);
        assert_eq!(
            sqlite.iter().filter(|&&t| t == (low, SCHED_IDLE)).count(),
            1,
            "{sqlite:?}"
        );
        assert!(sqlite.contains(&(ours, 0)), "{sqlite:?}");
        store.close().await;
    }

    /// A store from before migration 5 had the events in its own file:
    /// the first open moves them, ids and all, and drops the old table; a
    /// second open moves nothing twice.
    #[tokio::test]
    async fn events_move_to_their_own_file_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        // The store as migrations 1-4 left it, from copies of those files.
        let old = dir.path().join("old-migrations");
        std::fs::create_dir(&old).unwrap();
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../migrations");
        for e in std::fs::read_dir(&src).unwrap().flatten() {
            let name = e.file_name().into_string().unwrap();
            if e.path().is_file() && name.as_str() < "20261123000005" {
                std::fs::copy(e.path(), old.join(&name)).unwrap();
            }
        }
        let opts = SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal);
        let pool = SqlitePool::connect_with(opts).await.unwrap();
        sqlx::migrate::Migrator::new(old.as_path())
            .await
            .unwrap()
            .run(&pool)
            .await
            .unwrap();
        for (id, name) in [(7, Some("a")), (9000, None), (9001, Some("a"))] {
            sqlx::query(
                "INSERT INTO events (id, ts_ms, namespace, name, kind, message)
                 VALUES (?1, 1, ?2, ?3, 'dhcp.ack', 'm' || ?1)",
            )
            .bind(id)
            .bind(name.map(|_| "default"))
            .bind(name)
            .execute(&pool)
            .await
            .unwrap();
        }
        pool.close().await;

        let store = Store::open(&path).await.unwrap();
        let q = |machine| EventQuery {
            machine,
            after: None,
            limit: 10,
        };
        let a = Key {
            namespace: "default".into(),
            name: "a".into(),
        };
        let got: Vec<(i64, String)> = store
            .events(&q(Some(a.clone())))
            .await
            .unwrap()
            .into_iter()
            .map(|e| (e.id, e.message))
            .collect();
        assert_eq!(got, [(7, "m7".to_string()), (9001, "m9001".to_string())]);
        // New events follow the moved ids (AUTOINCREMENT carried over).
        store
            .insert_events(&[Event::new("t.x", "new")], &[], 10)
            .await
            .unwrap();
        let all = store.events(&q(None)).await.unwrap();
        assert_eq!(
            all.iter().map(|e| e.id).collect::<Vec<_>>(),
            [7, 9000, 9001, 9002]
        );
        assert!(!store_has_events_table(&store).await);
        // The dropped table's pages went back (VACUUM after the move).
        let free: i64 = sqlx::query_scalar("PRAGMA freelist_count")
            .fetch_one(&store.pool)
            .await
            .unwrap();
        assert_eq!(free, 0);
        store.close().await;

        // Reopened: nothing to move, nothing lost.
        let store = Store::open(&path).await.unwrap();
        assert_eq!(store.events(&q(None)).await.unwrap().len(), 4);
        assert_eq!(store.events(&q(Some(a))).await.unwrap().len(), 2);
        store.close().await;
    }

    #[tokio::test]
    async fn old_events_expire_by_id_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("t.db")).await.unwrap();
        let now = now_ms();
        let ev = |age_s: i64, i: usize| Event {
            ts_ms: now - age_s * 1000,
            ..Event::new("test.e", format!("e{i}"))
        };
        // Nothing to expire in an empty log.
        assert_eq!(
            store.expire_events(Duration::from_secs(60)).await.unwrap(),
            0
        );
        let old: Vec<Event> = (0..5).map(|i| ev(3600, i)).collect();
        store.insert_events(&old, &[], 1000).await.unwrap();
        // All old: all go.
        assert_eq!(
            store.expire_events(Duration::from_secs(60)).await.unwrap(),
            5
        );
        let mixed: Vec<Event> = (0..10)
            .map(|i| ev(if i < 4 { 3600 } else { 5 }, i))
            .collect();
        store.insert_events(&mixed, &[], 1000).await.unwrap();
        assert_eq!(
            store.expire_events(Duration::from_secs(60)).await.unwrap(),
            4
        );
        let left = store
            .events(&EventQuery {
                machine: None,
                after: None,
                limit: 100,
            })
            .await
            .unwrap();
        let msgs: Vec<&str> = left.iter().map(|e| e.message.as_str()).collect();
        assert_eq!(msgs, ["e4", "e5", "e6", "e7", "e8", "e9"]);
        // Nothing is old any more.
        assert_eq!(
            store.expire_events(Duration::from_secs(60)).await.unwrap(),
            0
        );
    }

    #[tokio::test]
    async fn machine_events_span_buckets_and_trim_across_them() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("t.db")).await.unwrap();
        let a = Key::new("default", "a");
        // 20000 events: ids 1..=20000 fill buckets 0, 1 and 2 (8192 each);
        // machine a has every 1000th, the rest name b or none.
        let batch: Vec<Event> = (1..=20_000)
            .map(|i| {
                let e = Event::new("test.e", format!("e{i}"));
                match i % 1000 {
                    0 => e.machine(a.clone()),
                    1 => e,
                    _ => e.machine(Key::new("default", "b")),
                }
            })
            .collect();
        store.insert_events(&batch, &[], 1000).await.unwrap();
        let read = |after: Option<i64>, limit: u32| {
            let store = store.clone();
            let a = a.clone();
            async move {
                let q = EventQuery {
                    machine: Some(a),
                    after,
                    limit,
                };
                let rows = store.events(&q).await.unwrap();
                rows.into_iter().map(|r| r.id).collect::<Vec<i64>>()
            }
        };
        let all: Vec<i64> = (1..=20).map(|i| i * 1000).collect();
        assert_eq!(read(None, 100).await, all, "every bucket, oldest first");
        assert_eq!(read(None, 3).await, [18_000, 19_000, 20_000], "the newest");
        assert_eq!(
            read(Some(9_000), 100).await,
            all[9..],
            "after, across buckets"
        );
        assert!(read(Some(20_000), 100).await.is_empty());
        // Trim a (and the events naming none) to 4: the oldest go, from
        // every bucket; b keeps all of its.
        store
            .insert_events(&[], &[Some(a.clone()), None], 4)
            .await
            .unwrap();
        assert_eq!(read(None, 100).await, [17_000, 18_000, 19_000, 20_000]);
        let total: i64 = sqlx::query_scalar("SELECT count(*) FROM events")
            .fetch_one(&store.events_read)
            .await
            .unwrap();
        assert_eq!(total, 20_000 - 16 - 16);
    }

    #[tokio::test]
    async fn events_use_the_bucketed_index() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("t.db")).await.unwrap();
        for sql in [MACHINE_EVENTS, TRIM_MACHINE] {
            let plan: Vec<String> =
                sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN QUERY PLAN {sql}")))
                    .bind("default")
                    .bind("a")
                    .bind(0i64)
                    .bind(10i64)
                    .fetch_all(&store.events_read)
                    .await
                    .unwrap()
                    .iter()
                    .map(|r| r.get::<String, _>(3))
                    .collect();
            let plan = plan.join("\n");
            assert!(
                plan.contains("INDEX events_machine (<expr>=? AND namespace=? AND name=?"),
                "{sql}\n{plan}"
            );
            assert!(!plan.contains("SCAN e"), "{plan}");
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
        match store.load_records().await {
            Err(StoreError::Corrupt(k, _)) => assert_eq!(k, Key::new("default", "bad")),
            other => panic!("{other:?}"),
        }
    }
}
