//! Between the cluster's objects and tinkerbox's rows, both ways, without
//! a socket: a Workflow's status in either CRD schema (the current one, or
//! tink v0.12's `STATE_*`, which clusters not yet migrated still have),
//! and Rufio's Job/Task/Machine status.

use crate::hardware::FieldError;
use crate::kinds::{self, Kind};
use crate::store::bmc::{BmcMachineRow, JobRow, State as JobState, TaskState};
use crate::store::mirror::MirrorItem;
use crate::workflow::model::{Action, State, Status, Task, TemplateRendering};
use serde_json::{Map, Value, json};
use std::time::{Duration, UNIX_EPOCH};

/// The Workflow CRD installed on the cluster: where status fields live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkflowSchema {
    /// tinkerbell/tinkerbell's: plain states, `agentID`, `executionStart`.
    Current,
    /// tink v0.12's: `STATE_*`, `worker`, `startedAt`/`seconds`,
    /// `templateRending`.
    V012,
}

impl WorkflowSchema {
    /// From the installed CRD (`customresourcedefinitions/workflows.tinkerbell.org`):
    /// v0.12's status has `tasks[].worker`, the current one `tasks[].agentID`.
    pub fn of_crd(crd: &Value) -> WorkflowSchema {
        let versions = crd
            .pointer("/spec/versions")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let v012 = versions.iter().any(|v| {
            v.pointer("/schema/openAPIV3Schema/properties/status/properties/tasks/items/properties/worker")
                .is_some()
        });
        if v012 {
            WorkflowSchema::V012
        } else {
            WorkflowSchema::Current
        }
    }
}

/// A mirrored object as the store takes it: checked by its kind's rules,
/// with the state the cluster records.
pub fn item(kind: Kind, doc: Value) -> Result<MirrorItem, FieldError> {
    let status = doc.get("status").cloned();
    let mut item = MirrorItem::new(kinds::check(doc)?);
    match kind {
        Kind::Workflow => item.status = status.as_ref().and_then(status_from_cluster),
        Kind::Job | Kind::Task => item.job_state = status.as_ref().and_then(job_state),
        _ => {}
    }
    Ok(item)
}

/// Whether a Workflow status is in tink v0.12's schema.
pub fn is_v012(v: &Value) -> bool {
    v.get("templateRending").is_some()
        || v.get("state")
            .and_then(Value::as_str)
            .is_some_and(|s| s.starts_with("STATE_"))
        || v.pointer("/tasks/0/worker").is_some()
}

