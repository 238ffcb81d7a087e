//! Moving the cluster's Workflows between releases whose Workflow CRDs
//! differ (tink v0.12's `STATE_*`/`worker`/`templateRending` to the current
//! shape). Upstream ships no migration for this; tinkerbox's runs in three
//! resumable steps, each one idempotent:
//!
//! 1. before the CRD changes, every v0.12 status is copied into an
//!    annotation on its own Workflow ([`BACKUP`]): the old object is kept,
//!    and a new CRD pruning the old fields cannot lose it;
//! 2. after the new CRD is applied, each status is rewritten from that copy
//!    (a merge patch on `/status`: new fields set, old ones removed);
//! 3. once every Workflow is converted, the copies are removed.
//!
//! A failure anywhere leaves the copies, and the next attempt resumes.

use crate::kube::convert::{self, WorkflowSchema};
use serde_json::{Value, json};

/// The annotation holding a Workflow's v0.12 status until the migration
/// has succeeded (JSON text).
pub const BACKUP: &str = "tinkerbox.io/v0.12-status";

/// What a change of release means for the Workflows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Same shape: roll the Deployments only.
    Nothing,
    /// v0.12 to current: migrate first.
    Migrate,
    /// Current to v0.12: the newer fields have nowhere to go, so refused
    /// while any Workflow exists.
    Downgrade,
}

pub fn step(from: WorkflowSchema, to: WorkflowSchema) -> Step {
    match (from, to) {
        (WorkflowSchema::V012, WorkflowSchema::Current) => Step::Migrate,
        (WorkflowSchema::Current, WorkflowSchema::V012) => Step::Downgrade,
        _ => Step::Nothing,
    }
}

fn annotation(wf: &Value) -> Option<&str> {
    wf.pointer("/metadata/annotations")
        .and_then(|a| a.get(BACKUP))
        .and_then(Value::as_str)
}

/// The metadata patch keeping a v0.12 Workflow's status; `None`: it has no
/// v0.12 status, or it is kept already.
pub fn backup(wf: &Value) -> Option<Value> {
    if annotation(wf).is_some() {
        return None;
    }
    let status = wf.get("status").filter(|s| convert::is_v012(s))?;
    Some(json!({"metadata": {"annotations": {BACKUP: status.to_string()}}}))
}

/// Whether the Workflow has a copy still to convert or to drop.
pub fn kept(wf: &Value) -> bool {
    annotation(wf).is_some()
}

/// A kept Workflow's status in the current shape: what its status must
/// be before the copy may go.
pub fn target(wf: &Value) -> Result<Option<Value>, String> {
    let Some(text) = annotation(wf) else {
        return Ok(None);
    };
    let old: Value =
        serde_json::from_str(text).map_err(|e| format!("annotation {BACKUP} is not JSON: {e}"))?;
    let status = convert::status_from_cluster(&old)
        .ok_or_else(|| format!("annotation {BACKUP} is not a Workflow status"))?;
    Ok(Some(convert::status_to_cluster(
        &status,
        WorkflowSchema::Current,
    )))
}

/// The status patch turning a kept Workflow's status into the current
/// shape; `None`: nothing kept, or converted already.
pub fn convert(wf: &Value) -> Result<Option<Value>, String> {
    let Some(new) = target(wf)? else {
        return Ok(None);
    };
    let live = wf.get("status").cloned().unwrap_or_else(|| json!({}));
    Ok(convert::merge_patch(&live, &new).map(|p| json!({"status": p})))
}

/// Whether a migration failed after the new CRD went in (the resource's
/// `Migrated` condition is False): the kept copies are still there, and the
/// installed CRD no longer says so, so the next attempt must not wait for
/// it.
pub fn unfinished(status: &Value, to: WorkflowSchema) -> bool {
    to == WorkflowSchema::Current
        && status["conditions"].as_array().is_some_and(|a| {
            a.iter()
                .any(|c| c["type"] == "Migrated" && c["status"] == "False")
        })
}

