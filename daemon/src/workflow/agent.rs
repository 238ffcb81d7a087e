//! tink-server's answers to the workers in the OSIE, as pure functions of
//! the stored Workflows: which action an agent runs next, and what a
//! report does to a Workflow's status. The gRPC shell ([`crate::grpc`])
//! turns these into messages and status codes; the codes and their
//! messages are upstream's, because real agents act on them (NotFound:
//! poll again later; FailedPrecondition: nothing to run yet).
//!
//! Two workers: tink-agent (the current API: the server picks the action,
//! reports carry the action id) and tink-worker v0.12 (the worker walks
//! the action list, reports carry task and action names).

use super::model::{Action, CurrentState, State, Status, Task};
use crate::hardware::Key;
use crate::store::workflow::WorkflowRow;

/// Why a request is refused, with the gRPC code upstream answers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    FailedPrecondition(String),
}

fn not_found(m: &str) -> Refusal {
    Refusal::NotFound(m.into())
}

/// The action served to an agent, and the Workflow's status with
/// `currentState` pointing at it.
#[derive(Debug, Clone)]
pub struct Served {
    pub workflow: Key,
    pub version: i64,
    pub task: Task,
    pub action: Action,
    pub status: Status,
    /// The Workflow's first action, not yet started: where upstream keeps
    /// the agent's attributes on the Hardware.
    pub first: bool,
    /// The Workflow's `hardwareRef`, in its namespace.
    pub hardware: Option<Key>,
}

/// `ns/name`, as upstream names a Workflow on the wire.
pub fn workflow_id(key: &Key) -> String {
    format!("{}/{}", key.namespace, key.name)
}

pub fn parse_workflow_id(id: &str) -> Option<Key> {
    let (ns, name) = id.split_once('/')?;
    (!ns.is_empty() && !name.is_empty()).then(|| Key::new(ns, name))
}

/// The longest agent id taken: a MAC, or a `spec.agentID` (a Kubernetes
/// name is at most 253 characters).
pub const AGENT_ID_MAX: usize = 253;

/// An agent id as a real agent sends one: not empty, at most
/// [`AGENT_ID_MAX`] bytes of printable ASCII without spaces. Anything else
/// is refused before it is looked up or remembered.
pub fn check_agent_id(agent: &str) -> Result<(), Refusal> {
    if agent.is_empty() {
        return Err(Refusal::InvalidArgument("invalid Agent ID".into()));
    }
    if agent.len() > AGENT_ID_MAX || !agent.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Refusal::InvalidArgument(format!(
            "invalid Agent ID: at most {AGENT_ID_MAX} printable ASCII characters, no spaces"
        )));
    }
    Ok(())
}

