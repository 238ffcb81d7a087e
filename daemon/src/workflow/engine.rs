//! tink-controller's job: move Workflows through their states. The
//! decisions are pure functions of (status, documents, time), tested
//! without a store; [`Engine::run`] is the loop that reads the store,
//! applies them, and writes each status back with the version it read.
//!
//! Done so far: rendering (`""` -> PENDING, or PREPARING when boot options
//! ask for it; a failure is `templateRendering: failed` with the reason in
//! the `TemplateRenderedSuccess` condition, retried on every pass, as
//! tink-controller requeues). The PREPARING and POST steps (allowPXE, BMC
//! jobs), the global timeout and the agents' side (the gRPC server) are
//! the next steps of issue 17.

use super::model::{Condition, State, Status, TemplateRendering, WorkflowSpec};
use super::render;
use crate::store::workflow::WorkflowRow;
use crate::store::{Store, StoreError};
use serde_json::Value;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::Notify;

pub const TEMPLATE_RENDERED: &str = "TemplateRenderedSuccess";

/// What rendering needs besides the Workflow: its Template (`spec.data`)
/// and Hardware document, as found (None: not found).
pub struct Found<'a> {
    pub template: Option<&'a str>,
    pub hardware: Option<&'a Value>,
}

/// The status a new Workflow (state `""`) moves to, or None when nothing
/// changes (the same failure as last time).
pub fn render_step(
    spec: &WorkflowSpec,
    status: &Status,
    found: Found,
    now: &str,
) -> Option<Status> {
    let failed = |message: String| {
        let mut s = status.clone();
        s.template_rendering = Some(TemplateRendering::Failed);
        let changed = set_condition(&mut s, condition(false, "Error", message, now));
        changed.then_some(s)
    };
    let Some(data) = found.template else {
        return failed(format!("template not found: {}", spec.template_ref));
    };
    if !spec.hardware_ref.is_empty() && found.hardware.is_none() {
        return failed(format!("hardware not found: {}", spec.hardware_ref));
    }
    let doc = match render::render(data, found.hardware, &spec.hardware_map) {
        Ok(d) => d,
        Err(e) => return failed(format!("error rendering template: {e}")),
    };
    let mut s = Status::rendered(&doc);
    s.conditions = status.conditions.clone();
    set_condition(
        &mut s,
        condition(
            true,
            "Complete",
            "template rendered successfully".into(),
            now,
        ),
    );
    // A disabled Workflow is rendered but does not start (upstream keeps
    // its state "").
    s.state = if spec.disabled {
        State::New
    } else if spec.boot_options.toggle_allow_netboot || spec.boot_options.boot_mode.is_some() {
        State::Preparing
    } else {
        State::Pending
    };
    Some(s)
}

fn condition(ok: bool, reason: &str, message: String, now: &str) -> Condition {
    Condition {
        kind: TEMPLATE_RENDERED.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: Some(reason.into()),
        message: Some(message),
        time: Some(now.into()),
    }
}

/// Set a condition of its type; false when only its time would change
/// (upstream's SetConditionIfDifferent).
fn set_condition(s: &mut Status, c: Condition) -> bool {
    match s.conditions.iter_mut().find(|o| o.kind == c.kind) {
        Some(o) if o.status == c.status && o.reason == c.reason && o.message == c.message => false,
        Some(o) => {
            *o = c;
            true
        }
        None => {
            s.conditions.push(c);
            true
        }
    }
}

pub fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

/// The loop: woken by every Template or Workflow change, and every few
/// seconds to retry what could not render (a Template or Hardware that
/// was missing may have come).
pub struct Engine {
    store: Store,
    wake: Arc<Notify>,
}

impl Engine {
    pub fn new(store: Store, wake: Arc<Notify>) -> Engine {
        Engine { store, wake }
    }