/// A Workflow's status in tinkerbox's (the current) schema, from either.
/// `None`: no status yet, or one that is neither schema (the engine then
/// starts the Workflow as new).
pub fn status_from_cluster(v: &Value) -> Option<Status> {
    let o = v.as_object()?;
    if o.is_empty() {
        return None;
    }
    if !is_v012(v) {
        return serde_json::from_value(v.clone()).ok();
    }
    let state = |v: Option<&Value>| -> State {
        let s = v.and_then(Value::as_str).unwrap_or("");
        serde_json::from_value(Value::String(
            s.strip_prefix("STATE_").unwrap_or(s).to_string(),
        ))
        .unwrap_or_default()
    };
    let strs = |v: Option<&Value>| -> Vec<String> {
        v.and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default()
    };
    let env = |v: Option<&Value>| {
        v.and_then(|e| serde_json::from_value(e.clone()).ok())
            .unwrap_or_default()
    };
    let text = |v: Option<&Value>| v.and_then(Value::as_str).map(String::from);
    let tasks: Vec<Task> = o
        .get("tasks")
        .and_then(Value::as_array)
        .map(|ts| {
            ts.iter()
                .enumerate()
                .map(|(i, t)| Task {
                    // v0.12 has no ids; the agent protocol needs stable ones.
                    id: format!("task-{i}"),
                    name: text(t.get("name")).unwrap_or_default(),
                    agent_id: text(t.get("worker")).unwrap_or_default(),
                    volumes: strs(t.get("volumes")),
                    environment: env(t.get("environment")),
                    actions: t
                        .get("actions")
                        .and_then(Value::as_array)
                        .map(|acts| {
                            acts.iter()
                                .enumerate()
                                .map(|(j, a)| {
                                    let start = text(a.get("startedAt"));
                                    let secs = a.get("seconds").and_then(Value::as_u64);
                                    let stop = start
                                        .as_deref()
                                        .and_then(|s| humantime::parse_rfc3339(s).ok())
                                        .zip(secs)
                                        .and_then(|(t, s)| {
                                            rfc3339(t.checked_add(Duration::from_secs(s))?)
                                        });
                                    Action {
                                        id: format!("task-{i}-action-{j}"),
                                        name: text(a.get("name")).unwrap_or_default(),
                                        image: text(a.get("image")).unwrap_or_default(),
                                        timeout: a
                                            .get("timeout")
                                            .and_then(Value::as_i64)
                                            .unwrap_or(0),
                                        command: strs(a.get("command")),
                                        volumes: strs(a.get("volumes")),
                                        environment: env(a.get("environment")),
                                        pid: text(a.get("pid")),
                                        state: state(a.get("status")),
                                        execution_start: start,
                                        execution_stop: stop,
                                        execution_duration: secs.map(|s| format!("{s}s")),
                                        message: text(a.get("message")),
                                        ..Action::default()
                                    }
                                })
                                .collect()
                        })
                        .unwrap_or_default(),
                })
                .collect()
        })
        .unwrap_or_default();
    Some(Status {
        state: state(o.get("state")),
        agent_id: tasks.first().map(|t| t.agent_id.clone()),
        template_rendering: o
            .get("templateRending")
            .and_then(|r| serde_json::from_value::<TemplateRendering>(r.clone()).ok()),
        global_timeout: o.get("globalTimeout").and_then(Value::as_i64),
        boot_options: o
            .get("bootOptions")
            .and_then(|b| serde_json::from_value(b.clone()).ok()),
        conditions: o
            .get("conditions")
            .and_then(|c| serde_json::from_value(c.clone()).ok())
            .unwrap_or_default(),
        tasks,
        ..Status::default()
    })
}

/// A Workflow's status in the schema of the cluster's CRD.
pub fn status_to_cluster(s: &Status, schema: WorkflowSchema) -> Value {
    let current = serde_json::to_value(s).unwrap_or_else(|_| json!({}));
    if schema == WorkflowSchema::Current {
        return current;
    }
    let state = |st: State| match st {
        State::New => String::new(),
        other => format!("STATE_{}", other.as_str()),
    };
    let mut o = Map::new();
    o.insert("state".into(), json!(state(s.state)));
    if let Some(r) = s.template_rendering {
        o.insert("templateRending".into(), json!(r));
    }
    if let Some(t) = s.global_timeout {
        o.insert("globalTimeout".into(), json!(t));
    }
    if let Some(b) = &s.boot_options {
        o.insert("bootOptions".into(), json!(b));
    }
    if !s.conditions.is_empty() {
        o.insert("conditions".into(), json!(s.conditions));
    }
    if let Some(name) = s.current_state.as_ref().and_then(|c| c.action_name.clone()) {
        o.insert("currentAction".into(), json!(name));
    }
    let tasks: Vec<Value> = s
        .tasks
        .iter()
        .map(|t| {
            let actions: Vec<Value> = t
                .actions
                .iter()
                .map(|a| {
                    let mut m = json!({"name": a.name, "image": a.image, "timeout": a.timeout,
                        "status": state(a.state)});
                    let put = |m: &mut Value, k: &str, v: Value| m[k] = v;
                    if !a.command.is_empty() {
                        put(&mut m, "command", json!(a.command));
                    }
                    if !a.volumes.is_empty() {
                        put(&mut m, "volumes", json!(a.volumes));
                    }
                    if !a.environment.is_empty() {
                        put(&mut m, "environment", json!(a.environment));
                    }
                    if let Some(p) = &a.pid {
                        put(&mut m, "pid", json!(p));
                    }
                    if let Some(s) = &a.execution_start {
                        put(&mut m, "startedAt", json!(s));
                    }
                    if let Some(secs) = seconds_of(a) {
                        put(&mut m, "seconds", json!(secs));
                    }
                    if let Some(msg) = &a.message {
                        put(&mut m, "message", json!(msg));
                    }
                    m
                })
                .collect();
            let mut m = json!({"name": t.name, "worker": t.agent_id, "actions": actions});
            if !t.volumes.is_empty() {
                m["volumes"] = json!(t.volumes);
            }
            if !t.environment.is_empty() {
                m["environment"] = json!(t.environment);
            }
            m
        })
        .collect();
    if !tasks.is_empty() {
        o.insert("tasks".into(), Value::Array(tasks));
    }
    Value::Object(o)
}

