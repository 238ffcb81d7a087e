//! BareMetalHosts' writer: a user's apply and delete, the lifecycle
//! controller's status writes, and the inspection reports that arrive
//! over HTTP. Each write wakes the controller.

use super::Error;
use super::{Copy, Link, Mirrored, Owed};
use crate::clock::now_ms;
use crate::events::{Event, EventSink, Kind};
use crate::hardware::{FieldError, Key};
use crate::kinds::Kind as ObjKind;
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
    /// Kube mode: hosts live in the cluster; their status is owed to it.
    link: Arc<Link>,
    /// Wakes the lifecycle controller.
    pub wake: Arc<Notify>,
    /// One claim at a time.
    claims: tokio::sync::Mutex<()>,
}

/// Why an inspection report was refused.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// No host, or not the current operation's secret, or not in the
    /// state that takes it: the same answer for each, so a caller learns
    /// nothing of the hosts.
    #[error("no host operation is waiting for this request")]
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
            link: Arc::default(),
            wake: Arc::new(Notify::new()),
            claims: tokio::sync::Mutex::new(()),
        }
    }

    pub fn with_link(mut self, link: Arc<Link>) -> Self {
        self.link = link;
        self
    }

    /// The Kubernetes mirror's write (`kube::mirror`): the cluster's hosts,
    /// their documents taken (a delete there is a `deletionTimestamp`,
    /// since the controller's finalizer holds it). Their status is the
    /// cluster's when this instance does not write it (`take_status`: a
    /// follower) and for a host it has never seen (a new store, a host
    /// moved in with its status): the controller goes on from there.
    pub async fn mirror(
        &self,
        change: Mirrored<(Host, Option<Status>)>,
        take_status: bool,
    ) -> Result<(), StoreError> {
        let (copies, replace) = match change {
            // An invalid copy keeps its last good one.
            Mirrored::All { items, invalid } => (items, Some(invalid)),
            Mirrored::One(c) => (vec![c], None),
            Mirrored::Gone(key, uid) => {
                // The object deleted, not a new one of the name made since.
                let stored = self.store.host(&key).await?;
                let same = match (
                    &uid,
                    stored.as_ref().and_then(|r| r.doc.pointer("/metadata/uid")),
                ) {
                    (Some(gone), Some(Value::String(have))) => gone == have,
                    _ => true,
                };
                if same {
                    self.link.forget(ObjKind::BareMetalHost, &key);
                    self.remove(&key).await?;
                }
                return Ok(());
            }
        };
        let mut seen = std::collections::HashSet::new();
        for Copy { key, item, version } in copies {
            seen.insert(key.clone());
            if !self
                .link
                .newer(ObjKind::BareMetalHost, &key, version.as_deref())
            {
                continue;
            }
            let (host, status) = item;
            let known = self.store.host(&key).await?.is_some();
            self.store.apply_hosts(std::slice::from_ref(&host)).await?;
            if let Some(status) = status.filter(|_| take_status || !known)
                && let Some(row) = self.store.host(&key).await?
                && row.status != status
            {
                match self
                    .store
                    .save_host(&key, row.version, None, &status, &row.private)
                    .await
                {
                    // Changed meanwhile: the controller's write is newer.
                    Ok(_) | Err(StoreError::Stale { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        if let Some(keep) = replace {
            for row in self.store.hosts(None).await? {
                if !seen.contains(&row.key) && !keep.contains(&row.key) {
                    self.link.forget(ObjKind::BareMetalHost, &row.key);
                    self.remove(&row.key).await?;
                }
            }
        }
        self.wake.notify_one();
        Ok(())
    }

    pub async fn apply(&self, hosts: &[Host]) -> Result<Vec<Outcome>, StoreError> {
        let out = self.store.apply_hosts(hosts).await?;
        self.wake.notify_one();
        Ok(out)
    }

    /// Secrets of hosts' user, network and meta data.
    pub async fn apply_secrets(
        &self,
        secrets: &[crate::metal3::model::DataSecret],
    ) -> Result<Vec<Outcome>, StoreError> {
        let out = self.store.apply_data_secrets(secrets).await?;
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
        self.link.owe(Owed::BareMetalHost(row.key.clone()));
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

    /// The finalizer's last step. Host mode: the host and its HardwareData
    /// gone from the store. Kube mode: the HardwareData's finalizer taken
    /// off and the object deleted, then the host's finalizer taken off, last
    /// (anything failing before is done again by the next pass); the
    /// cluster then deletes the host and the watch takes it out of the
    /// store (`mirror`'s `Gone`).
    pub async fn finalize(&self, key: &Key) -> Result<bool, Error> {
        if let Some(cluster) = self.link.cluster() {
            // Its HardwareData is held by BMO's finalizer while the host
            // lives: taken off, then the object deleted.
            match cluster
                .edit(ObjKind::HardwareData, key, &mut |d| {
                    if let Some(m) = d.get_mut("metadata").and_then(Value::as_object_mut) {
                        m.remove("finalizers");
                    }
                    Ok(())
                })
                .await
            {
                Ok(_) | Err(super::cluster::ClusterError::NotFound(_)) => {}
                Err(e) => return Err(e.into()),
            }
            cluster.delete(ObjKind::HardwareData, key).await?;
            match cluster
                .edit(ObjKind::BareMetalHost, key, &mut |d| {
                    set_finalizer(d, false);
                    Ok(())
                })
                .await
            {
                Ok(_) | Err(super::cluster::ClusterError::NotFound(_)) => {}
                Err(e) => return Err(e.into()),
            }
            return Ok(true);
        }
        Ok(self.remove(key).await?)
    }

    /// Kube mode: BMO's finalizer on the host in the cluster, so that a
    /// delete waits for the controller to take the host down. False when
    /// it was there already.
    pub async fn hold(&self, host: &Host) -> Result<bool, Error> {
        let Some(cluster) = self.link.cluster() else {
            return Ok(false);
        };
        if has_finalizer(&host.doc) || host.deleting() {
            return Ok(false);
        }
        cluster
            .edit(ObjKind::BareMetalHost, &host.key, &mut |d| {
                set_finalizer(d, true);
                Ok(())
            })
            .await?;
        Ok(true)
    }

    /// Kube mode: an annotation the controller acted on taken off the host
    /// in the cluster (host mode: the controller's save did it).
    pub async fn remove_annotation(&self, key: &Key, name: &str) -> Result<(), Error> {
        if let Some(cluster) = self.link.cluster() {
            cluster
                .remove_annotation(ObjKind::BareMetalHost, key, name)
                .await?;
        }
        Ok(())
    }

    /// The host and its HardwareData gone from the store.
    pub async fn remove(&self, key: &Key) -> Result<bool, StoreError> {
        let gone = self.store.remove_host(key).await?;
        // Kube mode: the pusher forgets what it last wrote of it.
        self.link.owe(Owed::BareMetalHost(key.clone()));
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
        if let Some(cluster) = self.link.cluster() {
            cluster
                .apply(ObjKind::HardwareData, &host.key, &doc)
                .await?;
        }
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

/// What a host's data Secrets hold, read and checked.
#[derive(Debug, Clone, PartialEq)]
pub struct HostData {
    pub user_data: Option<String>,
    pub network_data: Option<Value>,
    pub meta_data: Value,
}

impl Metal3Service {
    /// A host's user, network and meta data from its Secrets (BMO's keys,
    /// each falling back to `value`), as its config drive holds them. The
    /// inner error is BMO's (a Secret missing or unusable: the host's
    /// provisioning error); the outer one says they cannot be read now
    /// (the store, or the cluster not answering), for the next pass.
    pub async fn host_data(
        &self,
        host: &Host,
        uid: &str,
    ) -> Result<Result<HostData, String>, Error> {
        let read = |what: &'static str, r: Option<&crate::metal3::model::SecretRef>| {
            let key = r
                .filter(|r| !r.name.is_empty())
                .map(|r| Key::new(host.key.namespace.clone(), r.name.clone()));
            async move {
                let Some(key) = key else { return Ok(Ok(None)) };
                let Some(data) = self.data_secret(&key).await? else {
                    return Ok(Err(format!(
                        "could not retrieve {what}: Secret {key} was not found"
                    )));
                };
                let field = match what {
                    "user data" => "userData",
                    "network data" => "networkData",
                    _ => "metaData",
                };
                Ok::<_, Error>(Ok(data.get(field).or_else(|| data.get("value")).cloned()))
            }
        };
        let user_data = match read("user data", host.spec.user_data.as_ref()).await? {
            Ok(d) => d,
            Err(m) => return Ok(Err(m)),
        };
        let network = match read("network data", host.spec.network_data.as_ref()).await? {
            Ok(d) => d,
            Err(m) => return Ok(Err(m)),
        };
        let meta = match read("metadata", host.spec.meta_data.as_ref()).await? {
            Ok(d) => d,
            Err(m) => return Ok(Err(m)),
        };
        Ok(Self::host_data_of(host, uid, user_data, network, meta))
    }

    /// The data read, checked: BMO's error when it does not do.
    fn host_data_of(
        host: &Host,
        uid: &str,
        user_data: Option<String>,
        network: Option<String>,
        meta: Option<String>,
    ) -> Result<HostData, String> {
        let network_data = network
            .as_deref()
            .filter(|t| !t.trim().is_empty())
            .map(crate::metal3::configdrive::network_data)
            .transpose()?;
        let meta_data = crate::metal3::configdrive::meta_data(
            uid,
            &host.key.namespace,
            &host.key.name,
            meta.as_deref(),
        )?;
        Ok(HostData {
            user_data,
            network_data,
            meta_data,
        })
    }

    /// A data Secret's keys, from where Secrets live: the cluster (read
    /// when needed, as BMO reads them: only BMC credentials are mirrored),
    /// or the store. None: no such Secret, or not one of host data (as in
    /// host mode, where only those are kept).
    async fn data_secret(
        &self,
        key: &Key,
    ) -> Result<Option<std::collections::BTreeMap<String, String>>, Error> {
        let Some(cluster) = self.link.cluster() else {
            return Ok(self.store.data_secret(key).await?);
        };
        let Some(doc) = cluster.get(ObjKind::Secret, key).await? else {
            return Ok(None);
        };
        match crate::kinds::check(crate::kinds::clean(doc)) {
            Ok(crate::kinds::Checked::HostData(d)) => Ok(Some(d.data)),
            _ => Ok(None),
        }
    }

    /// The config drive of the host's current provisioning, for the
    /// agent's `configdrive` action holding its secret.
    pub async fn config_drive(&self, key: &Key, token: &str) -> Result<Vec<u8>, ReportError> {
        let Some(row) = self.store.host(key).await? else {
            return Err(ReportError::Unknown);
        };
        let waiting = row.status.provisioning.state == ProvisioningState::Provisioning
            && !row.private.token.is_empty()
            && constant_time_eq::constant_time_eq(row.private.token.as_bytes(), token.as_bytes());
        if !waiting {
            return Err(ReportError::Unknown);
        }
        let host = crate::metal3::model::host(row.doc.clone())
            .map_err(|e| ReportError::Invalid(e.to_string()))?;
        let uid = host
            .uid()
            .map(String::from)
            .unwrap_or_else(|| row.status.provisioning.id.clone());
        let d = self
            .host_data(&host, &uid)
            .await
            .map_err(|e| ReportError::Invalid(e.to_string()))?
            .map_err(ReportError::Invalid)?;
        crate::metal3::configdrive::build(
            &d.meta_data,
            d.user_data.as_deref(),
            d.network_data.as_ref(),
        )
        .map_err(ReportError::Invalid)
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

/// `tinkerbox claim`: what a host is claimed with.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Claim {
    #[serde(default)]
    pub namespace: Option<String>,
    /// A label selector (kubectl's grammar); empty: any host.
    #[serde(default)]
    pub selector: String,
    /// This host only (by name), as the web UI's Claim button asks.
    #[serde(default)]
    pub host: Option<String>,
    pub image: crate::metal3::model::Image,
    /// cloud-init user data, kept in a Secret `<host>-<consumer>-user-data`.
    #[serde(default)]
    pub user_data: Option<String>,
    /// The consumer's name (`spec.consumerRef.name`).
    pub consumer: String,
}

/// What a claim or a release did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Claimed {
    pub namespace: String,
    pub name: String,
    pub state: String,
}

/// The consumer kind of `tinkerbox claim`'s hosts.
pub const CLAIM_KIND: &str = "TinkerboxClaim";

impl Metal3Service {
    /// CAPM3's `chooseHost` and `Associate`: among the hosts in the
    /// namespace that match the selector, are available, have no consumer,
    /// no error, are not paused, unhealthy or being deleted, one at random;
    /// then its consumer, image, user data and `online: true` in one write.
    /// Claims are serialised: two never take one host.
    pub async fn claim(&self, c: &Claim) -> Result<Claimed, Error> {
        let _one = self.claims.lock().await;
        let ns = c
            .namespace
            .clone()
            .unwrap_or_else(|| crate::hardware::DEFAULT_NAMESPACE.into());
        let sel = crate::labels::parse(&c.selector)
            .map_err(|m| Error::Invalid(FieldError::new("selector", m)))?;
        if c.image.url.is_empty() {
            return Err(Error::Invalid(FieldError::new("image.url", "required")));
        }
        let rows = self.store.hosts(Some(&ns)).await?;
        let candidates: Vec<&HostRow> = rows
            .iter()
            .filter(|r| c.host.as_ref().is_none_or(|h| *h == r.key.name))
            .filter(|r| crate::labels::selects(&sel, &r.doc) && claimable(r))
            .collect();
        if candidates.is_empty() {
            let which = c
                .host
                .as_ref()
                .map_or(String::new(), |h| format!(" named {h}"));
            return Err(Error::NotFound(format!(
                "an available BareMetalHost{which} in namespace {ns} matching {:?} (state available, no consumer, \
                 no error, not paused)",
                c.selector
            )));
        }
        let mut b = [0u8; 8];
        let pick = match getrandom::fill(&mut b) {
            Ok(()) => (u64::from_le_bytes(b) % candidates.len() as u64) as usize,
            Err(_) => 0,
        };
        let row = candidates[pick];
        let mut doc = row.doc.clone();
        let spec = doc
            .get_mut("spec")
            .and_then(Value::as_object_mut)
            .ok_or_else(|| Error::Invalid(FieldError::new("spec", "the host has no spec")))?;
        spec.insert(
            "consumerRef".into(),
            json!({"kind": CLAIM_KIND, "name": c.consumer, "namespace": ns}),
        );
        spec.insert(
            "image".into(),
            serde_json::to_value(&c.image).unwrap_or_default(),
        );
        spec.insert("online".into(), Value::Bool(true));
        let mut made = None;
        if let Some(u) = &c.user_data {
            let secret = crate::metal3::model::DataSecret {
                key: claim_secret(&ns, &row.key.name, &c.consumer),
                data: [("userData".to_string(), u.clone())].into(),
            };
            if u.len() > crate::metal3::model::DATA_MAX_BYTES {
                return Err(Error::Invalid(FieldError::new(
                    "userData",
                    format!("more than {} bytes", crate::metal3::model::DATA_MAX_BYTES),
                )));
            }
            // Before the host names it: a pass in between would find none
            // (a provisioning error).
            self.put_data_secret(&secret).await?;
            spec.insert("userData".into(), json!({"name": secret.key.name}));
            made = Some(secret.key);
        }
        // The document still passes BMO's webhook.
        let checked = crate::metal3::model::host(doc)?;
        if let Err(e) = self.replace_doc(row, &checked.doc).await {
            // Another claim took the host first: this one's Secret goes.
            if let Some(k) = &made {
                let _ = self.delete_data_secret(k).await;
            }
            return Err(e);
        }
        Ok(Claimed {
            namespace: row.key.namespace.clone(),
            name: row.key.name.clone(),
            state: row.status.provisioning.state.as_str().into(),
        })
    }

    /// CAPM3's `Delete`: the image and the data cleared and `online:
    /// false` (the host deprovisions, cleaned); once the host is available
    /// again, the consumer cleared. Called again until it says so.
    pub async fn release(&self, key: &Key) -> Result<Claimed, Error> {
        let Some(row) = self.store.host(key).await? else {
            return Err(Error::NotFound(format!("BareMetalHost {key}")));
        };
        let mut doc = row.doc.clone();
        let Some(spec) = doc.get_mut("spec").and_then(Value::as_object_mut) else {
            return Err(Error::Invalid(FieldError::new(
                "spec",
                "the host has no spec",
            )));
        };
        let had_image = spec.remove("image").is_some();
        let consumer = spec.get("consumerRef");
        // `claim`'s consumer: the Secret it made goes with it.
        let ours = (consumer.and_then(|c| c.get("kind")).and_then(Value::as_str)
            == Some(CLAIM_KIND))
        .then(|| consumer.and_then(|c| c.get("name")).and_then(Value::as_str))
        .flatten()
        .map(|name| claim_secret(&key.namespace, &key.name, name));
        spec.remove("userData");
        spec.remove("customDeploy");
        spec.remove("metaData");
        spec.remove("networkData");
        let disable = spec.get("disablePowerOff") == Some(&Value::Bool(true));
        spec.insert("online".into(), Value::Bool(disable));
        use ProvisioningState as S;
        let state = row.status.provisioning.state;
        let done = !had_image && matches!(state, S::Available | S::Ready);
        if done {
            spec.remove("consumerRef");
        }
        if doc != row.doc {
            let checked = crate::metal3::model::host(doc)?;
            self.replace_doc(&row, &checked.doc).await?;
        }
        // The user data Secret `claim` made goes with its consumer.
        if done && let Some(secret) = &ours {
            self.delete_data_secret(secret).await?;
        }
        Ok(Claimed {
            namespace: key.namespace.clone(),
            name: key.name.clone(),
            state: if done {
                "released".into()
            } else {
                state.as_str().into()
            },
        })
    }
}

/// The user data Secret of `claim`: one per host and consumer, so that
/// two claims racing for one host never write each other's.
fn claim_secret(namespace: &str, host: &str, consumer: &str) -> Key {
    Key::new(namespace, format!("{host}-{consumer}-user-data"))
}

/// CAPM3's candidate filter (also what shows the web UI's Claim button).
pub fn claimable(r: &HostRow) -> bool {
    use ProvisioningState as S;
    let ann = |k: &str| {
        r.doc
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(k))
            .is_some()
    };
    matches!(r.status.provisioning.state, S::Available | S::Ready)
        && r.doc
            .pointer("/spec/consumerRef")
            .is_none_or(Value::is_null)
        && r.doc.pointer("/metadata/deletionTimestamp").is_none()
        && r.status.error_message.is_empty()
        && !ann(crate::metal3::PAUSED)
        && !ann("capm3.metal3.io/unhealthy")
        && !ann("capi.metal3.io/unhealthy")
}

impl Metal3Service {
    /// A claim's or a release's change of a host's spec, made where the
    /// host lives, if it is still as read (`row`): the store (its
    /// version), or the cluster, where the copy read must still have the
    /// spec the change was made from (another claimant, CAPM3 or a user
    /// may have come between; the resourceVersion guards the write).
    async fn replace_doc(&self, row: &HostRow, doc: &Value) -> Result<(), Error> {
        let Some(cluster) = self.link.cluster() else {
            self.store
                .replace_host_doc(&row.key, row.version, doc)
                .await?;
            self.wake.notify_one();
            return Ok(());
        };
        let (read, spec) = (row.doc.get("spec").cloned(), doc.get("spec").cloned());
        let copy = cluster
            .edit(ObjKind::BareMetalHost, &row.key, &mut |d| {
                if d.get("spec") != read.as_ref() {
                    return Err(FieldError::new(
                        "spec",
                        format!("BareMetalHost {} changed meanwhile; try again", row.key),
                    ));
                }
                d["spec"] = spec.clone().unwrap_or_default();
                Ok(())
            })
            .await?;
        // Stored at once, not when the watch brings it: the next claim
        // (after this one's lock) must see the host taken.
        let host = crate::metal3::model::host(copy.item)?;
        let c = Copy {
            key: copy.key,
            item: (host, None),
            version: copy.version,
        };
        self.mirror(Mirrored::One(c), false).await?;
        Ok(())
    }

    /// The user data Secret a claim makes, where Secrets live.
    async fn put_data_secret(
        &self,
        secret: &crate::metal3::model::DataSecret,
    ) -> Result<(), Error> {
        let Some(cluster) = self.link.cluster() else {
            self.store
                .apply_data_secrets(std::slice::from_ref(secret))
                .await?;
            return Ok(());
        };
        use base64::Engine as _;
        let data: serde_json::Map<String, Value> = secret
            .data
            .iter()
            .map(|(k, v)| {
                let b = base64::engine::general_purpose::STANDARD.encode(v);
                (k.clone(), Value::String(b))
            })
            .collect();
        let doc = json!({
            "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": secret.key.name, "namespace": secret.key.namespace},
            "data": data,
        });
        // Made, never written over: one of the name is not this claim's.
        if cluster
            .create(ObjKind::Secret, &secret.key, &doc)
            .await?
            .is_none()
        {
            return Err(Error::Invalid(FieldError::new(
                "userData",
                format!("Secret {} exists already", secret.key),
            )));
        }
        Ok(())
    }

    async fn delete_data_secret(&self, key: &Key) -> Result<(), Error> {
        match self.link.cluster() {
            Some(cluster) => {
                cluster.delete(ObjKind::Secret, key).await?;
            }
            None => {
                self.store.delete_data_secret(key).await?;
            }
        }
        Ok(())
    }
}

/// Whether BMO's finalizer is on a host's document.
fn has_finalizer(doc: &Value) -> bool {
    doc.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|f| f.iter().any(|v| v == crate::metal3::FINALIZER))
}

/// BMO's finalizer put on a host's document, or taken off.
fn set_finalizer(doc: &mut Value, on: bool) {
    let Some(meta) = doc.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    let list = meta
        .entry("finalizers")
        .or_insert_with(|| Value::Array(vec![]));
    if let Some(a) = list.as_array_mut() {
        a.retain(|v| v != crate::metal3::FINALIZER);
        if on {
            a.push(Value::String(crate::metal3::FINALIZER.into()));
        }
    }
}