/// GetAction: `rows` are the agent's Workflows (status.agentID), oldest
/// first. Upstream lets the first Workflow with tasks decide, so a
/// finished Workflow listed first hides a newer pending one; here the
/// first PENDING or RUNNING one is served, and only when there is none
/// does a PREPARING or finished one give FailedPrecondition.
pub fn next_action(agent: &str, rows: &[WorkflowRow]) -> Result<Served, Refusal> {
    check_agent_id(agent)?;
    if rows.is_empty() {
        return Err(not_found("no Workflows found"));
    }
    let with_tasks = || rows.iter().filter(|r| !r.status.tasks.is_empty());
    let Some(row) =
        with_tasks().find(|r| matches!(r.status.state, State::Pending | State::Running))
    else {
        return Err(match with_tasks().next() {
            None => not_found("no Tasks found in Workflow"),
            Some(r) if r.status.state == State::Preparing => {
                Refusal::FailedPrecondition("Workflow is in preparing state".into())
            }
            Some(_) => {
                Refusal::FailedPrecondition("Workflow not in pending or running state".into())
            }
        });
    };
    let tasks = &row.status.tasks;
    let first_pending = |t: &Task| t.actions.first().is_some_and(|a| a.state == State::Pending);
    let task = if first_pending(&tasks[0]) {
        &tasks[0]
    } else {
        tasks
            .iter()
            .find(|t| t.actions.last().is_some_and(|a| a.state != State::Success))
            .ok_or_else(|| not_found("no Tasks found"))?
    };
    if task.actions.is_empty() {
        return Err(not_found("no Actions found"));
    }
    let current = row.status.current_state.as_ref();
    let action = if first_pending(task) {
        &task.actions[0]
    } else if let Some(c) =
        current.filter(|c| matches!(c.state, Some(State::Running | State::Pending)))
    {
        task.actions
            .iter()
            .find(|a| Some(&a.id) == c.action_id.as_ref())
            .ok_or_else(|| not_found("in-progress Action not found in task"))?
    } else {
        let c = current
            .ok_or_else(|| Refusal::FailedPrecondition("no current state available".into()))?;
        if c.state != Some(State::Success) {
            return Err(Refusal::FailedPrecondition(
                "current Action not in success state".into(),
            ));
        }
        let at = task
            .actions
            .iter()
            .position(|a| Some(&a.id) == c.action_id.as_ref())
            // The current action was in an earlier task: this task starts.
            .map_or(Some(0), |i| (i + 1 < task.actions.len()).then_some(i + 1))
            .ok_or_else(|| not_found("last Action in task"))?;
        &task.actions[at]
    };
    if task.agent_id != agent {
        return Err(not_found("Task not assigned to Agent"));
    }
    let mut status = row.status.clone();
    status.current_state = Some(CurrentState {
        agent_id: Some(agent.into()),
        task_id: Some(task.id.clone()),
        action_id: Some(action.id.clone()),
        state: Some(action.state),
        action_name: Some(action.name.clone()),
        task_name: Some(task.name.clone()),
    });
    let first = std::ptr::eq(task, &tasks[0]) && first_pending(task);
    let hardware = row
        .doc
        .pointer("/spec/hardwareRef")
        .and_then(serde_json::Value::as_str)
        .filter(|h| !h.is_empty())
        .map(|h| Key::new(row.key.namespace.clone(), h));
    Ok(Served {
        workflow: row.key.clone(),
        version: row.version,
        task: task.clone(),
        action: action.clone(),
        status,
        first,
        hardware,
    })
}

/// A tink-agent report, as given on the wire (times already RFC 3339).
#[derive(Debug, Clone, Default)]
pub struct AgentReport {
    pub workflow_id: String,
    pub agent_id: String,
    pub task_id: String,
    pub action_id: String,
    pub action_name: String,
    pub state: State,
    pub execution_start: Option<String>,
    pub execution_stop: Option<String>,
    pub execution_duration: Option<String>,
    pub message: Option<String>,
}

/// The checks upstream makes before it reads the Workflow.
pub fn check_agent_report(r: &AgentReport) -> Result<Key, Refusal> {
    if r.workflow_id.is_empty() {
        return Err(Refusal::InvalidArgument("invalid workflow id".into()));
    }
    if r.task_id.is_empty() {
        return Err(Refusal::InvalidArgument("invalid task name".into()));
    }
    if r.action_id.is_empty() {
        return Err(Refusal::InvalidArgument("invalid action name".into()));
    }
    if !r.agent_id.is_empty() {
        check_agent_id(&r.agent_id)?;
    }
    parse_workflow_id(&r.workflow_id)
        .ok_or_else(|| Refusal::InvalidArgument("invalid workflow id".into()))
}