/// Whole seconds an action ran: its duration ("12s", "1m3s"), else stop
/// minus start.
fn seconds_of(a: &Action) -> Option<u64> {
    if let Some(d) = a
        .execution_duration
        .as_deref()
        .and_then(|d| humantime::parse_duration(d).ok())
    {
        return Some(d.as_secs());
    }
    let t = |s: &Option<String>| humantime::parse_rfc3339(s.as_deref()?).ok();
    t(&a.execution_stop)?
        .duration_since(t(&a.execution_start)?)
        .ok()
        .map(|d| d.as_secs())
}

/// What Rufio's conditions say of a Job or Task: done (Completed or
/// Failed), or started by someone else (Running): never to be run again
/// here, so it is stored as failed with why.
pub fn job_state(status: &Value) -> Option<(JobState, Option<String>)> {
    let conditions = status.get("conditions")?.as_array()?;
    let is = |kind: &str| {
        conditions.iter().find(|c| {
            c.get("type").and_then(Value::as_str) == Some(kind)
                && c.get("status").and_then(Value::as_str) == Some("True")
        })
    };
    let message = |c: &Value| {
        c.get("message")
            .and_then(Value::as_str)
            .filter(|m| !m.is_empty())
            .map(String::from)
    };
    if let Some(c) = is("Failed") {
        return Some((JobState::Failed, message(c)));
    }
    if is("Completed").is_some() {
        return Some((JobState::Completed, None));
    }
    is("Running").map(|_| {
        (
            JobState::Failed,
            Some(
                "it was running under another controller when this one took over: not run again"
                    .into(),
            ),
        )
    })
}

/// A Job someone started and has not finished: Running, neither
/// Completed nor Failed.
pub fn job_running(status: &Value) -> bool {
    let is = |kind: &str| {
        status
            .get("conditions")
            .and_then(Value::as_array)
            .is_some_and(|cs| {
                cs.iter().any(|c| {
                    c.get("type").and_then(Value::as_str) == Some(kind)
                        && c.get("status").and_then(Value::as_str) == Some("True")
                })
            })
    };
    is("Running") && !is("Completed") && !is("Failed")
}

/// RFC 3339 to the second; None past year 9999, where humantime's
/// formatter fails (a time from the wire may be anything).
fn rfc3339(t: std::time::SystemTime) -> Option<String> {
    const YEAR_10000: Duration = Duration::from_secs(253_402_300_800);
    (t.duration_since(UNIX_EPOCH).ok()? < YEAR_10000)
        .then(|| humantime::format_rfc3339_seconds(t).to_string())
}

fn time(ms: i64) -> String {
    rfc3339(UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64)).unwrap_or_default()
}

/// Rufio's status of a Job or Task: Running, then Completed or Failed,
/// with start and completion times.
pub fn job_status(j: &JobRow) -> Value {
    let mut conditions = vec![];
    if j.state != JobState::Pending {
        conditions.push(json!({"type": "Running", "status": "True"}));
    }
    match j.state {
        JobState::Completed => conditions.push(json!({"type": "Completed", "status": "True"})),
        JobState::Failed => conditions.push(
            json!({"type": "Failed", "status": "True", "message": j.message.clone().unwrap_or_default()}),
        ),
        _ => {}
    }
    let mut s = json!({"conditions": conditions});
    if let Some(t) = j.started_ms {
        s["startTime"] = json!(time(t));
    }
    // Rufio's completionTime: "when the job completed successfully".
    if let (Some(t), JobState::Completed) = (j.completed_ms, j.state) {
        s["completionTime"] = json!(time(t));
    }
    s
}

