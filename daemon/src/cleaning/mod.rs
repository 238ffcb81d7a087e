//! Cleaning on release, for Hardware that CAPT gives back.
//!
//! CAPT claims a Hardware by labelling it `v1alpha1.tinkerbell.org/
//! ownerName` (and `ownerNamespace`) and releases it by removing the
//! labels after a hard power-off; it never cleans the disks, so the next
//! cluster's machine boots whatever the last one installed until its own
//! Workflow writes over it. With `[cleaning] on_release = "metadata"`
//! tinkerbox marks each Hardware CAPT claims (annotation
//! [`PHASE`]` = claimed`), and when the labels go it holds the Hardware
//! (owner label [`HOLDER`], which CAPT's selection, `ownerName
//! DoesNotExist`, skips), netboots it into a Workflow that wipes every
//! disk's partition tables and signatures (as a BareMetalHost's
//! `automatedCleaningMode: metadata`), and gives it back by removing the
//! hold.
//!
//! The phase is kept on the Hardware, so a restart or a new leader picks
//! it up where it was. What is pure is here: the phase a Hardware is in,
//! the next step ([`decide`]), the change that step makes to the
//! document ([`edit`]) and the Template and Workflow ([`operation`]). The
//! tokio shell is [`controller`].

pub mod controller;

use crate::hardware::{FieldError, Key};
use serde_json::{Value, json};

/// CAPT's owner labels on a Hardware it claimed.
pub const OWNER_NAME: &str = "v1alpha1.tinkerbell.org/ownerName";
pub const OWNER_NAMESPACE: &str = "v1alpha1.tinkerbell.org/ownerNamespace";
/// The phase of a Hardware's cleaning, kept on the Hardware. A user's
/// `disabled` opts one Hardware out; any value this build does not know
/// leaves it alone too.
pub const PHASE: &str = "tinkerbox.io/release-cleaning";
/// Why the last cleaning failed.
pub const ERROR: &str = "tinkerbox.io/release-cleaning-error";
/// The run of a cleaning: on the Hardware while held, and on its
/// Template and Workflow (how tinkerbox tells its own, and the current
/// run's Workflow from an earlier one).
pub const RUN: &str = "tinkerbox.io/release-cleaning-run";
/// The owner name that holds a Hardware while it is cleaned. The
/// underscore makes it a label value no object name can be, so no
/// TinkerbellMachine ever takes it for its own.
pub const HOLDER: &str = "tinkerbox_cleaning";

/// The phase annotation's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Never cleaned (the user's opt-out).
    Disabled,
    /// Claimed by CAPT: cleaned once it is released.
    Claimed,
    /// Held, its Workflow under way.
    Cleaning,
    /// Held: the Workflow failed ([`ERROR`] says why). The user retries
    /// (`retry`) or gives it back uncleaned (removes the hold).
    Failed,
    /// The user asks for another run after a failure.
    Retry,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Disabled => "disabled",
            Phase::Claimed => "claimed",
            Phase::Cleaning => "cleaning",
            Phase::Failed => "failed",
            Phase::Retry => "retry",
        }
    }

    fn parse(s: &str) -> Option<Phase> {
        [
            Phase::Disabled,
            Phase::Claimed,
            Phase::Cleaning,
            Phase::Failed,
            Phase::Retry,
        ]
        .into_iter()
        .find(|p| p.as_str() == s)
    }
}

/// Who holds a Hardware, by its owner label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    Free,
    /// tinkerbox, while it cleans.
    Holder,
    /// A TinkerbellMachine (CAPT), or whoever else set the label.
    Other,
}

/// What [`decide`] reads from a Hardware document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub owner: Owner,
    /// `None`: no annotation. An unknown value reads as `Disabled`.
    pub phase: Option<Phase>,
    /// The held run's id.
    pub run: Option<String>,
}

fn label<'a>(doc: &'a Value, section: &str, name: &str) -> Option<&'a str> {
    doc.get("metadata")
        .and_then(|m| m.get(section))
        .and_then(|l| l.get(name))
        .and_then(Value::as_str)
}