/// What a tink-agent report does: the action takes the reported state,
/// times and message; a state other than SUCCESS becomes the Workflow's
/// (RUNNING, FAILED, TIMEOUT); SUCCESS of the last action of the last
/// task moves it to POST. A report for a Workflow already finished
/// changes nothing (upstream would overwrite a final state).
pub fn apply_agent_report(status: &Status, r: &AgentReport) -> Result<Status, Refusal> {
    let mut s = status.clone();
    let n_tasks = s.tasks.len();
    let (ti, ai) = s
        .tasks
        .iter()
        .enumerate()
        .find_map(|(ti, t)| {
            (t.agent_id == r.agent_id)
                .then(|| {
                    t.actions
                        .iter()
                        .position(|a| a.id == r.action_id)
                        .map(|ai| (ti, ai))
                })
                .flatten()
        })
        .ok_or_else(|| not_found("action not found"))?;
    if s.state.is_final() {
        return Err(Refusal::FailedPrecondition(format!(
            "Workflow already finished ({})",
            s.state.as_str()
        )));
    }
    let task = &mut s.tasks[ti];
    let last = ti + 1 == n_tasks && ai + 1 == task.actions.len();
    let a = &mut task.actions[ai];
    a.state = r.state;
    a.execution_start = r.execution_start.clone().or(a.execution_start.take());
    a.execution_stop = r.execution_stop.clone();
    a.execution_duration = r.execution_duration.clone();
    a.message = r.message.clone();
    let task_name = task.name.clone();
    if r.state != State::Success {
        s.state = r.state;
    } else if last {
        s.state = State::Post;
    }
    s.current_state = Some(CurrentState {
        agent_id: Some(r.agent_id.clone()),
        task_id: Some(r.task_id.clone()),
        action_id: Some(r.action_id.clone()),
        state: Some(r.state),
        action_name: Some(r.action_name.clone()),
        task_name: Some(task_name),
    });
    Ok(s)
}

/// Where a Workflow stands for tink-worker v0.12: the first action not yet
/// successful, its task, and how many actions succeeded before it.
#[derive(Debug, Clone, PartialEq)]
pub struct Position {
    pub task: usize,
    pub action: usize,
    /// Successful actions before it, across tasks.
    pub index: usize,
    pub total: usize,
}

pub fn position(status: &Status) -> Option<Position> {
    let total = status.tasks.iter().map(|t| t.actions.len()).sum();
    let mut index = 0;
    for (ti, t) in status.tasks.iter().enumerate() {
        for (ai, a) in t.actions.iter().enumerate() {
            if a.state == State::Success {
                index += 1;
            } else {
                return Some(Position {
                    task: ti,
                    action: ai,
                    index,
                    total,
                });
            }
        }
    }
    None
}

/// A tink-worker v0.12 report.
#[derive(Debug, Clone, Default)]
pub struct WorkerReport {
    pub workflow_id: String,
    pub task_name: String,
    pub action_name: String,
    pub state: State,
}

/// What a tink-worker report does (tink v0.12's rules): it must name the
/// current task and action; RUNNING starts the action (server clock),
/// FAILED or TIMEOUT end the Workflow in that state, SUCCESS of the last
/// action moves it to POST; PENDING is refused.
pub fn apply_worker_report(
    status: &Status,
    r: &WorkerReport,
    now: &str,
    now_ms: i64,
) -> Result<Status, Refusal> {
    if r.workflow_id.is_empty() {
        return Err(Refusal::InvalidArgument("invalid workflow id".into()));
    }
    if r.task_name.is_empty() {
        return Err(Refusal::InvalidArgument("invalid task name".into()));
    }
    if r.action_name.is_empty() {
        return Err(Refusal::InvalidArgument("invalid action name".into()));
    }
    let mismatch = |what: &str| {
        Refusal::InvalidArgument(format!(
            "reported {what} name does not match the current action details"
        ))
    };
    let p = position(status).ok_or_else(|| mismatch("task"))?;
    let mut s = status.clone();
    let total = p.total;
    let task = &mut s.tasks[p.task];
    if task.name != r.task_name {
        return Err(mismatch("task"));
    }
    let a = &mut task.actions[p.action];
    if a.name != r.action_name {
        return Err(mismatch("action"));
    }
    match r.state {
        State::Running => {
            a.execution_start = Some(now.into());
            s.state = State::Running;
        }
        State::Failed | State::Timeout | State::Success => {
            a.execution_stop = Some(now.into());
            if let Some(start) = a
                .execution_start
                .as_deref()
                .and_then(|t| humantime::parse_rfc3339(t).ok())
            {
                let start_ms = start
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as i64);
                a.execution_duration = Some(format!("{}s", (now_ms - start_ms).max(0) / 1000));
            }
            if r.state != State::Success {
                s.state = r.state;
            } else if p.index + 1 == total {
                s.state = State::Post;
            }
        }
        _ => return Err(Refusal::InvalidArgument("invalid workflow id".into())),
    }
    a.state = r.state;
    let (task_id, task_name, action_id, action_name) = (
        task.id.clone(),
        task.name.clone(),
        a.id.clone(),
        a.name.clone(),
    );
    s.current_state = Some(CurrentState {
        agent_id: Some(task.agent_id.clone()),
        task_id: Some(task_id),
        action_id: Some(action_id),
        state: Some(r.state),
        action_name: Some(action_name),
        task_name: Some(task_name),
    });
    Ok(s)
}

