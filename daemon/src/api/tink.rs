//! Templates, Workflows, and one `apply` for every kind tinkerbox stores.
//!
//! ```text
//! POST   /api/v1/apply                              any mix of kinds (JSON or YAML); all checked first
//! GET    /api/v1/templates[?namespace=NS]           TemplateList
//! GET    /api/v1/templates/{name}[?namespace=NS]
//! DELETE /api/v1/templates/{name}[?namespace=NS]
//! GET    /api/v1/workflows[?namespace=NS]           WorkflowList, each with its status
//! GET    /api/v1/workflows/{name}[?namespace=NS]    with status, in the CRD's field names
//! DELETE /api/v1/workflows/{name}[?namespace=NS]
//! GET    /api/v1/workflowrulesets[?namespace=NS]    WorkflowRuleSetList
//! GET    /api/v1/workflowrulesets/{name}[?namespace=NS]
//! DELETE /api/v1/workflowrulesets/{name}[?namespace=NS]
//! ```

use super::{ApiError, NsQuery, deleted, documents, found, key, locate, query};
use crate::app::App;
use crate::discovery::rules;
use crate::hardware::{FieldError, Key};
use crate::kinds::{Checked, check};
use crate::store::Outcome;
use crate::store::workflow::TinkKind;
use crate::workflow::model;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use serde_json::{Value, json};
use std::sync::Arc;

pub fn routes() -> Router<Arc<App>> {
    Router::new()
        .route("/api/v1/apply", post(apply))
        .route("/api/v1/templates", get(templates))
        .route(
            "/api/v1/templates/{name}",
            get(template).delete(delete_template),
        )
        .route("/api/v1/workflowrulesets", get(rulesets))
        .route(
            "/api/v1/workflowrulesets/{name}",
            get(ruleset).delete(delete_ruleset),
        )
        .route("/api/v1/workflows", get(workflows))
        .route(
            "/api/v1/workflows/{name}",
            get(workflow).delete(delete_workflow),
        )
}

/// Apply any mix of kinds. Every document is checked before anything is
/// written, so a bad one changes nothing. Then, in the order things refer
/// to each other: Secrets and BMC documents, Hardware, Templates and
/// Workflows, WorkflowRuleSets, BareMetalHosts, each group in one
/// transaction.
async fn apply(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body.map_err(|e| ApiError::new(e.status(), e.body_text()))?;
    let text = std::str::from_utf8(&body)
        .map_err(|_| ApiError::bad_request(FieldError::new("", "body is not UTF-8")))?;
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    let docs = documents(text, is_json).map_err(ApiError::bad_request)?;
    let many = docs.len() > 1;
    let mut checked = Vec::with_capacity(docs.len());
    for (i, d) in docs.into_iter().enumerate() {
        checked.push(check(d.doc).map_err(|e| ApiError::bad_request(locate(e, i, d.line, many)))?);
    }
    // Where each document's outcome lands: (group, index in the group).
    for c in &checked {
        if c.kind() == crate::kinds::Kind::BareMetalHost {
            super::metal3::host_mode(&app)?;
        } else {
            super::not_mirrored(&app, c.kind())?;
        }
    }
    let (mut hw, mut bmcs, mut tpls, mut wfs, mut sets) = (vec![], vec![], vec![], vec![], vec![]);
    let (mut hosts, mut data) = (vec![], vec![]);
    let mut order = Vec::with_capacity(checked.len());
    for c in checked {
        order.push(match c {
            Checked::Hardware(h) => (0, push(&mut hw, h)),
            Checked::Bmc(b) => (1, push(&mut bmcs, b)),
            Checked::Template(t) => (2, push(&mut tpls, t)),
            Checked::Workflow(w) => (3, push(&mut wfs, w)),
            Checked::RuleSet(r) => (4, push(&mut sets, r)),
            Checked::Host(h) => (5, push(&mut hosts, *h)),
            Checked::HostData(d) => (6, push(&mut data, d)),
        });
    }
    let bmc_out = if bmcs.is_empty() {
        vec![]
    } else {
        app.services.bmc.apply(&bmcs).await?
    };
    let bmc_items: Vec<_> = bmcs
        .iter()
        .zip(bmc_out)
        .map(|(d, o)| item(d.kind(), d.key(), o))
        .collect();
    let hw_items: Vec<_> = if hw.is_empty() {
        vec![]
    } else {
        app.services
            .hardware
            .apply(hw)
            .await?
            .into_iter()
            .map(|(k, o)| item("Hardware", &k, o))
            .collect()
    };
    let (t_out, w_out) = if tpls.is_empty() && wfs.is_empty() {
        (vec![], vec![])
    } else {
        app.services.workflow.apply(&tpls, &wfs).await?
    };
    let t_items: Vec<_> = tpls
        .iter()
        .zip(t_out)
        .map(|(t, o)| item("Template", &t.key, o))
        .collect();
    let w_items: Vec<_> = wfs
        .iter()
        .zip(w_out)
        .map(|(w, o)| item("Workflow", &w.key, o))
        .collect();
    let s_out = if sets.is_empty() {
        vec![]
    } else {
        app.services.workflow.apply_rulesets(&sets).await?
    };
    let s_items: Vec<_> = sets
        .iter()
        .zip(s_out)
        .map(|(s, o)| item(rules::KIND, &s.key, o))
        .collect();
    // A host's data Secrets before the host: the host's apply wakes the
    // controller, which reads them when the host may provision (a claim
    // applied with its userData Secret in one file must find it).
    let d_out = if data.is_empty() {
        vec![]
    } else {
        app.services.metal3.apply_secrets(&data).await?
    };
    let d_items: Vec<_> = data
        .iter()
        .zip(d_out)
        .map(|(d, o)| item("Secret", &d.key, o))
        .collect();
    let h_out = if hosts.is_empty() {
        vec![]
    } else {
        app.services.metal3.apply(&hosts).await?
    };
    let h_items: Vec<_> = hosts
        .iter()
        .zip(h_out)
        .map(|(h, o)| item(crate::metal3::KIND, &h.key, o))
        .collect();
    let groups = [
        hw_items, bmc_items, t_items, w_items, s_items, h_items, d_items,
    ];
    let items: Vec<&Value> = order.iter().map(|&(g, i)| &groups[g][i]).collect();
    let created = items.iter().any(|i| i["result"] == "created");
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(json!({ "items": items }))).into_response())
}

