//! The Kubernetes mirror's writes of Templates, Workflows and Rufio's
//! objects (Hardware has its own, [`Store::mirror_hardware`], because of
//! its key index). The cluster is the truth: a list replaces the kind
//! whole, in one transaction, so what was deleted while the watch was down
//! goes too.

use super::bmc::{NewJob, State as JobState, insert_job, job_machine, new_job, upsert_secret};
use super::workflow::import_status;
use super::{DocTable, Outcome, Store, StoreError, upsert_document};
use crate::bmc::model::Doc;
use crate::hardware::Key;
use crate::kinds::{Checked, Kind};
use crate::workflow::model::Status;
use std::collections::HashSet;

/// One mirrored object, checked, with what the cluster says of its state.
pub struct MirrorItem {
    pub checked: Checked,
    /// A Workflow's status as the cluster has it (in tinkerbox's schema).
    pub status: Option<Status>,
    /// A Job's or Task's outcome as the cluster has it: a job that ran
    /// (under another leader, or before the store was wiped) is stored as
    /// done and never run again.
    pub job_state: Option<(JobState, Option<String>)>,
}

impl MirrorItem {
    pub fn new(checked: Checked) -> Self {
        MirrorItem {
            checked,
            status: None,
            job_state: None,
        }
    }

    pub fn key(&self) -> &Key {
        match &self.checked {
            Checked::Hardware(h) => &h.machine.key,
            Checked::Template(t) => &t.key,
            Checked::Workflow(w) => &w.key,
            Checked::RuleSet(r) => &r.key,
            Checked::Host(h) => &h.key,
            Checked::HostData(d) => &d.key,
            Checked::Bmc(Doc::Machine { key, .. })
            | Checked::Bmc(Doc::Job { key, .. })
            | Checked::Bmc(Doc::Task { key, .. })
            | Checked::Bmc(Doc::Secret { key, .. }) => key,
        }
    }
}

/// Where a kind lives: its table, and the statement for one row's keys.
fn keys_sql(kind: Kind) -> Option<(&'static str, &'static str)> {
    Some(match kind {
        Kind::Template => (
            "SELECT namespace, name FROM templates",
            "DELETE FROM templates WHERE namespace = ? AND name = ?",
        ),
        Kind::WorkflowRuleSet => (
            "SELECT namespace, name FROM workflow_rulesets",
            "DELETE FROM workflow_rulesets WHERE namespace = ? AND name = ?",
        ),
        Kind::Workflow => (
            "SELECT namespace, name FROM workflows",
            "DELETE FROM workflows WHERE namespace = ? AND name = ?",
        ),
        Kind::Machine => (
            "SELECT namespace, name FROM bmc_machines",
            "DELETE FROM bmc_machines WHERE namespace = ? AND name = ?",
        ),
        Kind::Secret => (
            "SELECT namespace, name FROM bmc_secrets",
            "DELETE FROM bmc_secrets WHERE namespace = ? AND name = ?",
        ),
        Kind::Job => (
            "SELECT namespace, name FROM bmc_jobs WHERE kind = 'Job'",
            "DELETE FROM bmc_jobs WHERE namespace = ? AND name = ? AND kind = 'Job'",
        ),
        Kind::Task => (
            "SELECT namespace, name FROM bmc_jobs WHERE kind = 'Task'",
            "DELETE FROM bmc_jobs WHERE namespace = ? AND name = ? AND kind = 'Task'",
        ),
        Kind::BareMetalHost => (
            "SELECT namespace, name FROM baremetalhosts",
            "DELETE FROM baremetalhosts WHERE namespace = ? AND name = ?",
        ),
        Kind::HardwareData => (
            "SELECT namespace, name FROM hardware_data",
            "DELETE FROM hardware_data WHERE namespace = ? AND name = ?",
        ),
        Kind::Hardware => return None,
    })
}

/// For kinds stored with their document: the stored object's uid, and a
/// delete of the row only when it is that object (or has no uid).
fn uid_sql(kind: Kind) -> Option<(&'static str, &'static str)> {
    macro_rules! uid {
        ($table:literal) => {
            (
                concat!("SELECT json_extract(doc, '$.metadata.uid') FROM ", $table, " WHERE namespace = ? AND name = ?"),
                concat!("DELETE FROM ", $table, " WHERE namespace = ? AND name = ? AND coalesce(json_extract(doc, '$.metadata.uid'), ?3) = ?3"),
            )
        };
    }
    Some(match kind {
        Kind::Template => uid!("templates"),
        Kind::Workflow => uid!("workflows"),
        Kind::WorkflowRuleSet => uid!("workflow_rulesets"),
        Kind::Machine => uid!("bmc_machines"),
        Kind::Job | Kind::Task => uid!("bmc_jobs"),
        Kind::BareMetalHost => uid!("baremetalhosts"),
        Kind::HardwareData => uid!("hardware_data"),
        Kind::Hardware | Kind::Secret => return None,
    })
}