/// The name Rufio gives a Job's n-th Task (`FormatTaskName`).
pub fn task_name(job: &str, n: usize) -> String {
    format!("{job}-task-{n}")
}

/// The Task Rufio's job controller creates for a Job's n-th action: owned
/// by the Job (deleted with it), with the action and the Machine's
/// connection. None: the cluster's Job has no uid to own it by.
pub fn task_object(job: &Value, n: usize, action: &Value, connection: &Value) -> Option<Value> {
    let name = job.pointer("/metadata/name")?.as_str()?;
    let uid = job.pointer("/metadata/uid")?.as_str()?;
    let namespace = job
        .pointer("/metadata/namespace")
        .cloned()
        .unwrap_or(json!("default"));
    Some(json!({
        "apiVersion": "bmc.tinkerbell.org/v1alpha1",
        "kind": "Task",
        "metadata": {
            "name": task_name(name, n),
            "namespace": namespace,
            "ownerReferences": [{
                "apiVersion": "bmc.tinkerbell.org/v1alpha1",
                "kind": "Job",
                "name": name,
                "uid": uid,
                "controller": true,
                "blockOwnerDeletion": true,
            }],
        },
        "spec": {"task": action, "connection": connection},
    }))
}

/// A Task that is one of a Job's steps (Rufio's job controller made it):
/// the Job runs it, not the Task itself.
pub fn owned_by_job(task: &Value) -> bool {
    task.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .is_some_and(|refs| {
            refs.iter().any(|r| {
                r.get("kind").and_then(Value::as_str) == Some("Job")
                    && r.get("apiVersion")
                        .and_then(Value::as_str)
                        .is_some_and(|v| v.starts_with("bmc.tinkerbell.org/"))
            })
        })
}

/// Rufio's status of a Job's Task: conditions Completed or Failed (Tasks
/// have no Running condition), startTime, completionTime on success only.
pub fn task_status(t: &TaskState) -> Value {
    let mut s = json!({});
    match t.state {
        JobState::Completed => s["conditions"] = json!([{"type": "Completed", "status": "True"}]),
        JobState::Failed => {
            s["conditions"] = json!([{"type": "Failed", "status": "True", "message": t.message.clone().unwrap_or_default()}]);
        }
        _ => {}
    }
    if let Some(ms) = t.started_ms {
        s["startTime"] = json!(time(ms));
    }
    if let (Some(ms), JobState::Completed) = (t.completed_ms, t.state) {
        s["completionTime"] = json!(time(ms));
    }
    s
}

/// Rufio's status of a Machine: powerState and the Contactable condition.
pub fn machine_status(m: &BmcMachineRow) -> Value {
    let mut s = json!({"powerState": m.power_state.as_str()});
    if let Some(c) = &m.contactable {
        s["conditions"] = json!([c]);
    }
    s
}