pub fn seen(doc: &Value) -> Seen {
    let owner = match label(doc, "labels", OWNER_NAME) {
        None => Owner::Free,
        Some(HOLDER) => Owner::Holder,
        Some(_) => Owner::Other,
    };
    let phase =
        label(doc, "annotations", PHASE).map(|v| Phase::parse(v).unwrap_or(Phase::Disabled));
    Seen {
        owner,
        phase,
        run: label(doc, "annotations", RUN).map(String::from),
    }
}

/// The worker a cleaning Workflow runs on (`spec.agentID`, else the first
/// interface's MAC, as the iPXE script's `worker_id`) and whether the
/// Hardware can be booted into it (a BMC Machine): why not, else.
pub fn worker(doc: &Value) -> Result<String, &'static str> {
    let spec = doc.get("spec").unwrap_or(&Value::Null);
    if spec
        .pointer("/bmcRef/name")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        return Err("it has no bmcRef, so tinkerbox cannot boot it");
    }
    let id = spec
        .get("agentID")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .or_else(|| {
            spec.pointer("/interfaces/0/dhcp/mac")
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
        });
    id.map(str::to_ascii_lowercase)
        .ok_or("it has neither spec.agentID nor a MAC on its first interface")
}

/// Where the current run's Workflow is.
pub use crate::workflow::model::Run;

/// Why a Hardware's cleaning ended without a wipe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skip {
    /// It cannot be booted into the Workflow ([`worker`]'s reason).
    Unbootable(&'static str),
    /// A user removed the hold (or the phase): given back as it is.
    GivenBack,
}

/// The next step for one Hardware.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Nothing,
    /// CAPT claimed it: remember to clean it on release. A cleaning of an
    /// earlier release, if one was under way, is dropped.
    Mark,
    /// Released: hold it and start a new run.
    Hold,
    /// Held, and no Workflow of this run: make it.
    Start,
    /// The Workflow succeeded: give it back.
    Finish,
    /// The Workflow failed: keep holding it, saying why.
    Fail(String),
    /// Give it back without cleaning.
    Unmark(Skip),
}

/// The next step for a Hardware in `seen`, its current run's Workflow
/// `run` and its `bootable` answer ([`worker`]).
pub fn decide(seen: &Seen, run: &Run, bootable: Result<(), &'static str>) -> Step {
    use Owner as O;
    use Phase as P;
    match (&seen.owner, seen.phase) {
        (O::Other, None | Some(P::Cleaning | P::Failed | P::Retry)) => Step::Mark,
        (O::Other, Some(P::Claimed | P::Disabled)) => Step::Nothing,
        (O::Free | O::Holder, Some(P::Claimed | P::Retry)) => match bootable {
            Ok(()) => Step::Hold,
            Err(why) => Step::Unmark(Skip::Unbootable(why)),
        },
        (O::Free, Some(P::Cleaning | P::Failed)) => Step::Unmark(Skip::GivenBack),
        (O::Free, None | Some(P::Disabled)) => Step::Nothing,
        (O::Holder, Some(P::Cleaning)) => match run {
            Run::None => Step::Start,
            Run::Running => Step::Nothing,
            Run::Succeeded => Step::Finish,
            Run::Failed(m) => Step::Fail(m.clone()),
        },
        (O::Holder, Some(P::Failed)) => Step::Nothing,
        // tinkerbox's hold with no phase left: the user's give-back.
        (O::Holder, None | Some(P::Disabled)) => Step::Unmark(Skip::GivenBack),
    }
}

fn set(doc: &mut Value, section: &str, name: &str, value: Option<&str>) {
    let meta = &mut doc["metadata"];
    match value {
        Some(v) => {
            if !meta.get(section).is_some_and(Value::is_object) {
                meta[section] = json!({});
            }
            meta[section][name] = json!(v);
        }
        None => {
            if let Some(m) = meta.get_mut(section).and_then(Value::as_object_mut) {
                m.remove(name);
            }
        }
    }
}