/// The uid the stored `kind` object `key` has, if any.
async fn stored_uid(
    tx: &mut sqlx::SqliteConnection,
    kind: Kind,
    key: &Key,
) -> Result<Option<String>, StoreError> {
    let Some((select, _)) = uid_sql(kind) else {
        return Ok(None);
    };
    let uid: Option<Option<String>> = sqlx::query_scalar(select)
        .bind(&key.namespace)
        .bind(&key.name)
        .fetch_optional(&mut *tx)
        .await?;
    Ok(uid.flatten())
}

fn uid_of(doc: &serde_json::Value) -> Option<&str> {
    doc.pointer("/metadata/uid")
        .and_then(serde_json::Value::as_str)
}

impl Store {
    /// Mirror objects of one `kind` (not Hardware). `replace`: `items` is
    /// the whole set, every other object of the kind is deleted, except
    /// those in `keep` (objects the cluster has but tinkerbox could not
    /// take: their last good copy stays). `take_status`: the cluster's
    /// Workflow status replaces the stored one (this instance does not
    /// write it); a Workflow new to the store always takes it. Returns the
    /// outcomes and the keys deleted.
    pub async fn mirror_objects(
        &self,
        kind: Kind,
        items: &[MirrorItem],
        replace: bool,
        keep: &[Key],
        take_status: bool,
    ) -> Result<(Vec<Outcome>, Vec<Key>), StoreError> {
        let Some((select, delete)) = keys_sql(kind) else {
            return Err(StoreError::Io(std::io::Error::other(
                "Hardware is mirrored by mirror_hardware",
            )));
        };
        let mut tx = self.pool().begin_with("BEGIN IMMEDIATE").await?;
        let mut deleted = vec![];
        if replace {
            let wanted: HashSet<&Key> = items.iter().map(MirrorItem::key).chain(keep).collect();
            let all: Vec<(String, String)> = sqlx::query_as(select).fetch_all(&mut *tx).await?;
            for (ns, name) in all {
                let key = Key::new(ns, name);
                if !wanted.contains(&key) {
                    sqlx::query(delete)
                        .bind(&key.namespace)
                        .bind(&key.name)
                        .execute(&mut *tx)
                        .await?;
                    deleted.push(key);
                }
            }
        }
        let mut outcomes = Vec::with_capacity(items.len());
        for item in items {
            let o = match &item.checked {
                Checked::Template(t) => {
                    upsert_document(&mut tx, DocTable::Templates, &t.key, &t.doc).await?
                }
                Checked::RuleSet(r) => {
                    upsert_document(&mut tx, DocTable::RuleSets, &r.key, &r.doc).await?
                }
                Checked::Host(h) => super::metal3::upsert_host(&mut tx, h).await?,
                Checked::HostData(d) => super::metal3::upsert_data_secret(&mut tx, d).await?,
                Checked::Workflow(w) => {
                    // Deleted and made again under its name while unwatched:
                    // a new Workflow, whose status is not the old one's.
                    let old = stored_uid(&mut tx, Kind::Workflow, &w.key).await?;
                    let new_object = old.is_some() && old.as_deref() != uid_of(&w.doc);
                    let o = upsert_document(&mut tx, DocTable::Workflows, &w.key, &w.doc).await?;
                    let take = take_status || new_object || o == Outcome::Created;
                    let status = match &item.status {
                        Some(s) => Some(s.clone()),
                        None if new_object => Some(Status::default()),
                        None => None,
                    };
                    match status {
                        Some(s) if take && import_status(&mut tx, &w.key, &s).await? => {
                            Outcome::Configured.max_with(o)
                        }
                        _ => o,
                    }
                }
                Checked::Bmc(Doc::Machine { key, doc, .. }) => {
                    upsert_document(&mut tx, DocTable::BmcMachines, key, doc).await?
                }
                Checked::Bmc(Doc::Secret { key, credentials }) => {
                    upsert_secret(&mut tx, key, credentials).await?
                }
                Checked::Bmc(d @ (Doc::Job { .. } | Doc::Task { .. })) => {
                    let m = job_machine(d);
                    match new_job(d, m.as_ref()) {
                        Some(job) => {
                            mirror_job(&mut tx, &job, item.job_state.as_ref(), take_status).await?
                        }
                        None => Outcome::Unchanged,
                    }
                }
                Checked::Hardware(_) => {
                    return Err(StoreError::Io(std::io::Error::other(
                        "Hardware is mirrored by mirror_hardware",
                    )));
                }
            };
            outcomes.push(o);
        }
        tx.commit().await?;
        match kind {
            Kind::Workflow => self.bump_workflows(),
            Kind::WorkflowRuleSet => self.bump_rulesets(),
            _ => {}
        }
        Ok((outcomes, deleted))
    }

