//! A scripted API server for unit tests: kube's mock client (a
//! `tower_test` service pair) answering each request with the next step,
//! for the answers a live server gives only by accident (conflicts, 410
//! Gone, a watch that errors).

use ::http::{Method, Request, Response};
use kube::client::Body;
use serde_json::Value;
use std::sync::{Arc, Mutex};

/// One expected request and its answer.
pub struct Step {
    pub method: Method,
    /// A substring of the path and query the request must have.
    pub path: &'static str,
    pub status: u16,
    /// The response body: JSON, or lines of watch events.
    pub body: String,
}

impl Step {
    pub fn json(method: Method, path: &'static str, status: u16, body: &Value) -> Step {
        Step {
            method,
            path,
            status,
            body: body.to_string(),
        }
    }

    /// A watch answered with these events, then the stream's end.
    pub fn watch(path: &'static str, events: &[Value]) -> Step {
        Step {
            method: Method::GET,
            path,
            status: 200,
            body: events.iter().map(|e| format!("{e}\n")).collect(),
        }
    }
}

/// A request as it came: method, path and query, JSON body (Null if none).
pub type Seen = (Method, String, Value);

/// What the scripted server was asked, and the first request that was
/// not the step's.
#[derive(Clone, Default)]
pub struct Recorder(Arc<Mutex<(Vec<Seen>, Option<String>)>>);

impl Recorder {
    /// The requests so far; fails the test if one was not as scripted.
    pub fn seen(&self) -> Vec<Seen> {
        let g = self.0.lock().unwrap();
        assert!(g.1.is_none(), "{}", g.1.clone().unwrap_or_default());
        g.0.clone()
    }
}

/// A client whose server answers `steps` in order, then holds every
/// further request unanswered (as a watch with nothing to say).
pub fn client(steps: Vec<Step>) -> (kube::Client, Recorder) {
    let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let rec = Recorder::default();
    let r = rec.clone();
    tokio::spawn(async move {
        let mut handle = std::pin::pin!(handle);
        for step in steps {
            let Some((req, send)) = handle.next_request().await else {
                return;
            };
            let (parts, body) = req.into_parts();
            let path = parts.uri.to_string();
            if parts.method != step.method || !path.contains(step.path) {
                let mut g = r.0.lock().unwrap();
                g.1.get_or_insert(format!(
                    "asked {} {path}, expected {} {}",
                    parts.method, step.method, step.path
                ));
                return;
            }
            let bytes = body.collect_bytes().await.unwrap_or_default();
            let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            r.0.lock().unwrap().0.push((parts.method, path, json));
            send.send_response(
                Response::builder()
                    .status(step.status)
                    .header("content-type", "application/json")
                    .body(Body::from(step.body.into_bytes()))
                    .unwrap(),
            );
        }
        let mut held = vec![];
        while let Some(pending) = handle.next_request().await {
            held.push(pending);
        }
    });
    (kube::Client::new(svc, "default"), rec)
}

/// A Kubernetes `Status` failure, as the API server answers an error.
pub fn status(code: u16, reason: &str) -> Value {
    serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": reason, "reason": reason, "code": code})
}

/// A Hardware as the API server has it.
pub fn hardware(name: &str, rv: &str, mac: &str) -> Value {
    serde_json::json!({"apiVersion": "tinkerbell.org/v1alpha1", "kind": "Hardware",
        "metadata": {"name": name, "namespace": "default", "resourceVersion": rv,
            "uid": format!("uid-{name}")},
        "spec": {"interfaces": [{"dhcp": {"mac": mac}, "netboot": {"allowPXE": false}}]}})
}
