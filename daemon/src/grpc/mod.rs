//! Tink's gRPC API on `[tink] listen` (42113): `proto.WorkflowService` for
//! both workers in the OSIE, tink-agent (GetAction, ReportActionStatus)
//! and tink-worker v0.12 (GetWorkflowContexts, GetWorkflowActions,
//! ReportActionStatus), one tonic service with the four methods; the
//! shared ReportActionStatus path is told apart in [`report`]. The
//! decisions are [`crate::workflow::agent`]'s; this is the thin shell.

pub mod forward;
pub mod report;

/// Generated from `proto/workflow.proto` (build.rs).
#[allow(clippy::all, clippy::pedantic)]
pub mod pb {
    tonic::include_proto!("proto");
}

use crate::app::App;
use crate::services::WorkerError;
use crate::workflow::agent::{self, AgentReport, Refusal, WorkerReport};
use crate::workflow::engine::rfc3339;
use crate::workflow::model::{State, Status};
use pb::action_status_request::StateType;
use pb::workflow_service_server::{WorkflowService, WorkflowServiceServer};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tonic::{Request, Response, Status as Code};

pub struct Server {
    app: Arc<App>,
}

pub fn service(app: Arc<App>) -> WorkflowServiceServer<Server> {
    WorkflowServiceServer::new(Server { app })
        // Reports and requests are small; a 4 MiB message is an attack.
        .max_decoding_message_size(1 << 20)
}

impl From<WorkerError> for Code {
    fn from(e: WorkerError) -> Code {
        match e {
            WorkerError::Refused(Refusal::InvalidArgument(m)) => Code::invalid_argument(m),
            WorkerError::Refused(Refusal::NotFound(m)) => Code::not_found(m),
            WorkerError::Refused(Refusal::FailedPrecondition(m)) => Code::failed_precondition(m),
            WorkerError::Busy => Code::aborted(e.to_string()),
            WorkerError::Unavailable(_) => Code::unavailable(e.to_string()),
            WorkerError::Store(s) => {
                tracing::error!(error = %s, "tink gRPC: store error");
                Code::internal(format!("error reading from backend: {s}"))
            }
        }
    }
}

fn timestamp(t: Option<prost_types::Timestamp>) -> Option<String> {
    let t = t?;
    // The agent's RUNNING report carries Go's zero time (year 1): no time.
    let secs = u64::try_from(t.seconds).ok()?;
    let nanos = u32::try_from(t.nanos).unwrap_or(0);
    let at = SystemTime::UNIX_EPOCH.checked_add(Duration::new(secs, nanos))?;
    Some(rfc3339(at))
}

fn agent_state(s: i32) -> State {
    match StateType::try_from(s) {
        Ok(StateType::Pending) => State::Pending,
        Ok(StateType::Running) => State::Running,
        Ok(StateType::Failed) => State::Failed,
        Ok(StateType::Timeout) => State::Timeout,
        Ok(StateType::Success) => State::Success,
        _ => State::New,
    }
}

fn worker_state(s: i32) -> State {
    match pb::State::try_from(s) {
        Ok(pb::State::Pending) => State::Pending,
        Ok(pb::State::Running) => State::Running,
        Ok(pb::State::Failed) => State::Failed,
        Ok(pb::State::Timeout) => State::Timeout,
        Ok(pb::State::Success) => State::Success,
        Err(_) => State::New,
    }
}

fn to_worker_state(s: State) -> pb::State {
    match s {
        State::Running => pb::State::Running,
        State::Failed => pb::State::Failed,
        State::Timeout => pb::State::Timeout,
        State::Success => pb::State::Success,
        _ => pb::State::Pending,
    }
}

pub use crate::discovery::hardware::{ATTRIBUTES_ANNOTATION, ATTRIBUTES_MAX};