/// The change `step` makes to the Hardware (`run`: a new run's id, for
/// [`Step::Hold`]), checked against what was `expected` when the step was
/// decided: another writer's change in between refuses, and the next
/// pass decides again.
pub fn edit(doc: &mut Value, expected: &Seen, step: &Step, run: &str) -> Result<(), FieldError> {
    if seen(doc) != *expected {
        return Err(FieldError::new(
            "metadata",
            "the Hardware changed since it was read",
        ));
    }
    // The annotations after the step (None: removed).
    let (phase, run, error) = match step {
        Step::Nothing | Step::Start => return Ok(()),
        Step::Mark => (Some(Phase::Claimed), None, None),
        Step::Hold => (Some(Phase::Cleaning), Some(run), None),
        Step::Fail(m) => (
            Some(Phase::Failed),
            expected.run.as_deref(),
            Some(m.as_str()),
        ),
        Step::Finish | Step::Unmark(_) => (None, None, None),
    };
    match step {
        Step::Hold => set(doc, "labels", OWNER_NAME, Some(HOLDER)),
        Step::Finish | Step::Unmark(_) => {
            // CAPT's namespace label, when a user's edit left it, goes too.
            set(doc, "labels", OWNER_NAMESPACE, None);
            if expected.owner == Owner::Holder {
                set(doc, "labels", OWNER_NAME, None);
            }
        }
        _ => {}
    }
    set(doc, "annotations", PHASE, phase.map(Phase::as_str));
    set(doc, "annotations", RUN, run);
    // The failure's message is 1 KiB at most: an annotation is no log.
    let error = error.map(|m| match m.char_indices().nth(1024) {
        Some((i, _)) => &m[..i],
        None => m,
    });
    set(doc, "annotations", ERROR, error);
    Ok(())
}

/// The cleaning Template's and Workflow's name.
pub fn key(hw: &Key) -> Key {
    Key::new(
        hw.namespace.clone(),
        format!("{}-release-cleaning", hw.name),
    )
}

/// Whether a Template or Workflow is one of tinkerbox's cleanings (not a
/// user's object of the name, never taken over).
pub fn ours(doc: &Value) -> bool {
    label(doc, "annotations", RUN).is_some()
}

