//! BareMetalHosts' writer: a user's apply and delete, the lifecycle
//! controller's status writes, and the inspection reports that arrive
//! over HTTP. Each write wakes the controller.

use super::Error;
use crate::clock::now_ms;
use crate::events::{Event, EventSink, Kind};
use crate::hardware::{FieldError, Key};
use crate::metal3::details;
use crate::metal3::model::{Host, ProvisioningState, Status};
use crate::metal3::state::Private;
use crate::store::metal3::{HostRow, rfc3339};
use crate::store::{Outcome, Store, StoreError};
use serde_json::{Value, json};
use std::sync::Arc;
use tokio::sync::Notify;

pub struct Metal3Service {
    store: Store,
    events: EventSink,
    /// Wakes the lifecycle controller.
    pub wake: Arc<Notify>,
}

/// Why an inspection report was refused.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// No host, or not this report's secret, or not inspecting: the
    /// same answer for each, so a caller learns nothing of the hosts.
    #[error("no inspection is waiting for this report")]
    Unknown,
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Status writes lost to a concurrent change are retried this often.
const ATTEMPTS: usize = 8;

impl Metal3Service {
    pub fn new(store: Store, events: EventSink) -> Self {
        Metal3Service {
            store,
            events,
            wake: Arc::new(Notify::new()),
        }
    }

    pub async fn apply(&self, hosts: &[Host]) -> Result<Vec<Outcome>, StoreError> {
        let out = self.store.apply_hosts(hosts).await?;
        self.wake.notify_one();
        Ok(out)
    }

    /// A delete: the host is taken down (powered off, its parts removed)
    /// and then goes, as BMO's finalizer does.
    pub async fn delete(&self, key: &Key) -> Result<bool, Error> {
        let found = self
            .store
            .mark_host_deleted(key, &rfc3339(now_ms()))
            .await?;
        self.wake.notify_one();
        Ok(found)
    }

    /// The controller's write of one pass, if the host is still as it read
    /// it; the state change and a new error are events of the host.
    pub async fn save(
        &self,
        row: &HostRow,
        doc: Option<&Value>,
        status: &Status,
        private: &Private,
    ) -> Result<i64, StoreError> {
        let v = self
            .store
            .save_host(&row.key, row.version, doc, status, private)
            .await?;
        let (from, to) = (row.status.provisioning.state, status.provisioning.state);
        if from != to {
            self.events.record(
                Event::new(
                    Kind::Metal3State,
                    format!(
                        "provisioning state {:?} -> {:?}",
                        from.as_str(),
                        to.as_str()
                    ),
                )
                .machine(row.key.clone()),
            );
        }
        if status.error_count > row.status.error_count
            && let Some(t) = status.error_type
        {
            self.events.record(
                Event::new(
                    Kind::Metal3Error,
                    format!("{}: {}", t.as_str(), status.error_message),
                )
                .machine(row.key.clone()),
            );
        }
        Ok(v)
    }

    /// The host and its HardwareData gone (the finalizer's last step).
    pub async fn remove(&self, key: &Key) -> Result<bool, StoreError> {
        let gone = self.store.remove_host(key).await?;
        if gone {
            self.events
                .record(Event::new(Kind::Metal3State, "deleted".to_string()).machine(key.clone()));
        }
        Ok(gone)
    }

    /// BMO's HardwareData for `host`: the report, named and owned as the
    /// host.
    pub async fn save_hardware_data(&self, host: &HostRow, report: &Value) -> Result<(), Error> {
        let mut meta = json!({"name": host.key.name, "namespace": host.key.namespace,
                              "finalizers": ["baremetalhost.metal3.io/hardwareData"]});
        if let Some(uid) = host.doc.pointer("/metadata/uid").and_then(Value::as_str) {
            meta["ownerReferences"] = json!([{
                "apiVersion": crate::metal3::API_VERSION, "kind": crate::metal3::KIND,
                "name": host.key.name, "uid": uid, "controller": true, "blockOwnerDeletion": true,
            }]);
        }
        let doc = json!({
            "apiVersion": crate::metal3::API_VERSION,
            "kind": crate::metal3::HARDWARE_DATA_KIND,
            "metadata": meta,
            "spec": {"hardware": report},
        });
        self.store.save_hardware_data(&host.key, &doc).await?;
        Ok(())
    }

    /// An inspection's report, from the agent's `inspect` action: kept in
    /// the host's bookkeeping if `token` is the current inspection's.
    pub async fn report(&self, key: &Key, token: &str, body: &[u8]) -> Result<(), ReportError> {
        let report = details::check_report(body).map_err(ReportError::Invalid)?;
        for _ in 0..ATTEMPTS {
            let Some(row) = self.store.host(key).await? else {
                return Err(ReportError::Unknown);
            };
            let waiting = row.status.provisioning.state == ProvisioningState::Inspecting
                && !row.private.token.is_empty()
                && constant_time_eq::constant_time_eq(
                    row.private.token.as_bytes(),
                    token.as_bytes(),
                );
            if !waiting {
                return Err(ReportError::Unknown);
            }
            let mut private = row.private.clone();
            private.report = Some(report.clone());
            match self
                .store
                .save_host(key, row.version, None, &row.status, &private)
                .await
            {
                Ok(_) => {
                    self.wake.notify_one();
                    return Ok(());
                }
                Err(StoreError::Stale { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(ReportError::Store(StoreError::Stale {
            key: key.clone(),
            expected: 0,
            found: 0,
        }))
    }

    /// An annotation a pass removed (`inspect.metal3.io`,
    /// `reboot.metal3.io`), in the document it read.
    pub fn without_annotation(doc: &Value, name: &str) -> Option<Value> {
        let mut d = doc.clone();
        let a = d
            .pointer_mut("/metadata/annotations")
            .and_then(Value::as_object_mut)?;
        a.remove(name)?;
        Some(d)
    }
}

impl From<ReportError> for Error {
    fn from(e: ReportError) -> Self {
        match e {
            ReportError::Store(s) => Error::Store(s),
            other => Error::Invalid(FieldError::new("", other.to_string())),
        }
    }
}