/// The metadata patch dropping the copy.
pub fn drop_backup() -> Value {
    json!({"metadata": {"annotations": {BACKUP: null}}})
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Workflow as tink v0.12.2's controller left it mid-run.
    fn v012() -> Value {
        json!({"apiVersion": "tinkerbell.org/v1alpha1", "kind": "Workflow",
            "metadata": {"name": "wf1", "namespace": "default"},
            "spec": {"templateRef": "t1", "hardwareRef": "hw1", "hardwareMap": {"device_1": "02:00:00:00:00:01"}},
            "status": {"state": "STATE_RUNNING", "templateRending": "successful", "globalTimeout": 900,
                "currentAction": "stream",
                "tasks": [{"name": "os", "worker": "02:00:00:00:00:01",
                    "actions": [
                        {"name": "wipe", "image": "quay.io/tinkerbell/actions/wipe", "timeout": 60,
                         "status": "STATE_SUCCESS", "startedAt": "2026-11-20T10:00:00Z", "seconds": 7},
                        {"name": "stream", "image": "quay.io/tinkerbell/actions/image2disk", "timeout": 600,
                         "status": "STATE_RUNNING", "startedAt": "2026-11-20T10:00:07Z"}]}]}})
    }

    fn apply(doc: &mut Value, patch: &Value) {
        *doc = merge(doc.clone(), patch);
    }

    fn merge(target: Value, patch: &Value) -> Value {
        match (target, patch) {
            (Value::Object(mut t), Value::Object(p)) => {
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        let cur = t.remove(k).unwrap_or(Value::Null);
                        t.insert(k.clone(), merge(cur, v));
                    }
                }
                Value::Object(t)
            }
            (_, p) => p.clone(),
        }
    }

    #[test]
    fn a_v012_workflow_is_kept_converted_and_released() {
        assert_eq!(
            step(WorkflowSchema::V012, WorkflowSchema::Current),
            Step::Migrate
        );
        assert_eq!(
            step(WorkflowSchema::Current, WorkflowSchema::V012),
            Step::Downgrade
        );
        assert_eq!(
            step(WorkflowSchema::Current, WorkflowSchema::Current),
            Step::Nothing
        );

        let mut wf = v012();
        let original = wf["status"].clone();
        let b = backup(&wf).expect("a v0.12 status is kept");
        apply(&mut wf, &b);
        assert!(kept(&wf));
        assert_eq!(backup(&wf), None, "kept once");
        // The new CRD prunes what it does not know: the copy is what counts.
        wf["status"]
            .as_object_mut()
            .unwrap()
            .remove("templateRending");
        let p = convert(&wf).unwrap().expect("converted");
        apply(&mut wf, &p);
        let s = &wf["status"];
        assert_eq!(s["state"], "RUNNING");
        assert_eq!(s["templateRendering"], "successful");
        assert_eq!(s["agentID"], "02:00:00:00:00:01");
        assert_eq!(s["globalTimeout"], 900);
        assert!(s.get("currentAction").is_none() && s.get("templateRending").is_none());
        let a = &s["tasks"][0]["actions"];
        assert_eq!(s["tasks"][0]["agentID"], "02:00:00:00:00:01");
        assert!(s["tasks"][0].get("worker").is_none());
        assert_eq!(a[0]["state"], "SUCCESS");
        assert_eq!(a[0]["executionStart"], "2026-11-20T10:00:00Z");
        assert_eq!(a[0]["executionStop"], "2026-11-20T10:00:07Z");
        assert_eq!(a[0]["executionDuration"], "7s");
        assert_eq!(a[1]["state"], "RUNNING");
        assert!(a[0].get("status").is_none() && a[0].get("seconds").is_none());
        assert_eq!(convert(&wf).unwrap(), None, "converted once");
        // Released: the copy goes, and it was the old status verbatim.
        let copy: Value = serde_json::from_str(annotation(&wf).unwrap()).unwrap();
        assert_eq!(copy, original);
        apply(&mut wf, &drop_backup());
        assert!(!kept(&wf));
        assert_eq!(wf["metadata"]["annotations"], json!({}));
    }

    #[test]
    fn a_failed_migration_is_resumed_until_it_succeeds() {
        let failed = json!({"conditions": [{"type": "Migrated", "status": "False", "reason": "MigrationFailed"}]});
        let done = json!({"conditions": [{"type": "Migrated", "status": "True"}]});
        assert!(unfinished(&failed, WorkflowSchema::Current));
        assert!(
            !unfinished(&failed, WorkflowSchema::V012),
            "not towards v0.12"
        );
        assert!(!unfinished(&done, WorkflowSchema::Current));
        assert!(!unfinished(&json!({}), WorkflowSchema::Current));
        // What it resumes from: the copy, whatever the status is now.
        let mut wf = v012();
        let b = backup(&wf).unwrap();
        apply(&mut wf, &b);
        wf["status"] = json!({"state": "RUNNING"});
        let t = target(&wf).unwrap().unwrap();
        assert_eq!(t["tasks"][0]["actions"][0]["executionDuration"], "7s");
        assert!(convert(&wf).unwrap().is_some());
    }

    #[test]
    fn what_is_not_v012_is_left_alone_and_a_bad_copy_is_an_error() {
        let fresh = json!({"metadata": {"name": "new"}, "spec": {}});
        assert_eq!(backup(&fresh), None);
        let current =
            json!({"metadata": {"name": "c"}, "status": {"state": "SUCCESS", "agentID": "x"}});
        assert_eq!(backup(&current), None);
        assert_eq!(convert(&current).unwrap(), None);
        let broken = json!({"metadata": {"name": "b", "annotations": {BACKUP: "{not json"}}});
        assert!(convert(&broken).unwrap_err().contains("not JSON"));
    }
}
