//! The event log's database: `events.db` beside the store's file, with its
//! own migrations (`migrations/events/`). Its one writing connection is
//! called on the event writer's thread, at the lowest CPU priority
//! ([`crate::priority`]); readers have their own connections at normal
//! priority, and a WAL reader never waits for the writer. Apart from the
//! store, its transactions never hold the write lock an API change waits
//! for, and it may lose its last commits to a power cut (`synchronous =
//! NORMAL`, still consistent), never the store's.

use super::Event;
use crate::clock::now_ms;
use crate::hardware::Key;
use serde::Serialize;
use serde_json::Value;
use sqlx::Row;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use std::path::Path;
use std::time::{Duration, UNIX_EPOCH};

/// The file name, in the state directory.
pub const FILE: &str = "events.db";

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/events");

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("event log: {0}")]
    Db(#[from] sqlx::Error),
    #[error("event log migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("event log: {0}")]
    Io(#[from] std::io::Error),
    #[error("event log: {0}")]
    Write(#[from] rusqlite::Error),
}

/// The buckets of 8192 ids the per-machine event index leads with
/// (see the migration), newest first, down to the bucket of `max(min(id), ?3)`:
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

/// A machine's `namespace` and `name` columns (both NULL for none).
fn key_columns(k: Option<&Key>) -> (Option<&str>, Option<&str>) {
    match k {
        Some(k) => (Some(k.namespace.as_str()), Some(k.name.as_str())),
        None => (None, None),
    }
}

fn rfc3339(ts_ms: i64) -> String {
    let time = UNIX_EPOCH + Duration::from_millis(ts_ms.max(0) as u64);
    humantime::format_rfc3339_millis(time).to_string()
}

impl EventRow {
    /// `e` as it reads back once stored as row `id`.
    pub fn stored(id: i64, e: &Event) -> EventRow {
        let (namespace, name) = match &e.machine {
            Some(k) => (Some(k.namespace.clone()), Some(k.name.clone())),
            None => (None, None),
        };
        EventRow {
            id,
            time: rfc3339(e.ts_ms),
            namespace,
            name,
            mac: e.mac.map(|m| m.to_string()),
            ip: e.ip.map(|i| i.to_string()),
            kind: e.kind.as_str().to_string(),
            message: e.message.clone(),
            fields: e
                .fields
                .as_deref()
                .and_then(|f| serde_json::from_str(f).ok()),
        }
    }
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

/// The event log's connections.
///
/// Writes go through rusqlite, on the caller's thread (the event writer's,
/// at the lowest CPU priority), not through sqlx: sqlx runs each statement
/// on a SQLite thread of its own, reached through a channel, and copies
/// every bound value into an owned argument first. For a log that takes a
/// row per DORA that was most of its cost: at 6,000 DORA/s the sqlx
/// thread and the writer spent ~7 us of CPU per row (profile, BENCHMARKS.md
/// "CPU per DORA at fixed rates"), SQLite's own insert ~2. Reads, and the
/// migrations, stay on sqlx like the rest of the store.
#[derive(Clone)]
pub struct EventLog {
    /// The one writing connection; its statements run on the thread that
    /// calls [`EventLog::insert`], [`EventLog::trim_all`], [`EventLog::expire`].
    write: std::sync::Arc<std::sync::Mutex<rusqlite::Connection>>,
    /// Readers, at normal priority: a WAL reader never waits for the
    /// writer, which on a busy host may be starved.
    read: SqlitePool,
}

impl EventLog {
    /// Open (creating if needed) and migrate the log at `path`.
    pub async fn open(path: &Path) -> Result<EventLog, Error> {
        let opts = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(5))
            .pragma("wal_autocheckpoint", WAL_AUTOCHECKPOINT.to_string());
        let read = SqlitePoolOptions::new()
            .max_connections(2)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(opts)
            .await?;
        crate::store::migrate(&MIGRATOR, &read, path)
            .await
            .map_err(|e| match e {
                crate::store::MigrateFailed::Db(e) => Error::Db(e),
                crate::store::MigrateFailed::Migrate(e) => Error::Migrate(e),
                crate::store::MigrateFailed::Outdated(m) => Error::Io(std::io::Error::other(m)),
            })?;
        let write = rusqlite::Connection::open(path)?;
        write.busy_timeout(Duration::from_secs(5))?;
        write.execute_batch(&format!(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;
             PRAGMA wal_autocheckpoint = {WAL_AUTOCHECKPOINT};
             PRAGMA cache_size = -{EVENTS_CACHE_KIB}; PRAGMA temp_store = MEMORY;"
        ))?;
        // The log names machines and addresses: owner only, whatever the umask.
        crate::store::owner_only(path)?;
        Ok(EventLog {
            write: std::sync::Arc::new(std::sync::Mutex::new(write)),
            read,
        })
    }

    pub async fn close(&self) {
        self.read.close().await;
    }

    /// The writing connection (a panic elsewhere while it was held leaves
    /// it usable: every write is one transaction, rolled back if unfinished).
    fn writer(&self) -> std::sync::MutexGuard<'_, rusqlite::Connection> {
        self.write.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Append a batch of events in one transaction, then trim the given
    /// machines (`None`: the events that name none) to their `per_machine`
    /// newest rows. Which machines need trimming is the caller's choice
    /// (see [`crate::events::writer`]). Returns the last row's id: the
    /// one writer appends, so the batch has the ids just before it.
    pub fn insert(
        &self,
        batch: &[Event],
        trim: &[Option<Key>],
        per_machine: u32,
    ) -> Result<i64, Error> {
        let mut db = self.writer();
        let tx = db.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        {
            let mut add = tx.prepare_cached(
                "INSERT INTO events (ts_ms, namespace, name, mac, ip, kind, message, fields)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )?;
            for e in batch {
                let (ns, name) = key_columns(e.machine.as_ref());
                add.execute(rusqlite::params![
                    e.ts_ms,
                    ns,
                    name,
                    e.mac.map(|m| m.to_string()),
                    e.ip.map(crate::text::ip),
                    e.kind.as_str(),
                    e.message.as_str(),
                    e.fields.as_deref(),
                ])?;
            }
            let mut trim_one = tx.prepare_cached(TRIM_MACHINE)?;
            for k in trim {
                let (ns, name) = key_columns(k.as_ref());
                trim_one.execute(rusqlite::params![ns, name, 0i64, per_machine as i64])?;
            }
        }
        // The one writer appends: the batch has the ids just before this.
        let last = if batch.is_empty() {
            tx.query_row("SELECT coalesce(max(id), 0) FROM events", [], |r| r.get(0))?
        } else {
            tx.last_insert_rowid()
        };
        tx.commit()?;
        Ok(last)
    }

    /// Trim every machine's events (and those naming none) to the
    /// `per_machine` newest; returns how many went. One pass over the table,
    /// for start-up.
    pub fn trim_all(&self, per_machine: u32) -> Result<u64, Error> {
        let n = self.writer().execute(
            "DELETE FROM events WHERE id IN (
               SELECT id FROM (
                 SELECT id, row_number() OVER (
                   PARTITION BY namespace, name ORDER BY id DESC) AS n
                 FROM events)
               WHERE n > ?1)",
            [per_machine as i64],
        )?;
        Ok(n as u64)
    }

    /// Delete events older than `max_age`; returns how many went.
    ///
    /// Events are inserted in the order they were made, so ids follow
    /// time: everything before the first event at or after the cutoff goes,
    /// found by walking the primary key from its start (through the rows
    /// being deleted anyway). No index on `ts_ms` is needed, which would
    /// cost every insert a third B-tree write. After a clock step back a
    /// few events may stay a little longer than `max_age`.
    pub fn expire(&self, max_age: Duration) -> Result<u64, Error> {
        let cutoff = now_ms() - max_age.as_millis() as i64;
        let n = self.writer().execute(
            "DELETE FROM events WHERE id < COALESCE(
                (SELECT id FROM events WHERE ts_ms >= ?1 ORDER BY id LIMIT 1),
                (SELECT max(id) + 1 FROM events))",
            [cutoff],
        )?;
        Ok(n as u64)
    }

    /// The newest `limit` events matching, oldest first.
    pub async fn query(&self, q: &EventQuery) -> Result<Vec<EventRow>, Error> {
        let (ns, name) = key_columns(q.machine.as_ref());
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
            .fetch_all(&self.read)
            .await?;
        let mut out: Vec<EventRow> = rows
            .into_iter()
            .map(|r| EventRow {
                id: r.get(0),
                time: rfc3339(r.get(1)),
                namespace: r.get(2),
                name: r.get(3),
                mac: r.get(4),
                ip: r.get(5),
                kind: r.get(6),
                message: r.get(7),
                fields: r
                    .get::<Option<String>, _>(8)
                    .and_then(|f| serde_json::from_str(&f).ok()),
            })
            .collect();
        out.reverse();
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::Kind;

    async fn open(dir: &tempfile::TempDir) -> EventLog {
        EventLog::open(&dir.path().join(FILE)).await.unwrap()
    }

    #[tokio::test]
    async fn connections_have_the_long_wal_and_the_writer_its_cache() {
        let dir = tempfile::tempdir().unwrap();
        let log = open(&dir).await;
        let read = |pragma: &'static str| {
            let pool = log.read.clone();
            async move {
                sqlx::query_scalar::<_, i64>(pragma)
                    .fetch_one(&pool)
                    .await
                    .unwrap()
            }
        };
        let write =
            |pragma: &str| -> i64 { log.writer().query_row(pragma, [], |r| r.get(0)).unwrap() };
        // synchronous NORMAL (1): the log may lose its last commits to a
        // power cut.
        for (pragma, want) in [
            ("PRAGMA wal_autocheckpoint", WAL_AUTOCHECKPOINT as i64),
            ("PRAGMA synchronous", 1),
        ] {
            assert_eq!(read(pragma).await, want, "{pragma}");
            assert_eq!(write(pragma), want, "{pragma}");
        }
        let journal: String = log
            .writer()
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        assert_eq!(journal, "wal");
        assert_eq!(write("PRAGMA busy_timeout"), 5000);
        assert_eq!(write("PRAGMA cache_size"), -(EVENTS_CACHE_KIB as i64));
        assert_eq!(write("PRAGMA temp_store"), 2);
        assert_ne!(read("PRAGMA cache_size").await, -(EVENTS_CACHE_KIB as i64));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join(FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "{mode:o}");
        log.close().await;
    }

    /// A write that fails (here: the table is gone) is an error for the
    /// caller, and leaves the connection usable (the transaction rolled
    /// back), so the writer's next batch goes in.
    #[tokio::test]
    async fn a_failed_write_rolls_back_and_the_next_goes_in() {
        let dir = tempfile::tempdir().unwrap();
        let log = open(&dir).await;
        log.writer()
            .execute_batch("ALTER TABLE events RENAME TO moved")
            .unwrap();
        let err = log
            .insert(&[Event::new(Kind::Test, "lost")], &[], 10)
            .unwrap_err();
        assert!(err.to_string().contains("no such table"), "{err}");
        log.writer()
            .execute_batch("ALTER TABLE moved RENAME TO events")
            .unwrap();
        let last = log
            .insert(&[Event::new(Kind::Test, "kept")], &[], 10)
            .unwrap();
        let rows = log
            .query(&EventQuery {
                limit: 10,
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!((rows[0].id, rows[0].message.as_str()), (last, "kept"));
        log.close().await;
    }

    #[tokio::test]
    async fn old_events_expire_by_id_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir).await;
        let now = now_ms();
        let ev = |age_s: i64, i: usize| Event {
            ts_ms: now - age_s * 1000,
            ..Event::new(Kind::Test, format!("e{i}"))
        };
        // Nothing to expire in an empty log.
        assert_eq!(store.expire(Duration::from_secs(60)).unwrap(), 0);
        let old: Vec<Event> = (0..5).map(|i| ev(3600, i)).collect();
        store.insert(&old, &[], 1000).unwrap();
        // All old: all go.
        assert_eq!(store.expire(Duration::from_secs(60)).unwrap(), 5);
        let mixed: Vec<Event> = (0..10)
            .map(|i| ev(if i < 4 { 3600 } else { 5 }, i))
            .collect();
        store.insert(&mixed, &[], 1000).unwrap();
        assert_eq!(store.expire(Duration::from_secs(60)).unwrap(), 4);
        let left = store
            .query(&EventQuery {
                machine: None,
                after: None,
                limit: 100,
            })
            .await
            .unwrap();
        let msgs: Vec<&str> = left.iter().map(|e| e.message.as_str()).collect();
        assert_eq!(msgs, ["e4", "e5", "e6", "e7", "e8", "e9"]);
        // Nothing is old any more.
        assert_eq!(store.expire(Duration::from_secs(60)).unwrap(), 0);
    }

    #[tokio::test]
    async fn machine_events_span_buckets_and_trim_across_them() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir).await;
        let a = Key::new("default", "a");
        // 20000 events: ids 1..=20000 fill buckets 0, 1 and 2 (8192 each);
        // machine a has every 1000th, the rest name b or none.
        let batch: Vec<Event> = (1..=20_000)
            .map(|i| {
                let e = Event::new(Kind::Test, format!("e{i}"));
                match i % 1000 {
                    0 => e.machine(a.clone()),
                    1 => e,
                    _ => e.machine(Key::new("default", "b")),
                }
            })
            .collect();
        store.insert(&batch, &[], 1000).unwrap();
        let read = |after: Option<i64>, limit: u32| {
            let store = store.clone();
            let a = a.clone();
            async move {
                let q = EventQuery {
                    machine: Some(a),
                    after,
                    limit,
                };
                let rows = store.query(&q).await.unwrap();
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
        store.insert(&[], &[Some(a.clone()), None], 4).unwrap();
        assert_eq!(read(None, 100).await, [17_000, 18_000, 19_000, 20_000]);
        let total: i64 = sqlx::query_scalar("SELECT count(*) FROM events")
            .fetch_one(&store.read)
            .await
            .unwrap();
        assert_eq!(total, 20_000 - 16 - 16);
    }

    #[tokio::test]
    async fn events_use_the_bucketed_index() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir).await;
        for sql in [MACHINE_EVENTS, TRIM_MACHINE] {
            let plan: Vec<String> =
                sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN QUERY PLAN {sql}")))
                    .bind("default")
                    .bind("a")
                    .bind(0i64)
                    .bind(10i64)
                    .fetch_all(&store.read)
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
}
