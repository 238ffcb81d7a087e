//! The event log's database: `events.db` beside the store's file, with its
//! own migrations (`migrations/events/`). Its writing connection's SQLite
//! thread runs at the lowest CPU priority ([`crate::priority`]); readers
//! have their own connections at normal priority, and a WAL reader never
//! waits for the writer. Apart from the store, its transactions never hold
//! the write lock an API change waits for, and it may lose its last commits
//! to a power cut (`synchronous = NORMAL`, still consistent), never the
//! store's.

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

/// Rows per multi-row event INSERT, largest first (8 binds a row; SQLite
/// takes 32,766): each statement is a round trip to sqlx's SQLite thread.
const EVENT_CHUNKS: [usize; 10] = [512, 256, 128, 64, 32, 16, 8, 4, 2, 1];

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

/// A pool of one connection whose SQLite thread runs at the lowest CPU
/// priority ([`crate::priority::lower_this_thread`]). sqlx gives no hook into the thread it
/// starts for a connection, but a thread inherits its creator's policy and
/// nice value, so the connection is opened from a short-lived thread that
/// lowered itself first. The pool never drops an idle connection, so the
/// thread lasts; should sqlx ever reopen it after an error, it runs at
/// normal priority.
async fn background_pool(opts: SqliteConnectOptions) -> Result<SqlitePool, Error> {
    let rt = tokio::runtime::Handle::current();
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("store-open".into())
        .spawn(move || {
            crate::priority::lower_this_thread();
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

/// The event log's connections.
#[derive(Clone)]
pub struct EventLog {
    /// The writing connection, whose SQLite thread runs at the lowest CPU
    /// priority (see [`background_pool`]).
    write: SqlitePool,
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
        let write = background_pool(
            opts.clone()
                .pragma("cache_size", format!("-{EVENTS_CACHE_KIB}"))
                .pragma("temp_store", "memory"),
        )
        .await?;
        crate::store::migrate(&MIGRATOR, &write, path)
            .await
            .map_err(|e| match e {
                crate::store::MigrateFailed::Db(e) => Error::Db(e),
                crate::store::MigrateFailed::Migrate(e) => Error::Migrate(e),
                crate::store::MigrateFailed::Outdated(m) => Error::Io(std::io::Error::other(m)),
            })?;
        let read = SqlitePoolOptions::new()
            .max_connections(2)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(opts)
            .await?;
        // The log names machines and addresses: owner only, whatever the umask.
        crate::store::owner_only(path)?;
        Ok(EventLog { write, read })
    }

    pub async fn close(&self) {
        self.read.close().await;
        self.write.close().await;
    }

    /// Append a batch of events in one transaction, then trim the given
    /// machines (`None`: the events that name none) to their `per_machine`
    /// newest rows. Which machines need trimming is the caller's choice
    /// (see [`crate::events::writer`]). Returns the last row's id: the
    /// one writer appends, so the batch has the ids just before it.
    pub async fn insert(
        &self,
        batch: &[Event],
        trim: &[Option<Key>],
        per_machine: u32,
    ) -> Result<i64, Error> {
        let mut tx = self.write.begin_with("BEGIN IMMEDIATE").await?;
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
                    .push_bind(e.kind.as_str())
                    .push_bind(e.message.as_str())
                    .push_bind(e.fields.as_deref());
            });
            q.build().persistent(true).execute(&mut *tx).await?;
        }
        let last: i64 = sqlx::query_scalar("SELECT last_insert_rowid()")
            .fetch_one(&mut *tx)
            .await?;
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
        Ok(last)
    }

    /// Trim every machine's events (and those naming none) to the
    /// `per_machine` newest; returns how many went. One pass over the table,
    /// for start-up.
    pub async fn trim_all(&self, per_machine: u32) -> Result<u64, Error> {
        let r = sqlx::query(
            "DELETE FROM events WHERE id IN (
               SELECT id FROM (
                 SELECT id, row_number() OVER (
                   PARTITION BY namespace, name ORDER BY id DESC) AS n
                 FROM events)
               WHERE n > ?1)",
        )
        .bind(per_machine as i64)
        .execute(&self.write)
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
    pub async fn expire(&self, max_age: Duration) -> Result<u64, Error> {
        let cutoff = now_ms() - max_age.as_millis() as i64;
        let r = sqlx::query(
            "DELETE FROM events WHERE id < COALESCE(
                (SELECT id FROM events WHERE ts_ms >= ?1 ORDER BY id LIMIT 1),
                (SELECT max(id) + 1 FROM events))",
        )
        .bind(cutoff)
        .execute(&self.write)
        .await?;
        Ok(r.rows_affected())
    }

    /// The newest `limit` events matching, oldest first.
    pub async fn query(&self, q: &EventQuery) -> Result<Vec<EventRow>, Error> {
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
    async fn connections_have_the_long_wal_and_the_writer_its_cache() {
        let dir = tempfile::tempdir().unwrap();
        let log = open(&dir).await;
        let q = |pool: &SqlitePool, pragma: &'static str| {
            let pool = pool.clone();
            async move {
                sqlx::query_scalar::<_, i64>(pragma)
                    .fetch_one(&pool)
                    .await
                    .unwrap()
            }
        };
        for pool in [&log.write, &log.read] {
            assert_eq!(
                q(pool, "PRAGMA wal_autocheckpoint").await,
                WAL_AUTOCHECKPOINT as i64
            );
            // NORMAL (1): the log may lose its last commits to a power cut.
            assert_eq!(q(pool, "PRAGMA synchronous").await, 1);
        }
        assert_eq!(
            q(&log.write, "PRAGMA cache_size").await,
            -(EVENTS_CACHE_KIB as i64)
        );
        assert_eq!(q(&log.write, "PRAGMA temp_store").await, 2);
        assert_ne!(
            q(&log.read, "PRAGMA cache_size").await,
            -(EVENTS_CACHE_KIB as i64)
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join(FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "{mode:o}");
        log.close().await;
    }

    #[tokio::test]
    async fn event_log_sqlite_thread_runs_below_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir).await;
        store
            .insert(&[Event::new(Kind::Test, "x")], &[], 10)
            .await
            .unwrap();
        let sqlite: Vec<(i64, i64)> = threads()
            .into_iter()
            .filter(|(c, _, _)| c.starts_with("sqlx-sqlite"))
            .map(|(_, n, p)| (n, p))
            .collect();
        // One writer under SCHED_IDLE and BACKGROUND_NICE below us; the
        // readers at our priority.
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
        let low = (ours + crate::priority::BACKGROUND_NICE as i64).min(19);
        assert_eq!(
            sqlite
                .iter()
                .filter(|&&t| t == (low, crate::priority::SCHED_IDLE))
                .count(),
            1,
            "{sqlite:?}"
        );
        store
            .query(&EventQuery {
                limit: 1,
                ..Default::default()
            })
            .await
            .unwrap();
        let sqlite: Vec<(i64, i64)> = threads()
            .into_iter()
            .filter(|(c, _, _)| c.starts_with("sqlx-sqlite"))
            .map(|(_, n, p)| (n, p))
            .collect();
        assert!(sqlite.contains(&(ours, 0)), "{sqlite:?}");
        store.close().await;
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
        assert_eq!(store.expire(Duration::from_secs(60)).await.unwrap(), 0);
        let old: Vec<Event> = (0..5).map(|i| ev(3600, i)).collect();
        store.insert(&old, &[], 1000).await.unwrap();
        // All old: all go.
        assert_eq!(store.expire(Duration::from_secs(60)).await.unwrap(), 5);
        let mixed: Vec<Event> = (0..10)
            .map(|i| ev(if i < 4 { 3600 } else { 5 }, i))
            .collect();
        store.insert(&mixed, &[], 1000).await.unwrap();
        assert_eq!(store.expire(Duration::from_secs(60)).await.unwrap(), 4);
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
        assert_eq!(store.expire(Duration::from_secs(60)).await.unwrap(), 0);
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
        store.insert(&batch, &[], 1000).await.unwrap();
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
        store
            .insert(&[], &[Some(a.clone()), None], 4)
            .await
            .unwrap();
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