/// A JSON merge patch (RFC 7386) that turns `old` into `new`: changed keys
/// recursively, removed keys as null, arrays whole.
pub fn merge_patch(old: &Value, new: &Value) -> Option<Value> {
    match (old, new) {
        (Value::Object(a), Value::Object(b)) => {
            let mut p = Map::new();
            for (k, v) in b {
                match a.get(k) {
                    Some(o) if o == v => {}
                    Some(o) => {
                        if let Some(d) = merge_patch(o, v) {
                            p.insert(k.clone(), d);
                        }
                    }
                    None => {
                        p.insert(k.clone(), v.clone());
                    }
                }
            }
            for k in a.keys() {
                if !b.contains_key(k) {
                    p.insert(k.clone(), Value::Null);
                }
            }
            (!p.is_empty()).then_some(Value::Object(p))
        }
        (a, b) if a == b => None,
        (_, b) => Some(b.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::bmc::{JobKind, TaskState};

    #[test]
    fn a_v012_status_reads_as_the_current_schema_and_back() {
        let v012 = json!({
            "state": "STATE_RUNNING", "templateRending": "successful", "globalTimeout": 600,
            "currentAction": "b",
            "tasks": [{"name": "os", "worker": "02:00:00:00:00:01", "environment": {"A": "1"},
                "actions": [
                    {"name": "a", "image": "img/a", "timeout": 60, "status": "STATE_SUCCESS",
                     "startedAt": "2026-11-24T10:00:00Z", "seconds": 12},
                    {"name": "b", "image": "img/b", "timeout": 60, "status": "STATE_RUNNING",
                     "startedAt": "2026-11-24T10:00:12Z"}]}]});
        let s = status_from_cluster(&v012).unwrap();
        assert_eq!(s.state, State::Running);
        assert_eq!(s.agent_id.as_deref(), Some("02:00:00:00:00:01"));
        assert_eq!(s.template_rendering, Some(TemplateRendering::Successful));
        let a = &s.tasks[0].actions[0];
        assert_eq!(
            (a.state, a.id.as_str()),
            (State::Success, "task-0-action-0")
        );
        assert_eq!(a.execution_stop.as_deref(), Some("2026-11-24T10:00:12Z"));
        assert_eq!(a.execution_duration.as_deref(), Some("12s"));
        assert_eq!(s.tasks[0].actions[1].state, State::Running);
        let mut back = status_to_cluster(&s, WorkflowSchema::V012);
        // currentAction comes from currentState, which v0.12 lacks.
        back["currentAction"] = json!("b");
        assert_eq!(back, v012);
        // The current schema passes through as it is.
        let cur = status_to_cluster(&s, WorkflowSchema::Current);
        assert_eq!(cur["state"], "RUNNING");
        assert_eq!(cur["tasks"][0]["agentID"], "02:00:00:00:00:01");
        assert_eq!(status_from_cluster(&cur), Some(s));
        assert_eq!(status_from_cluster(&json!({})), None);
    }

    #[test]
    fn the_schema_is_read_from_the_installed_crd() {
        let crd = |field: &str| {
            json!({"spec": {"versions": [{"schema": {"openAPIV3Schema": {"properties": {"status":
                {"properties": {"tasks": {"items": {"properties": {field: {"type": "string"}}}}}}}}}}]}})
        };
        assert_eq!(WorkflowSchema::of_crd(&crd("worker")), WorkflowSchema::V012);
        assert_eq!(
            WorkflowSchema::of_crd(&crd("agentID")),
            WorkflowSchema::Current
        );
    }

    #[test]
    fn rufio_conditions_both_ways() {
        assert_eq!(job_state(&json!({})), None);
        assert!(job_running(
            &json!({"conditions": [{"type": "Running", "status": "True"}]})
        ));
        assert!(!job_running(
            &json!({"conditions": [{"type": "Running", "status": "True"},
            {"type": "Completed", "status": "True"}]})
        ));
        assert_eq!(
            job_state(
                &json!({"conditions": [{"type": "Running", "status": "True"},
                {"type": "Completed", "status": "True"}]})
            ),
            Some((JobState::Completed, None))
        );
        assert_eq!(
            job_state(
                &json!({"conditions": [{"type": "Failed", "status": "True", "message": "no"}]})
            ),
            Some((JobState::Failed, Some("no".into())))
        );
        let (s, m) =
            job_state(&json!({"conditions": [{"type": "Running", "status": "True"}]})).unwrap();
        assert_eq!(s, JobState::Failed);
        assert!(m.unwrap().contains("not run again"));
        let mut j = JobRow {
            id: 1,
            namespace: "ns".into(),
            name: "j".into(),
            kind: JobKind::Job,
            machine: None,
            connection: None,
            tasks: vec![],
            state: JobState::Pending,
            task_states: vec![TaskState::default(), TaskState::default()],
            message: None,
            created_ms: 0,
            started_ms: None,
            completed_ms: None,
        };
        assert_eq!(job_status(&j), json!({"conditions": []}));
        j.state = JobState::Failed;
        j.message = Some("bmc unreachable".into());
        j.started_ms = Some(1_795_000_000_000);
        j.completed_ms = Some(1_795_000_010_000);
        j.task_states[0].state = JobState::Failed;
        let s = job_status(&j);
        assert_eq!(s["conditions"][1]["type"], "Failed");
        assert_eq!(s["conditions"][1]["message"], "bmc unreachable");
        assert_eq!(s["startTime"], "2026-11-18T11:06:40Z");
        assert_eq!(job_state(&s).unwrap().0, JobState::Failed);
        assert!(s.get("completionTime").is_none(), "success only: {s}");
        j.state = JobState::Completed;
        assert_eq!(job_status(&j)["completionTime"], "2026-11-18T11:06:50Z");
    }

    /// A Job's steps as Rufio's job controller writes them: `<job>-task-<n>`
    /// owned by the Job, and Task status with no Running condition.
    #[test]
    fn a_jobs_tasks_are_rufios_objects() {
        let job = json!({"metadata": {"name": "netboot-w", "namespace": "ns", "uid": "u-1"}});
        let action = json!({"powerAction": "on"});
        let conn = json!({"host": "10.0.0.9"});
        let t = task_object(&job, 2, &action, &conn).unwrap();
        assert_eq!(t["metadata"]["name"], "netboot-w-task-2");
        assert_eq!(t["metadata"]["namespace"], "ns");
        assert_eq!(t["metadata"]["ownerReferences"][0]["uid"], "u-1");
        assert_eq!(t["spec"], json!({"task": action, "connection": conn}));
        assert!(owned_by_job(&t));
        assert!(!owned_by_job(&json!({"metadata": {"name": "x"}})));
        assert!(!owned_by_job(
            &json!({"metadata": {"ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job"}]}})
        ));
        // No uid: nothing to own it by.
        assert_eq!(
            task_object(&json!({"metadata": {"name": "j"}}), 0, &action, &conn),
            None
        );

        let mut ts = TaskState::default();
        assert_eq!(task_status(&ts), json!({}));
        ts.state = JobState::Running;
        ts.started_ms = Some(1_795_000_000_000);
        assert_eq!(
            task_status(&ts),
            json!({"startTime": "2026-11-18T11:06:40Z"})
        );
        ts.state = JobState::Failed;
        ts.message = Some("no answer".into());
        ts.completed_ms = Some(1_795_000_010_000);
        let s = task_status(&ts);
        assert_eq!(
            s["conditions"][0],
            json!({"type": "Failed", "status": "True", "message": "no answer"})
        );
        assert!(s.get("completionTime").is_none(), "success only: {s}");
        assert_eq!(job_state(&s).unwrap().0, JobState::Failed);
        ts.state = JobState::Completed;
        let s = task_status(&ts);
        assert_eq!(s["conditions"][0]["type"], "Completed");
        assert_eq!(s["completionTime"], "2026-11-18T11:06:50Z");
        assert_eq!(job_state(&s).unwrap().0, JobState::Completed);
    }

    /// Times from the wire that would overflow or pass year 9999 are
    /// dropped, not a panic of the watch.
    #[test]
    fn absurd_times_are_dropped() {
        let s = status_from_cluster(
            &json!({"state": "STATE_RUNNING", "tasks": [{"name": "t", "worker": "w",
            "actions": [{"name": "a", "image": "i", "status": "STATE_SUCCESS",
                "startedAt": "9999-12-31T23:59:59Z", "seconds": 1_000_000_000_000u64}]}]}),
        )
        .unwrap();
        assert_eq!(s.tasks[0].actions[0].execution_stop, None);
        assert_eq!(time(i64::MAX), "");
    }

    #[test]
    fn merge_patch_changes_removes_and_keeps() {
        let old = json!({"a": 1, "b": {"c": true, "d": 2}, "l": [1, 2]});
        let new = json!({"a": 1, "b": {"c": false}, "l": [1], "n": "x"});
        assert_eq!(
            merge_patch(&old, &new),
            Some(json!({"b": {"c": false, "d": null}, "l": [1], "n": "x"}))
        );
        assert_eq!(merge_patch(&old, &old), None);
    }
}