fn push<T>(v: &mut Vec<T>, x: T) -> usize {
    v.push(x);
    v.len() - 1
}

fn item(kind: &str, k: &Key, o: Outcome) -> Value {
    json!({"kind": kind, "namespace": k.namespace, "name": k.name, "result": o})
}

async fn templates(
    State(app): State<Arc<App>>,
    q: Result<Query<NsQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let q = query(q)?;
    let items = q.selected(app.store.templates(q.namespace.as_deref()).await?)?;
    Ok(Json(
        json!({"apiVersion": model::API_VERSION, "kind": "TemplateList", "items": items}),
    ))
}

async fn template(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    q: Result<Query<NsQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let k = key(name, query(q)?);
    found(app.store.template(&k).await?, "Template", &k).map(Json)
}

async fn rulesets(
    State(app): State<Arc<App>>,
    q: Result<Query<NsQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let q = query(q)?;
    let items = q.selected(app.store.rulesets(q.namespace.as_deref()).await?)?;
    Ok(Json(
        json!({"apiVersion": rules::API_VERSION, "kind": "WorkflowRuleSetList", "items": items}),
    ))
}

async fn ruleset(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    q: Result<Query<NsQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let k = key(name, query(q)?);
    found(app.store.ruleset(&k).await?, rules::KIND, &k).map(Json)
}

async fn delete_ruleset(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    q: Result<Query<NsQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    super::not_mirrored(&app, crate::kinds::Kind::WorkflowRuleSet)?;
    delete(&app, TinkKind::WorkflowRuleSet, key(name, query(q)?)).await
}

async fn workflows(
    State(app): State<Arc<App>>,
    q: Result<Query<NsQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let q = query(q)?;
    let rows = app.store.workflows(q.namespace.as_deref(), &[]).await?;
    let items = q.selected(rows.iter().map(|r| r.with_status()).collect())?;
    Ok(Json(
        json!({"apiVersion": model::API_VERSION, "kind": "WorkflowList", "items": items}),
    ))
}

async fn workflow(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    q: Result<Query<NsQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let k = key(name, query(q)?);
    found(app.store.workflow(&k).await?, "Workflow", &k).map(|r| Json(r.with_status()))
}

async fn delete(app: &App, kind: TinkKind, k: Key) -> Result<Json<Value>, ApiError> {
    deleted(
        app.services.workflow.delete(kind, &k).await?,
        &format!("{kind:?}"),
        k,
    )
}

async fn delete_template(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    q: Result<Query<NsQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    super::not_mirrored(&app, crate::kinds::Kind::Template)?;
    delete(&app, TinkKind::Template, key(name, query(q)?)).await
}

async fn delete_workflow(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    q: Result<Query<NsQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    super::not_mirrored(&app, crate::kinds::Kind::Workflow)?;
    delete(&app, TinkKind::Workflow, key(name, query(q)?)).await
}