impl Server {
    /// The attributes the agent sent with its first GetAction of a
    /// Workflow, kept once on the Workflow's Hardware as upstream keeps
    /// them. Failures are logged; they never fail the request.
    async fn keep_attributes(&self, hw: &crate::hardware::Key, attrs: &pb::AgentAttributes) {
        let json = attributes_json(attrs).to_string();
        if json.len() > ATTRIBUTES_MAX {
            tracing::warn!(hardware = %hw, bytes = json.len(), "agent attributes over 64 KiB: not kept");
            return;
        }
        if let Err(e) = self
            .app
            .services
            .hardware
            .annotate_once(hw, ATTRIBUTES_ANNOTATION, &json)
            .await
        {
            tracing::warn!(hardware = %hw, error = %e, "agent attributes not kept");
        }
    }
}

/// Upstream's JSON shape of the attributes (pkg/data AgentAttributes):
/// camelCase, unset fields left out.
pub fn attributes_json(a: &pb::AgentAttributes) -> serde_json::Value {
    use serde_json::{Map, Value, json};
    fn put<T: Into<Value>>(m: &mut Map<String, Value>, k: &str, v: Option<T>) {
        if let Some(v) = v {
            m.insert(k.into(), v.into());
        }
    }
    fn list(v: &[String]) -> Option<Value> {
        (!v.is_empty()).then(|| json!(v))
    }
    let mut out = Map::new();
    if let Some(c) = &a.cpu {
        let mut m = Map::new();
        put(&mut m, "totalCores", c.total_cores);
        put(&mut m, "totalThreads", c.total_threads);
        let procs: Vec<Value> = c
            .processors
            .iter()
            .map(|p| {
                let mut m = Map::new();
                put(&mut m, "id", p.id);
                put(&mut m, "cores", p.cores);
                put(&mut m, "threads", p.threads);
                put(&mut m, "vendor", p.vendor.clone());
                put(&mut m, "model", p.model.clone());
                put(&mut m, "capabilities", list(&p.capabilities));
                Value::Object(m)
            })
            .collect();
        if !procs.is_empty() {
            m.insert("processors".into(), Value::Array(procs));
        }
        out.insert("cpu".into(), Value::Object(m));
    }
    if let Some(mem) = &a.memory {
        let mut m = Map::new();
        put(&mut m, "total", mem.total.clone());
        put(&mut m, "usable", mem.usable.clone());
        out.insert("memory".into(), Value::Object(m));
    }
    let blocks: Vec<Value> = a
        .block
        .iter()
        .map(|b| {
            let mut m = Map::new();
            put(&mut m, "name", b.name.clone());
            put(&mut m, "controllerType", b.controller_type.clone());
            put(&mut m, "driveType", b.drive_type.clone());
            put(&mut m, "size", b.size.clone());
            put(&mut m, "physicalBlockSize", b.physical_block_size.clone());
            put(&mut m, "vendor", b.vendor.clone());
            put(&mut m, "model", b.model.clone());
            put(&mut m, "wwn", b.wwn.clone());
            put(&mut m, "serialNumber", b.serial_number.clone());
            Value::Object(m)
        })
        .collect();
    if !blocks.is_empty() {
        out.insert("blockDevices".into(), Value::Array(blocks));
    }
    let nics: Vec<Value> = a
        .network
        .iter()
        .map(|n| {
            let mut m = Map::new();
            put(&mut m, "name", n.name.clone());
            put(&mut m, "mac", n.mac.clone());
            put(&mut m, "speed", n.speed.clone());
            put(&mut m, "enabledCapabilities", list(&n.enabled_capabilities));
            Value::Object(m)
        })
        .collect();
    if !nics.is_empty() {
        out.insert("networkInterfaces".into(), Value::Array(nics));
    }
    let device = |vendor: &Option<String>,
                  product: &Option<String>,
                  class: &Option<String>,
                  driver: &Option<String>| {
        let mut m = Map::new();
        put(&mut m, "vendor", vendor.clone());
        put(&mut m, "product", product.clone());
        put(&mut m, "class", class.clone());
        put(&mut m, "driver", driver.clone());
        Value::Object(m)
    };
    let pci: Vec<Value> = a
        .pci
        .iter()
        .map(|p| device(&p.vendor, &p.product, &p.class, &p.driver))
        .collect();
    if !pci.is_empty() {
        out.insert("pciDevices".into(), Value::Array(pci));
    }
    let gpu: Vec<Value> = a
        .gpu
        .iter()
        .map(|p| device(&p.vendor, &p.product, &p.class, &p.driver))
        .collect();
    if !gpu.is_empty() {
        out.insert("gpuDevices".into(), Value::Array(gpu));
    }
    if let Some(c) = &a.chassis {
        out.insert(
            "chassis".into(),
            json!({"serial": c.serial, "vendor": c.vendor}),
        );
    }
    if let Some(b) = &a.bios {
        out.insert(
            "bios".into(),
            json!({"vendor": b.vendor, "version": b.version, "releaseDate": b.release_date}),
        );
    }
    if let Some(b) = &a.baseboard {
        out.insert(
            "baseboard".into(),
            json!({"vendor": b.vendor, "product": b.product, "version": b.version, "serialNumber": b.serial_number}),
        );
    }
    if let Some(p) = &a.product {
        out.insert(
            "product".into(),
            json!({"name": p.name, "vendor": p.vendor, "serialNumber": p.serial_number}),
        );
    }
    // Unset members of the small structs are dropped, as omitempty does.
    for v in out.values_mut() {
        if let Value::Object(m) = v {
            m.retain(|_, x| !x.is_null());
        }
    }
    Value::Object(out)
}