/// The run's Template and Workflow: the disks wiped, then powered off,
/// on `worker`, netbooted by the engine (a Workflow's `bootOptions`:
/// PXE allowed for its run, the BMC asked to netboot it).
pub fn operation(hw: &Value, hw_key: &Key, worker: &str, run: &str) -> (Value, Value) {
    let k = key(hw_key);
    let mut meta = json!({
        "name": k.name,
        "namespace": k.namespace,
        "annotations": {RUN: run},
    });
    // In the cluster: removed with the Hardware.
    if let Some(uid) = hw.pointer("/metadata/uid").and_then(Value::as_str) {
        meta["ownerReferences"] = json!([{
            "apiVersion": crate::hardware::API_VERSION, "kind": crate::hardware::KIND,
            "name": hw_key.name, "uid": uid,
        }]);
    }
    let data = json!({
        "version": "0.1",
        "name": k.name,
        "global_timeout": 1800,
        "tasks": [{
            "name": "release-cleaning",
            "worker": "{{.device_1}}",
            "volumes": ["/dev:/dev"],
            "actions": crate::metal3::owned::deprovision_actions(),
        }],
    });
    let template = json!({
        "apiVersion": crate::workflow::model::API_VERSION,
        "kind": "Template",
        "metadata": meta,
        "spec": {"data": serde_json::to_string_pretty(&data).unwrap_or_default()},
    });
    let workflow = json!({
        "apiVersion": crate::workflow::model::API_VERSION,
        "kind": "Workflow",
        "metadata": meta,
        "spec": {
            "templateRef": k.name,
            "hardwareRef": hw_key.name,
            "hardwareMap": {"device_1": worker},
            "bootOptions": {"bootMode": "netboot", "toggleAllowNetboot": true},
        },
    });
    (template, workflow)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hw(labels: Value, annotations: Value, bmc: bool) -> Value {
        let mut d = json!({
            "apiVersion": "tinkerbell.org/v1alpha1", "kind": "Hardware",
            "metadata": {"name": "hw-1", "namespace": "tink", "uid": "u-1",
                         "labels": labels, "annotations": annotations},
            "spec": {"interfaces": [{"dhcp": {"mac": "52:54:00:AA:00:01"}}]},
        });
        if bmc {
            d["spec"]["bmcRef"] =
                json!({"apiGroup": "bmc.tinkerbell.org", "kind": "Machine", "name": "bmc-1"});
        }
        d
    }

    fn capt() -> Value {
        json!({OWNER_NAME: "tm-0", OWNER_NAMESPACE: "default"})
    }

    /// Decide and apply, as the controller does; the document after.
    fn step(doc: &mut Value, run: &Run) -> Step {
        let s = seen(doc);
        let st = decide(&s, run, worker(doc).map(|_| ()));
        edit(doc, &s, &st, "1700").unwrap();
        st
    }

    #[test]
    fn a_claim_is_marked_and_a_release_held_cleaned_and_given_back() {
        let mut d = hw(capt(), json!({}), true);
        assert_eq!(step(&mut d, &Run::None), Step::Mark);
        assert_eq!(d["metadata"]["annotations"][PHASE], "claimed");
        assert_eq!(step(&mut d, &Run::None), Step::Nothing);
        // CAPT's release: both labels and its annotation removed.
        d["metadata"]["labels"] = json!({});
        assert_eq!(step(&mut d, &Run::None), Step::Hold);
        assert_eq!(d["metadata"]["labels"][OWNER_NAME], HOLDER);
        assert_eq!(d["metadata"]["annotations"][PHASE], "cleaning");
        assert_eq!(d["metadata"]["annotations"][RUN], "1700");
        assert_eq!(step(&mut d, &Run::None), Step::Start);
        assert_eq!(step(&mut d, &Run::Running), Step::Nothing);
        assert_eq!(step(&mut d, &Run::Succeeded), Step::Finish);
        assert_eq!(d["metadata"]["labels"], json!({}));
        assert_eq!(d["metadata"]["annotations"], json!({}));
        assert_eq!(step(&mut d, &Run::None), Step::Nothing);
    }

    #[test]
    fn a_failure_holds_it_until_the_user_retries_or_gives_it_back() {
        let mut d = hw(
            json!({OWNER_NAME: HOLDER}),
            json!({PHASE: "cleaning", RUN: "9"}),
            true,
        );
        let m = "action \"wipe disks\" FAILED: x".repeat(100);
        assert_eq!(step(&mut d, &Run::Failed(m.clone())), Step::Fail(m));
        assert_eq!(d["metadata"]["annotations"][PHASE], "failed");
        assert_eq!(d["metadata"]["annotations"][RUN], "9");
        assert_eq!(
            d["metadata"]["annotations"][ERROR].as_str().unwrap().len(),
            1024
        );
        assert_eq!(step(&mut d, &Run::None), Step::Nothing);
        // retry: a new run.
        d["metadata"]["annotations"][PHASE] = json!("retry");
        assert_eq!(step(&mut d, &Run::None), Step::Hold);
        assert_eq!(d["metadata"]["annotations"][RUN], "1700");
        assert!(d["metadata"]["annotations"].get(ERROR).is_none());
        // The user removes the hold: given back uncleaned.
        d["metadata"]["labels"] = json!({});
        assert_eq!(step(&mut d, &Run::None), Step::Unmark(Skip::GivenBack));
        assert_eq!(d["metadata"]["annotations"], json!({}));
        // ...or the phase, leaving the label: the label goes too.
        let mut d = hw(json!({OWNER_NAME: HOLDER}), json!({}), true);
        assert_eq!(step(&mut d, &Run::None), Step::Unmark(Skip::GivenBack));
        assert_eq!(d["metadata"]["labels"], json!({}));
    }

    #[test]
    fn what_is_not_cleaned() {
        // Opted out, or a phase this build does not know.
        for v in ["disabled", "someday"] {
            let mut d = hw(capt(), json!({PHASE: v}), true);
            assert_eq!(step(&mut d, &Run::None), Step::Nothing);
            d["metadata"]["labels"] = json!({});
            assert_eq!(step(&mut d, &Run::None), Step::Nothing);
        }
        // Free and never claimed.
        let mut d = hw(json!({"rack": "r1"}), json!({}), true);
        assert_eq!(step(&mut d, &Run::None), Step::Nothing);
        // No BMC to boot it: released as CAPT leaves it.
        let mut d = hw(json!({}), json!({PHASE: "claimed"}), false);
        let st = step(&mut d, &Run::None);
        assert!(
            matches!(st, Step::Unmark(Skip::Unbootable(w)) if w.contains("bmcRef")),
            "{st:?}"
        );
        assert_eq!(d["metadata"]["annotations"], json!({}));
        // Claimed again while held (a user's label): the cleaning dropped.
        let mut d = hw(capt(), json!({PHASE: "cleaning", RUN: "9"}), true);
        assert_eq!(step(&mut d, &Run::Running), Step::Mark);
        assert_eq!(d["metadata"]["annotations"][PHASE], "claimed");
        assert!(d["metadata"]["annotations"].get(RUN).is_none());
    }

    #[test]
    fn a_change_since_the_read_refuses_the_edit() {
        let mut d = hw(json!({}), json!({PHASE: "claimed"}), true);
        let s = seen(&d);
        let st = decide(&s, &Run::None, Ok(()));
        assert_eq!(st, Step::Hold);
        // CAPT claimed it again in between.
        d["metadata"]["labels"] = capt();
        let before = d.clone();
        assert!(edit(&mut d, &s, &st, "1").is_err());
        assert_eq!(d, before);
    }

    #[test]
    fn the_worker_is_the_agent_id_else_the_first_mac() {
        let mut d = hw(json!({}), json!({}), true);
        assert_eq!(worker(&d).unwrap(), "52:54:00:aa:00:01");
        d["spec"]["agentID"] = json!("agent-7");
        assert_eq!(worker(&d).unwrap(), "agent-7");
        d["spec"]["agentID"] = json!("");
        d["spec"]["interfaces"] = json!([]);
        assert!(worker(&d).unwrap_err().contains("MAC"));
    }

    #[test]
    fn the_operation_is_documents_the_engine_takes_and_renders() {
        let d = hw(json!({}), json!({}), true);
        let k = Key::new("tink", "hw-1");
        let (t, w) = operation(&d, &k, "52:54:00:aa:00:01", "5");
        assert!(ours(&t) && ours(&w));
        assert_eq!(w["metadata"]["ownerReferences"][0]["uid"], "u-1");
        let t = crate::workflow::model::template(t).unwrap();
        let w = crate::workflow::model::workflow(w).unwrap();
        assert_eq!(t.key, key(&k));
        assert_eq!(w.doc["spec"]["hardwareRef"], "hw-1");
        let map = std::collections::BTreeMap::from([(
            "device_1".to_string(),
            "52:54:00:aa:00:01".to_string(),
        )]);
        let text = crate::workflow::render::execute(
            t.doc["spec"]["data"].as_str().unwrap(),
            Some(&d),
            &map,
        )
        .unwrap();
        let r: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(r["tasks"][0]["worker"], "52:54:00:aa:00:01");
        assert_eq!(r["tasks"][0]["actions"][0]["name"], "wipe disks");
        assert_eq!(
            r["tasks"][0]["actions"][0]["environment"]["MODE"],
            "metadata"
        );
    }
}