/// A task's environment merged with its action's (the action wins), as
/// sorted `K=V`, and their volumes, task first: what a worker is given.
pub fn environment(task: &Task, action: &Action) -> Vec<String> {
    let mut env = task.environment.clone();
    env.extend(action.environment.clone());
    env.into_iter().map(|(k, v)| format!("{k}={v}")).collect()
}

pub fn volumes(task: &Task, action: &Action) -> Vec<String> {
    task.volumes
        .iter()
        .chain(&action.volumes)
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workflow::template;

    const DOC: &str = "name: t\nglobal_timeout: 60\ntasks:\n- name: a\n  worker: w1\n  environment: {A: '1', B: t}\n  volumes: [/dev:/dev]\n  actions:\n  - {name: x, image: bash, environment: {B: a}}\n  - {name: y, image: bash}\n- name: b\n  worker: w2\n  actions:\n  - {name: z, image: bash}\n";

    fn row(state: State) -> WorkflowRow {
        let mut status = Status::rendered(&template::parse(DOC).unwrap());
        status.state = state;
        WorkflowRow {
            key: Key::new("default", "wf"),
            doc: serde_json::json!({}),
            status,
            version: 1,
        }
    }

    #[test]
    fn agent_ids_are_bounded() {
        check_agent_id("52:54:00:99:01:01").unwrap();
        check_agent_id(&"a".repeat(AGENT_ID_MAX)).unwrap();
        for bad in ["", "a b", "x\u{0}", "é", &"a".repeat(AGENT_ID_MAX + 1)] {
            assert!(
                matches!(check_agent_id(bad), Err(Refusal::InvalidArgument(_))),
                "{bad:?}"
            );
        }
        assert!(next_action(&"a".repeat(1 << 20), &[row(State::Pending)]).is_err());
    }

    fn report(served: &Served, state: State) -> AgentReport {
        AgentReport {
            workflow_id: workflow_id(&served.workflow),
            agent_id: served.task.agent_id.clone(),
            task_id: served.task.id.clone(),
            action_id: served.action.id.clone(),
            action_name: served.action.name.clone(),
            state,
            execution_start: Some("2026-11-24T00:00:00Z".into()),
            ..AgentReport::default()
        }
    }

    /// Two tasks for two agents, action by action, to POST.
    #[test]
    fn a_whole_workflow_through_the_agent_api() {
        let mut r = row(State::Pending);
        // w2's task is not first: it waits (NotFound, as upstream).
        assert_eq!(
            next_action("w2", std::slice::from_ref(&r)).unwrap_err(),
            not_found("Task not assigned to Agent")
        );
        for (agent, name) in [("w1", "x"), ("w1", "y"), ("w2", "z")] {
            let s = next_action(agent, std::slice::from_ref(&r)).unwrap();
            assert_eq!(s.action.name, name);
            assert_eq!(
                s.status
                    .current_state
                    .as_ref()
                    .unwrap()
                    .action_name
                    .as_deref(),
                Some(name)
            );
            // Served again while it runs: the same action.
            r.status = apply_agent_report(&s.status, &report(&s, State::Running)).unwrap();
            assert_eq!(r.status.state, State::Running);
            assert_eq!(
                next_action(agent, std::slice::from_ref(&r))
                    .unwrap()
                    .action
                    .id,
                s.action.id
            );
            r.status = apply_agent_report(&r.status, &report(&s, State::Success)).unwrap();
            if name == "y" {
                // w1 is done: the next is w2's.
                assert_eq!(
                    next_action("w1", std::slice::from_ref(&r)).unwrap_err(),
                    not_found("Task not assigned to Agent")
                );
            }
        }
        assert_eq!(r.status.state, State::Post);
        assert_eq!(
            next_action("w1", std::slice::from_ref(&r)).unwrap_err(),
            Refusal::FailedPrecondition("Workflow not in pending or running state".into())
        );
        let t = &r.status.tasks[0];
        assert_eq!(environment(t, &t.actions[0]), ["A=1", "B=a"]);
        assert_eq!(volumes(t, &t.actions[0]), ["/dev:/dev"]);
    }

    #[test]
    fn a_failed_action_fails_the_workflow_and_refusals_are_upstream_s() {
        let mut r = row(State::Pending);
        let s = next_action("w1", std::slice::from_ref(&r)).unwrap();
        let mut f = report(&s, State::Failed);
        f.message = Some("exit 1".into());
        r.status = apply_agent_report(&s.status, &f).unwrap();
        assert_eq!(r.status.state, State::Failed);
        assert_eq!(
            r.status.tasks[0].actions[0].message.as_deref(),
            Some("exit 1")
        );
        assert!(matches!(
            apply_agent_report(&r.status, &f),
            Err(Refusal::FailedPrecondition(_))
        ));
        assert_eq!(
            next_action("", &[]).unwrap_err(),
            Refusal::InvalidArgument("invalid Agent ID".into())
        );
        assert_eq!(
            next_action("w1", &[]).unwrap_err(),
            not_found("no Workflows found")
        );
        assert_eq!(
            next_action("w1", &[row(State::Preparing)]).unwrap_err(),
            Refusal::FailedPrecondition("Workflow is in preparing state".into())
        );
        // A finished Workflow does not hide a newer pending one.
        let s = next_action("w1", &[row(State::Success), row(State::Pending)]).unwrap();
        assert_eq!(s.action.name, "x");
        let mut bad = report(&s, State::Running);
        bad.action_id = "nope".into();
        assert_eq!(
            apply_agent_report(&s.status, &bad).unwrap_err(),
            not_found("action not found")
        );
        bad.action_id.clear();
        assert_eq!(
            check_agent_report(&bad).unwrap_err(),
            Refusal::InvalidArgument("invalid action name".into())
        );
    }

    #[test]
    fn the_v0_12_worker_walks_by_names() {
        let mut st = row(State::Pending).status;
        let rep = |task: &str, action: &str, state| WorkerReport {
            workflow_id: "default/wf".into(),
            task_name: task.into(),
            action_name: action.into(),
            state,
        };
        assert_eq!(
            position(&st).unwrap(),
            Position {
                task: 0,
                action: 0,
                index: 0,
                total: 3
            }
        );
        let e = apply_worker_report(&st, &rep("a", "y", State::Running), "t", 0).unwrap_err();
        assert!(
            matches!(e, Refusal::InvalidArgument(m) if m.contains("action name does not match"))
        );
        st = apply_worker_report(
            &st,
            &rep("a", "x", State::Running),
            "2026-11-24T00:00:00Z",
            0,
        )
        .unwrap();
        assert_eq!(st.state, State::Running);
        let t0 = humantime::parse_rfc3339("2026-11-24T00:00:00Z").unwrap();
        let ms = t0
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64
            + 7_000;
        st = apply_worker_report(
            &st,
            &rep("a", "x", State::Success),
            "2026-11-24T00:00:07Z",
            ms,
        )
        .unwrap();
        assert_eq!(
            st.tasks[0].actions[0].execution_duration.as_deref(),
            Some("7s")
        );
        assert_eq!(position(&st).unwrap().index, 1);
        st = apply_worker_report(&st, &rep("a", "y", State::Success), "t", 0).unwrap();
        st = apply_worker_report(&st, &rep("b", "z", State::Success), "t", 0).unwrap();
        assert_eq!(st.state, State::Post);
        assert!(position(&st).is_none());
    }
}