#[tonic::async_trait]
impl WorkflowService for Server {
    async fn get_action(
        &self,
        req: Request<pb::ActionRequest>,
    ) -> Result<Response<pb::ActionResponse>, Code> {
        let req = req.into_inner();
        let agent = req.agent_id.unwrap_or_default();
        let s = self
            .app
            .services
            .get_action(&agent, || {
                req.agent_attributes.as_ref().map(attributes_json)
            })
            .await?;
        if let (true, Some(hw), Some(attrs)) = (s.first, &s.hardware, &req.agent_attributes) {
            self.keep_attributes(hw, attrs).await;
        }
        let (task, action) = (&s.task, &s.action);
        Ok(Response::new(pb::ActionResponse {
            workflow_id: Some(agent::workflow_id(&s.workflow)),
            task_id: Some(task.id.clone()),
            agent_id: Some(agent),
            action_id: Some(action.id.clone()),
            name: Some(action.name.clone()),
            image: Some(action.image.clone()),
            timeout: Some(action.timeout),
            command: action.command.clone(),
            volumes: agent::volumes(task, action),
            environment: agent::environment(task, action),
            pid: action.pid.clone(),
            namespaces: action.namespaces.as_ref().map(|n| pb::Namespaces {
                network: Some(n.network.clone()).filter(|s| !s.is_empty()),
                pid: Some(n.pid.clone()).filter(|s| !s.is_empty()),
            }),
        }))
    }

