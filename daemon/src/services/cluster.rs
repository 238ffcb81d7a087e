//! The services' port to "the cluster" (Kubernetes mode): a trait the
//! services own and `kube` implements, so the module arrows point one way
//! (`kube` uses the services, never the other way round). Host mode has no
//! cluster, and every call here is then a no-op.

use crate::hardware::{FieldError, Hardware, Key};
use crate::kinds::Kind;
use crate::store::mirror::MirrorItem;
use crate::workflow::model::Status;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// An object whose status tinkerbox owes the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Owed {
    Workflow(Key),
    /// A Job or a Task (a Rufio Task run as a one-task job).
    Job(Key),
    Machine(Key),
    BareMetalHost(Key),
}

/// A cluster object's copy, checked, with the resourceVersion it had.
#[derive(Debug, Clone)]
pub struct Copy<T> {
    pub key: Key,
    pub item: T,
    pub version: Option<String>,
}

/// Why the cluster did not take a write.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The change is not valid (an edit refused it, or the result).
    #[error("{0}")]
    Invalid(#[from] FieldError),
    #[error("{0} not found in the cluster")]
    NotFound(String),
    /// The API server refused, failed or did not answer in time.
    #[error("the Kubernetes API: {0}")]
    Failed(String),
}

/// An edit of a stored document; it may refuse.
pub type Edit<'a> = dyn FnMut(&mut Value) -> Result<(), FieldError> + Send + 'a;

/// What the services ask of the cluster.
#[async_trait::async_trait]
pub trait Cluster: Send + Sync {
    /// Change Hardware `key` with `edit` where it lives (read, edit, write
    /// with the resourceVersion read, again on a conflict): the copy the
    /// cluster has now.
    async fn update_hardware(
        &self,
        key: &Key,
        edit: &mut Edit<'_>,
    ) -> Result<Copy<Hardware>, ClusterError>;

    /// Make BMC Job `key` from `doc`. With `run` (a Workflow's boot job): a
    /// job of the name that runs, or was made for this run, is kept (None
    /// returned); one from an earlier run is replaced. The job as made.
    async fn put_job(
        &self,
        key: &Key,
        doc: &Value,
        run: Option<&str>,
    ) -> Result<Option<Copy<MirrorItem>>, ClusterError>;

    /// Set Hardware `key`'s status fields in `status` (the rest of its
    /// status is left as it is).
    async fn hardware_status(&self, key: &Key, status: &Value) -> Result<(), ClusterError>;

    /// Remove annotation `name` from object `key` of `kind`.
    async fn remove_annotation(
        &self,
        kind: Kind,
        key: &Key,
        name: &str,
    ) -> Result<(), ClusterError>;

    /// Make object `key` of `kind` from `doc` unless one of that name
    /// exists (None): the copy made, as the cluster has it.
    async fn create(
        &self,
        kind: Kind,
        key: &Key,
        doc: &Value,
    ) -> Result<Option<Copy<Value>>, ClusterError>;

    /// Object `key` of `kind` as `doc` has it (made, or brought to it):
    /// one server-side apply of its metadata and spec, under tinkerbox's
    /// field manager. The copy the cluster has now.
    async fn apply(&self, kind: Kind, key: &Key, doc: &Value) -> Result<Copy<Value>, ClusterError>;

    /// Object `key` of `kind` gone. True when it existed.
    async fn delete(&self, kind: Kind, key: &Key) -> Result<bool, ClusterError>;

    /// Object `key` of `kind` as the cluster has it now (None: not there).
    async fn get(&self, kind: Kind, key: &Key) -> Result<Option<Value>, ClusterError>;

    /// Change object `key` of `kind` (its metadata or spec) with `edit`:
    /// read, edit, write with the resourceVersion read, again on a
    /// conflict. The copy the cluster has now.
    async fn edit(
        &self,
        kind: Kind,
        key: &Key,
        edit: &mut Edit<'_>,
    ) -> Result<Copy<Value>, ClusterError>;

    /// The stored status of `o` is owed to the cluster (written behind,
    /// coalesced), while this instance leads.
    fn owe(&self, o: Owed);

    /// A worker was answered with Workflow `key`'s status as stored at
    /// `version` (`next`): wait until the cluster has its milestones.
    async fn workflow_durable(
        &self,
        key: &Key,
        version: i64,
        next: &Status,
    ) -> Result<(), ClusterError>;

    /// Job `key`'s status as stored now is in the cluster (before a BMC
    /// command is sent, and once it ended).
    async fn job_durable(&self, key: &Key) -> Result<(), ClusterError>;
}

/// What the services share of the cluster: the port (kube mode, once
/// connected) and the newest resourceVersion mirrored of each object.
#[derive(Default)]
pub struct Link {
    port: OnceLock<Arc<dyn Cluster>>,
    versions: Mutex<HashMap<(Kind, Key), u64>>,
}

impl Link {
    /// Kube mode: the cluster is where mirrored objects are written.
    pub fn connect(&self, c: Arc<dyn Cluster>) {
        let _ = self.port.set(c);
    }

    pub fn cluster(&self) -> Option<&Arc<dyn Cluster>> {
        self.port.get()
    }

    pub fn owe(&self, o: Owed) {
        if let Some(c) = self.port.get() {
            c.owe(o);
        }
    }

    /// Whether a copy of `kind` `key` at resourceVersion `rv` is newer
    /// than every copy mirrored so far (then it is the newest). A watch
    /// event can arrive after the answer to a write that came later (the
    /// services mirror that answer at once), and must not undo it.
    /// Versions are compared as numbers, as etcd's revisions are; a copy
    /// without one that is a number is always taken.
    pub fn newer(&self, kind: Kind, key: &Key, rv: Option<&str>) -> bool {
        let Some(rv) = rv.and_then(|v| v.parse::<u64>().ok()) else {
            return true;
        };
        let mut m = self.versions.lock().unwrap_or_else(|p| p.into_inner());
        match m.get(&(kind, key.clone())) {
            Some(seen) if *seen >= rv => false,
            _ => {
                m.insert((kind, key.clone()), rv);
                true
            }
        }
    }

    /// `kind` `key` was deleted: a later copy of the name is a new object.
    pub fn forget(&self, kind: Kind, key: &Key) {
        self.versions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(kind, key.clone()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An older copy never replaces a newer one; after a delete, the
    /// name starts again; a version that is not a number is taken.
    #[test]
    fn an_older_copy_is_not_newer() {
        let l = Link::default();
        let k = Key::new("ns", "m1");
        assert!(l.newer(Kind::Hardware, &k, Some("7")));
        assert!(!l.newer(Kind::Hardware, &k, Some("6")), "a stale event");
        assert!(!l.newer(Kind::Hardware, &k, Some("7")), "the same copy");
        assert!(l.newer(Kind::Hardware, &k, Some("8")));
        assert!(l.newer(Kind::Workflow, &k, Some("1")), "per kind");
        assert!(l.newer(Kind::Hardware, &k, Some("x1")));
        assert!(l.newer(Kind::Hardware, &k, None));
        l.forget(Kind::Hardware, &k);
        assert!(l.newer(Kind::Hardware, &k, Some("2")));
    }
}