    /// One object of `kind` deleted in the cluster; with `uid`, only if the
    /// stored one is that object (a Job deleted and made again under its
    /// name, whose delete arrives after the new one was stored, stays).
    pub async fn mirror_delete(
        &self,
        kind: Kind,
        key: &Key,
        uid: Option<&str>,
    ) -> Result<bool, StoreError> {
        let Some((_, delete)) = keys_sql(kind) else {
            return Ok(false);
        };
        let r = match (uid, uid_sql(kind)) {
            (Some(uid), Some((_, delete_uid))) => {
                sqlx::query(delete_uid)
                    .bind(&key.namespace)
                    .bind(&key.name)
                    .bind(uid)
                    .execute(self.pool())
                    .await?
            }
            _ => {
                sqlx::query(delete)
                    .bind(&key.namespace)
                    .bind(&key.name)
                    .execute(self.pool())
                    .await?
            }
        };
        match kind {
            Kind::Workflow => self.bump_workflows(),
            Kind::WorkflowRuleSet => self.bump_rulesets(),
            _ => {}
        }
        Ok(r.rows_affected() > 0)
    }
}

impl Outcome {
    /// Configured wins over Unchanged; Created stays Created.
    fn max_with(self, other: Outcome) -> Outcome {
        if other == Outcome::Created {
            other
        } else {
            self
        }
    }
}