    pub async fn run(self) {
        loop {
            if let Err(e) = self.pass().await {
                tracing::error!(error = %e, "workflow engine: pass failed");
            }
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(Duration::from_secs(5)) => {}
            }
        }
    }

    async fn pass(&self) -> Result<(), StoreError> {
        for row in self.store.workflows(None, &[State::New]).await? {
            if let Err(e) = self.render(&row).await {
                tracing::warn!(workflow = %row.key, error = %e, "workflow engine: rendering");
            }
        }
        Ok(())
    }

    async fn render(&self, row: &WorkflowRow) -> Result<(), StoreError> {
        let spec: WorkflowSpec = match row.doc.get("spec").cloned().map(serde_json::from_value) {
            Some(Ok(s)) => s,
            _ => WorkflowSpec::default(),
        };
        if spec.disabled && row.status.template_rendering.is_some() {
            return Ok(());
        }
        let ns = &row.key.namespace;
        let template = self
            .store
            .template(&crate::hardware::Key::new(
                ns.clone(),
                spec.template_ref.clone(),
            ))
            .await?;
        let hardware = if spec.hardware_ref.is_empty() {
            None
        } else {
            self.store
                .get(&crate::hardware::Key::new(
                    ns.clone(),
                    spec.hardware_ref.clone(),
                ))
                .await?
        };
        let data = template
            .as_ref()
            .and_then(|t| t.pointer("/spec/data"))
            .and_then(Value::as_str);
        let found = Found {
            template: data,
            hardware: hardware.as_ref(),
        };
        let Some(next) = render_step(&spec, &row.status, found, &rfc3339(SystemTime::now())) else {
            return Ok(());
        };
        match self
            .store
            .save_workflow_status(&row.key, row.version, &next)
            .await
        {
            // Someone else wrote it since it was read: the next pass sees it.
            Ok(_) | Err(StoreError::Stale { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workflow::model::BootMode;
    use serde_json::json;

    const T: &str = "version: '0.1'\nname: t\nglobal_timeout: 60\ntasks:\n- name: a\n  worker: '{{.device_1}}'\n  actions:\n  - name: x\n    image: bash\n";

    fn spec() -> WorkflowSpec {
        WorkflowSpec {
            template_ref: "t".into(),
            hardware_ref: "h".into(),
            hardware_map: [("device_1".to_string(), "02:00:00:00:00:01".to_string())].into(),
            ..WorkflowSpec::default()
        }
    }

    #[test]
    fn a_rendered_workflow_is_pending_or_preparing() {
        let hw = json!({"spec": {}});
        let found = || Found {
            template: Some(T),
            hardware: Some(&hw),
        };
        let s = render_step(&spec(), &Status::default(), found(), "t0").unwrap();
        assert_eq!(s.state, State::Pending);
        assert_eq!(s.agent_id.as_deref(), Some("02:00:00:00:00:01"));
        assert_eq!(s.template_rendering, Some(TemplateRendering::Successful));
        assert_eq!(s.conditions[0].status, "True");
        let mut sp = spec();
        sp.boot_options.boot_mode = Some(BootMode::Netboot);
        assert_eq!(
            render_step(&sp, &Status::default(), found(), "t0")
                .unwrap()
                .state,
            State::Preparing
        );
        sp.disabled = true;
        assert_eq!(
            render_step(&sp, &Status::default(), found(), "t0")
                .unwrap()
                .state,
            State::New
        );
    }

    #[test]
    fn failures_are_conditions_and_not_rewritten_when_the_same() {
        let hw = json!({"spec": {}});
        let s = render_step(
            &spec(),
            &Status::default(),
            Found {
                template: None,
                hardware: Some(&hw),
            },
            "t0",
        )
        .unwrap();
        assert_eq!(s.state, State::New);
        assert_eq!(s.template_rendering, Some(TemplateRendering::Failed));
        assert_eq!(
            s.conditions[0].message.as_deref(),
            Some("template not found: t")
        );
        // The same failure again, later: nothing to write.
        assert!(
            render_step(
                &spec(),
                &s,
                Found {
                    template: None,
                    hardware: Some(&hw)
                },
                "t1"
            )
            .is_none()
        );
        let s2 = render_step(
            &spec(),
            &s,
            Found {
                template: Some(T),
                hardware: None,
            },
            "t1",
        )
        .unwrap();
        assert_eq!(s2.conditions.len(), 1);
        assert_eq!(
            s2.conditions[0].message.as_deref(),
            Some("hardware not found: h")
        );
        let mut sp = spec();
        sp.hardware_map.clear();
        let s3 = render_step(
            &sp,
            &s2,
            Found {
                template: Some(T),
                hardware: Some(&hw),
            },
            "t2",
        )
        .unwrap();
        assert!(
            s3.conditions[0]
                .message
                .as_deref()
                .unwrap()
                .contains("device_1"),
            "{s3:?}"
        );
        // And once it renders, the condition turns True.
        let ok = render_step(
            &spec(),
            &s3,
            Found {
                template: Some(T),
                hardware: Some(&hw),
            },
            "t3",
        )
        .unwrap();
        assert_eq!(ok.conditions.len(), 1);
        assert_eq!(ok.conditions[0].status, "True");
    }
}