    async fn report_action_status(
        &self,
        req: Request<report::Report>,
    ) -> Result<Response<pb::ReportResponse>, Code> {
        let wf = &self.app.services.workflow;
        match req.into_inner() {
            report::Report::Agent(r) => {
                let r = AgentReport {
                    workflow_id: r.workflow_id.unwrap_or_default(),
                    agent_id: r.agent_id.unwrap_or_default(),
                    task_id: r.task_id.unwrap_or_default(),
                    action_id: r.action_id.unwrap_or_default(),
                    action_name: r.action_name.unwrap_or_default(),
                    state: agent_state(r.action_state.unwrap_or_default()),
                    execution_start: timestamp(r.execution_start),
                    execution_stop: timestamp(r.execution_stop),
                    execution_duration: r.execution_duration.filter(|d| !d.is_empty()),
                    message: r.message.and_then(|m| m.message).filter(|m| !m.is_empty()),
                };
                let key = agent::check_agent_report(&r).map_err(WorkerError::from)?;
                wf.report(&key, |s: &Status| agent::apply_agent_report(s, &r))
                    .await?;
            }
            report::Report::Worker(r) => {
                let r = WorkerReport {
                    workflow_id: r.workflow_id,
                    task_name: r.task_name,
                    action_name: r.action_name,
                    state: worker_state(r.action_status),
                };
                let key = agent::parse_workflow_id(&r.workflow_id)
                    .ok_or_else(|| Code::invalid_argument("invalid workflow id"))?;
                let now = SystemTime::now();
                let now_ms = crate::clock::now_ms();
                wf.report(&key, |s: &Status| {
                    agent::apply_worker_report(s, &r, &rfc3339(now), now_ms)
                })
                .await?;
            }
        }
        Ok(Response::new(pb::ReportResponse {}))
    }

    type GetWorkflowContextsStream =
        tokio_stream::Iter<std::vec::IntoIter<Result<pb::WorkflowContext, Code>>>;

    /// Every PENDING or RUNNING Workflow whose current task is this
    /// worker's, then the end of the stream (tink v0.12 did not long-poll).
    async fn get_workflow_contexts(
        &self,
        req: Request<pb::WorkflowContextRequest>,
    ) -> Result<Response<Self::GetWorkflowContextsStream>, Code> {
        let worker = req.into_inner().worker_id;
        if worker.is_empty() {
            return Err(Code::invalid_argument("invalid workflow id"));
        }
        let rows = self
            .app
            .store
            .workflows(None, &[State::Pending, State::Running])
            .await
            .map_err(WorkerError::from)?;
        let contexts: Vec<Result<pb::WorkflowContext, Code>> = rows
            .iter()
            .filter_map(|r| {
                let p = agent::position(&r.status)?;
                let task = &r.status.tasks[p.task];
                (task.agent_id == worker).then(|| {
                    Ok(pb::WorkflowContext {
                        workflow_id: agent::workflow_id(&r.key),
                        current_worker: task.agent_id.clone(),
                        current_task: task.name.clone(),
                        current_action: task.actions[p.action].name.clone(),
                        current_action_index: p.index as i64,
                        current_action_state: to_worker_state(task.actions[p.action].state) as i32,
                        total_number_of_actions: p.total as i64,
                    })
                })
            })
            .collect();
        Ok(Response::new(tokio_stream::iter(contexts)))
    }

    async fn get_workflow_actions(
        &self,
        req: Request<pb::WorkflowActionsRequest>,
    ) -> Result<Response<pb::WorkflowActionList>, Code> {
        let id = req.into_inner().workflow_id;
        let key = agent::parse_workflow_id(&id)
            .ok_or_else(|| Code::invalid_argument("invalid workflow id"))?;
        let row = self
            .app
            .store
            .workflow(&key)
            .await
            .map_err(WorkerError::from)?
            .ok_or_else(|| Code::invalid_argument("invalid workflow id"))?;
        let action_list = row
            .status
            .tasks
            .iter()
            .flat_map(|t| {
                t.actions.iter().map(move |a| pb::WorkflowAction {
                    task_name: t.name.clone(),
                    name: a.name.clone(),
                    image: a.image.clone(),
                    timeout: a.timeout,
                    command: a.command.clone(),
                    on_timeout: vec![],
                    on_failure: vec![],
                    worker_id: t.agent_id.clone(),
                    volumes: agent::volumes(t, a),
                    environment: agent::environment(t, a),
                    pid: a.pid.clone().unwrap_or_default(),
                })
            })
            .collect();
        Ok(Response::new(pb::WorkflowActionList { action_list }))
    }
}