/// A Job or Task from the cluster: stored once (the cluster may change
/// its labels or status, never its tasks: those changes are not a new
/// job), with the outcome the cluster already records, if any; for one
/// already stored, that outcome is taken only with `take_status` (another
/// instance runs the jobs).
async fn mirror_job(
    tx: &mut sqlx::SqliteConnection,
    job: &NewJob<'_>,
    state: Option<&(JobState, Option<String>)>,
    take_status: bool,
) -> Result<Outcome, StoreError> {
    let stored: Option<(JobState, Option<String>)> = sqlx::query_as(
        "SELECT state, json_extract(doc, '$.metadata.uid') FROM bmc_jobs WHERE namespace = ? AND name = ?",
    )
    .bind(&job.key.namespace)
    .bind(&job.key.name)
    .fetch_optional(&mut *tx)
    .await?;
    // Another object of the name (deleted and made again): replaced.
    let stored = match stored {
        Some((_, Some(old))) if uid_of(job.doc).is_some_and(|new| new != old) => {
            sqlx::query("DELETE FROM bmc_jobs WHERE namespace = ? AND name = ?")
                .bind(&job.key.namespace)
                .bind(&job.key.name)
                .execute(&mut *tx)
                .await?;
            None
        }
        other => other.map(|(s, _)| s),
    };
    let o = match stored {
        Some(s) if !take_status || state.is_none_or(|(c, _)| *c == s) => {
            return Ok(Outcome::Unchanged);
        }
        Some(_) => Outcome::Configured,
        None => insert_job(tx, job).await?,
    };
    if let Some((s, message)) = state {
        sqlx::query(
            "UPDATE bmc_jobs SET state = ?, message = ?, completed_ms = ? WHERE namespace = ? AND name = ?",
        )
        .bind(s)
        .bind(message)
        .bind(crate::clock::now_ms())
        .bind(&job.key.namespace)
        .bind(&job.key.name)
        .execute(&mut *tx)
        .await?;
    }
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::check;
    use crate::workflow::model::State;
    use serde_json::json;

    fn item(doc: serde_json::Value) -> MirrorItem {
        MirrorItem::new(check(doc).unwrap())
    }

    fn workflow(name: &str) -> serde_json::Value {
        json!({"apiVersion": "tinkerbell.org/v1alpha1", "kind": "Workflow",
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}")},
            "spec": {"templateRef": "t"}})
    }

    fn job(name: &str) -> serde_json::Value {
        job_uid(name, &format!("uid-{name}"))
    }

    fn job_uid(name: &str, uid: &str) -> serde_json::Value {
        json!({"apiVersion": "bmc.tinkerbell.org/v1alpha1", "kind": "Job",
            "metadata": {"name": name, "namespace": "ns", "uid": uid},
            "spec": {"machineRef": {"name": "m", "namespace": "ns"}, "tasks": [{"powerAction": "on"}]}})
    }

    /// A list replaces the kind whole; the cluster's Workflow status is
    /// taken for a new Workflow, and afterwards only when asked; a job the
    /// cluster says is done is stored done.
    #[tokio::test]
    async fn a_list_replaces_the_kind_and_status_is_taken_when_asked() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("t.db")).await.unwrap();
        let mut a = item(workflow("a"));
        a.status = Some(Status {
            state: State::Running,
            ..Status::default()
        });
        let b = item(workflow("b"));
        let (o, gone) = store
            .mirror_objects(Kind::Workflow, &[a, b], true, &[], false)
            .await
            .unwrap();
        assert_eq!(o, [Outcome::Created, Outcome::Created]);
        assert!(gone.is_empty());
        let k = |n: &str| Key::new("ns", n);
        let row = store.workflow(&k("a")).await.unwrap().unwrap();
        assert_eq!(row.status.state, State::Running, "taken when new");
        // The engine moves it on; the cluster's older status is not taken
        // back unless asked.
        let mut s = row.status.clone();
        s.state = State::Success;
        store
            .save_workflow_status(&row.key, row.version, &s)
            .await
            .unwrap();
        let mut again = item(workflow("a"));
        again.status = Some(Status {
            state: State::Running,
            ..Status::default()
        });
        let (o, gone) = store
            .mirror_objects(Kind::Workflow, &[again], true, &[k("b")], false)
            .await
            .unwrap();
        assert_eq!(o, [Outcome::Unchanged]);
        assert!(gone.is_empty(), "b is kept: {gone:?}");
        let row = store.workflow(&k("a")).await.unwrap().unwrap();
        assert_eq!(row.status.state, State::Success);
        let mut taken = item(workflow("a"));
        taken.status = Some(Status {
            state: State::Failed,
            ..Status::default()
        });
        let (o, gone) = store
            .mirror_objects(Kind::Workflow, &[taken], true, &[], true)
            .await
            .unwrap();
        assert_eq!(o, [Outcome::Configured]);
        assert_eq!(gone, [k("b")]);
        let row = store.workflow(&k("a")).await.unwrap().unwrap();
        assert_eq!(row.status.state, State::Failed);
        assert!(
            !store
                .mirror_delete(Kind::Workflow, &k("a"), Some("another"))
                .await
                .unwrap(),
            "another object of the name"
        );
        assert!(
            store
                .mirror_delete(Kind::Workflow, &k("a"), Some("uid-a"))
                .await
                .unwrap()
        );
        assert!(store.workflow(&k("a")).await.unwrap().is_none());

        let mut done = item(job("j1"));
        done.job_state = Some((JobState::Completed, None));
        let fresh = item(job("j2"));
        let (o, _) = store
            .mirror_objects(Kind::Job, &[done, fresh], true, &[], false)
            .await
            .unwrap();
        assert_eq!(o, [Outcome::Created, Outcome::Created]);
        let j1 = store.job(&k("j1")).await.unwrap().unwrap();
        assert_eq!(j1.state, JobState::Completed);
        let pending = store.jobs(Some(JobState::Pending)).await.unwrap();
        assert_eq!(pending.len(), 1);
        assert_eq!(pending[0].name, "j2");
        // Seen again (a relist): not a new job.
        let (o, gone) = store
            .mirror_objects(Kind::Job, &[item(job("j2"))], true, &[], false)
            .await
            .unwrap();
        assert_eq!(o, [Outcome::Unchanged]);
        assert_eq!(gone, [k("j1")]);
        // Made again under its name: a new job, pending; the late delete
        // of the old one does not take the new one.
        let mut j2 = store.job(&k("j2")).await.unwrap().unwrap();
        j2.state = JobState::Completed;
        store.save_job(&j2).await.unwrap();
        let (o, _) = store
            .mirror_objects(
                Kind::Job,
                &[item(job_uid("j2", "again"))],
                false,
                &[],
                false,
            )
            .await
            .unwrap();
        assert_eq!(o, [Outcome::Created]);
        assert!(
            !store
                .mirror_delete(Kind::Job, &k("j2"), Some("uid-j2"))
                .await
                .unwrap()
        );
        assert_eq!(
            store.job(&k("j2")).await.unwrap().unwrap().state,
            JobState::Pending
        );
        // A Workflow made again under its name starts over.
        store
            .mirror_objects(Kind::Workflow, &[item(workflow("w"))], false, &[], false)
            .await
            .unwrap();
        let row = store.workflow(&k("w")).await.unwrap().unwrap();
        let mut s = row.status.clone();
        s.state = State::Success;
        store
            .save_workflow_status(&row.key, row.version, &s)
            .await
            .unwrap();
        let mut again = workflow("w");
        again["metadata"]["uid"] = json!("uid-w-2");
        store
            .mirror_objects(Kind::Workflow, &[item(again)], false, &[], false)
            .await
            .unwrap();
        assert_eq!(
            store.workflow(&k("w")).await.unwrap().unwrap().status.state,
            State::New
        );
    }
}
