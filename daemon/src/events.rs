//! The per-machine event log. Hot paths hand events to an [`EventSink`]
//! without waiting (a bounded channel, `try_send`); one writer task batches
//! them into SQLite transactions. When the queue is full an event is dropped
//! and counted, never waited for.

use crate::hardware::{Key, Mac};
use crate::metrics::Metrics;
use crate::store::{Store, now_ms};
use serde_json::Value;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// Events written per transaction at most.
const BATCH: usize = 512;

#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub ts_ms: i64,
    pub machine: Option<Key>,
    pub mac: Option<Mac>,
    pub ip: Option<IpAddr>,
    /// Short, stable, dotted: `hardware.created`, `dhcp.offer`, `tftp.sent`.
    pub kind: &'static str,
    pub message: String,
    pub fields: Option<Value>,
}

impl Event {
    pub fn new(kind: &'static str, message: impl Into<String>) -> Self {
        Event {
            ts_ms: now_ms(),
            machine: None,
            mac: None,
            ip: None,
            kind,
            message: message.into(),
            fields: None,
        }
    }

    pub fn machine(mut self, key: Key) -> Self {
        self.machine = Some(key);
        self
    }

    pub fn mac(mut self, mac: Mac) -> Self {
        self.mac = Some(mac);
        self
    }

    pub fn ip(mut self, ip: IpAddr) -> Self {
        self.ip = Some(ip);
        self
    }

    pub fn fields(mut self, fields: Value) -> Self {
        self.fields = Some(fields);
        self
    }
}

#[derive(Clone)]
pub struct EventSink {
    tx: mpsc::Sender<Event>,
    metrics: Arc<Metrics>,
}

impl EventSink {
    /// Never blocks: a full queue drops the event and counts it.
    pub fn record(&self, e: Event) {
        if self.tx.try_send(e).is_err() {
            self.metrics.events_dropped.inc();
        }
    }
}

/// The sink and its receiving end; run [`writer`] on the receiver.
pub fn channel(queue: usize, metrics: Arc<Metrics>) -> (EventSink, mpsc::Receiver<Event>) {
    let (tx, rx) = mpsc::channel(queue);
    (EventSink { tx, metrics }, rx)
}

/// Drain the queue into the store until every sender is gone, batching what
/// has accumulated while the previous transaction ran. Old events are
/// expired once an hour.
pub async fn writer(
    mut rx: mpsc::Receiver<Event>,
    store: Store,
    metrics: Arc<Metrics>,
    per_machine: u32,
    max_age: Duration,
) {
    let mut buf = Vec::with_capacity(BATCH);
    let mut expire = tokio::time::interval(Duration::from_secs(3600));
    expire.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            n = rx.recv_many(&mut buf, BATCH) => {
                if n == 0 {
                    break;
                }
                match store.insert_events(&buf, per_machine).await {
                    Ok(()) => {
                        metrics.events_written.inc_by(n as u64);
                    }
                    Err(e) => {
                        metrics.events_dropped.inc_by(n as u64);
                        tracing::warn!(error = %e, lost = n, "writing events failed");
                    }
                }
                buf.clear();
            }
            _ = expire.tick() => {
                match store.expire_events(max_age).await {
                    Ok(n) if n > 0 => tracing::info!(deleted = n, "expired old events"),
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "expiring events failed"),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_queue_drops_and_counts() {
        let m = Arc::new(Metrics::new());
        let (sink, mut rx) = channel(2, m.clone());
        for i in 0..5 {
            sink.record(Event::new("test", format!("e{i}")));
        }
        assert_eq!(m.events_dropped.get(), 3);
        assert_eq!(rx.try_recv().unwrap().message, "e0");
        assert_eq!(rx.try_recv().unwrap().message, "e1");
        assert!(rx.try_recv().is_err());
    }

    #[tokio::test]
    async fn writer_batches_trims_and_exits() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("t.db")).await.unwrap();
        let m = Arc::new(Metrics::new());
        let (sink, rx) = channel(1000, m.clone());
        let k = Key::new("default", "m1");
        for i in 0..50 {
            sink.record(Event::new("test", format!("e{i}")).machine(k.clone()));
        }
        sink.record(Event::new("test", "stray"));
        drop(sink);
        writer(rx, store.clone(), m.clone(), 10, Duration::from_secs(3600)).await;
        assert_eq!(m.events_written.get(), 51);
        let q = crate::store::EventQuery {
            machine: Some(k),
            after: None,
            limit: 100,
        };
        let rows = store.events(&q).await.unwrap();
        assert_eq!(rows.len(), 10, "trimmed to per_machine");
        assert_eq!(rows.first().unwrap().message, "e40");
        assert_eq!(rows.last().unwrap().message, "e49");
        let all = store
            .events(&crate::store::EventQuery {
                limit: 100,
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(all.len(), 11);
        assert_eq!(all.last().unwrap().message, "stray");
    }
}
