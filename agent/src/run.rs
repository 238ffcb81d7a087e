//! tink-agent's loop: ask for an action, report it RUNNING, run it under
//! its timeout, report how it ended; between empty polls wait with the
//! randomized backoff. A final report is retried until the server answers
//! (giving up would leave the Workflow stuck), except for the codes that
//! say it never will (NotFound, InvalidArgument, FailedPrecondition), as
//! tink-agent does.

use crate::action::Action;
use crate::actions::{self, Outcome, Progress};
use crate::backoff::Backoff;
use crate::pb::action_status_request::StateType;
use crate::pb::{ActionMessage, ActionRequest, ActionStatusRequest, AgentAttributes};
use crate::transport::Client;
use std::time::{Duration, Instant, SystemTime};
use tonic::Code;

/// How often a running action's progress message is sent, at most.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

pub struct Agent {
    pub client: Client,
    pub worker_id: String,
    pub attributes: Option<AgentAttributes>,
    pub runner: actions::Runner,
}

fn permanent(c: Code) -> bool {
    matches!(
        c,
        Code::NotFound | Code::InvalidArgument | Code::FailedPrecondition
    )
}

impl Agent {
    /// Runs until `stop` resolves (never, in the OSIE).
    pub async fn run(mut self, stop: impl std::future::Future<Output = ()>) {
        tokio::pin!(stop);
        let mut backoff = Backoff::default();
        let mut idle_logged = false;
        loop {
            let req = ActionRequest {
                agent_id: Some(self.worker_id.clone()),
                agent_attributes: self.attributes.clone(),
            };
            let got = tokio::select! {
                _ = &mut stop => return,
                r = self.client.get_action(req) => r,
            };
            match got {
                Ok(resp) => {
                    idle_logged = false;
                    let action = Action::from(resp.into_inner());
                    if self.one(&action).await {
                        backoff.reset();
                        continue;
                    }
                }
                Err(s) if matches!(s.code(), Code::NotFound | Code::FailedPrecondition) => {
                    if !idle_logged {
                        tracing::info!(code = ?s.code(), message = s.message(), "no action for this worker yet; polling");
                        idle_logged = true;
                    }
                }
                Err(s) => {
                    tracing::warn!(code = ?s.code(), message = s.message(), "GetAction failed");
                }
            }
            let wait = backoff.next_wait();
            tokio::select! {
                _ = &mut stop => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// One action, start to end. False when it could not even be started
    /// (the RUNNING report failed): the loop backs off and asks again.
    async fn one(&mut self, action: &Action) -> bool {
        tracing::info!(action = %action.name, image = %action.image, workflow = %action.workflow_id, "received action");
        let started = SystemTime::now();
        let running = self.status(action, StateType::Running, started, None, "running action");
        if let Err(s) = self.client.report_action_status(running).await {
            tracing::warn!(code = ?s.code(), message = s.message(), action = %action.name, "reporting RUNNING failed");
            return false;
        }
        let t0 = Instant::now();
        let (progress, mut rx) = Progress::channel();
        let run = actions::run_with_timeout(&self.runner, action, progress);
        tokio::pin!(run);
        let mut tick = tokio::time::interval(PROGRESS_EVERY);
        tick.tick().await;
        let outcome: Outcome = loop {
            tokio::select! {
                o = &mut run => break o,
                _ = tick.tick() => {
                    if rx.has_changed().unwrap_or(false) {
                        let msg = rx.borrow_and_update().clone();
                        let r = self.status(action, StateType::Running, started, None, &msg);
                        // Progress is best effort: a lost one is replaced by the next.
                        if let Err(s) = self.client.report_action_status(r).await {
                            tracing::debug!(code = ?s.code(), "progress report failed");
                        }
                    }
                }
            }
        };
        let took = t0.elapsed();
        let state = match outcome.state {
            actions::End::Success => StateType::Success,
            actions::End::Failed => StateType::Failed,
            actions::End::Timeout => StateType::Timeout,
        };
        tracing::info!(action = %action.name, state = ?state, seconds = took.as_secs_f64(), message = %outcome.message, "action ended");
        let fin = self.status(
            action,
            state,
            started,
            Some((SystemTime::now(), took)),
            &outcome.message,
        );
        let mut retry = Backoff::default();
        for attempt in 1u64.. {
            match self.client.report_action_status(fin.clone()).await {
                Ok(_) => break,
                Err(s) if permanent(s.code()) => {
                    tracing::warn!(code = ?s.code(), message = s.message(), "the server refused the report; not retrying");
                    break;
                }
                Err(s) => {
                    let wait = retry.next_wait();
                    tracing::warn!(code = ?s.code(), message = s.message(), attempt, retry_in = ?wait, "reporting the action's end failed");
                    tokio::time::sleep(wait).await;
                }
            }
        }
        if let Some(ending) = outcome.then {
            actions::after_report(&self.runner, ending).await;
        }
        true
    }

    fn status(
        &self,
        a: &Action,
        state: StateType,
        started: SystemTime,
        stopped: Option<(SystemTime, Duration)>,
        message: &str,
    ) -> ActionStatusRequest {
        ActionStatusRequest {
            workflow_id: Some(a.workflow_id.clone()),
            agent_id: Some(self.worker_id.clone()),
            task_id: Some(a.task_id.clone()),
            action_id: Some(a.action_id.clone()),
            action_name: Some(a.name.clone()),
            action_state: Some(state as i32),
            execution_start: Some(timestamp(started)),
            execution_stop: stopped.map(|(t, _)| timestamp(t)),
            execution_duration: stopped.map(|(_, d)| go_duration(d)),
            message: Some(ActionMessage {
                message: Some(message.to_string()),
            }),
        }
    }
}

fn timestamp(t: SystemTime) -> prost_types::Timestamp {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    prost_types::Timestamp {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

/// Go's `time.Duration.String()` (what tink-agent sends): "1.5s",
/// "2m3.25s", "1h0m0s", "450ms".
pub fn go_duration(d: Duration) -> String {
    let total = d.as_nanos();
    if total == 0 {
        return "0s".into();
    }
    if total < 1_000_000_000 {
        let (unit, div) = if total < 1_000 {
            ("ns", 1u128)
        } else if total < 1_000_000 {
            ("µs", 1_000)
        } else {
            ("ms", 1_000_000)
        };
        return format!("{}{unit}", trim(total, div));
    }
    let secs = total / 1_000_000_000;
    let (h, m) = (secs / 3600, (secs / 60) % 60);
    let s = trim(total % 60_000_000_000, 1_000_000_000);
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, _) => format!("{m}m{s}s"),
        _ => format!("{h}h{m}m{s}s"),
    }
}

/// `n / div` in decimal, without trailing zeros.
fn trim(n: u128, div: u128) -> String {
    let whole = n / div;
    let frac = n % div;
    if frac == 0 {
        return whole.to_string();
    }
    let width = div.to_string().len() - 1;
    let f = format!("{frac:0width$}");
    format!("{whole}.{}", f.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_as_go_prints_them() {
        assert_eq!(go_duration(Duration::ZERO), "0s");
        assert_eq!(go_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(go_duration(Duration::from_millis(450)), "450ms");
        assert_eq!(go_duration(Duration::from_micros(1500)), "1.5ms");
        assert_eq!(go_duration(Duration::from_nanos(12)), "12ns");
        assert_eq!(go_duration(Duration::from_millis(123_250)), "2m3.25s");
        assert_eq!(go_duration(Duration::from_secs(3600)), "1h0m0s");
        assert_eq!(go_duration(Duration::from_secs(60)), "1m0s");
    }
}
