//! `/proto.WorkflowService/ReportActionStatus` carries one of two messages:
//! tink-agent's `ActionStatusRequest` or tink-worker v0.12's
//! `WorkflowActionStatus`. Same path, same field numbers, different types.
//! [`Report`] decodes either, telling them apart by wire type:
//!
//! | field | tink-agent                    | tink-worker v0.12         |
//! |-------|-------------------------------|---------------------------|
//! | 4     | action_id (string, LEN)       | action_status (enum, VARINT) |
//! | 5     | action_name (string, LEN)     | seconds (int64, VARINT)   |
//! | 6     | action_state (enum, VARINT)   | message (string, LEN)     |
//! | 9, 10 | duration, message (LEN)       | -                         |
//!
//! A message with none of those fields set (proto3 leaves defaults off the
//! wire) is read as tink-agent's; neither worker sends such a report. One
//! with fields of both is refused as malformed.
//! Hand-written because no code generator can express "either message".

use super::pb::{ActionStatusRequest, WorkflowActionStatus};
use prost::Message;
use prost::bytes::{Buf, BufMut};
use prost::encoding::{DecodeContext, WireType, decode_key, skip_field};

#[derive(Debug, Clone, PartialEq)]
pub enum Report {
    Agent(ActionStatusRequest),
    Worker(WorkflowActionStatus),
}

impl Default for Report {
    fn default() -> Self {
        Report::Agent(ActionStatusRequest::default())
    }
}

/// Which of the two a message is, from its fields' wire types.
fn is_worker(mut buf: &[u8]) -> Result<bool, prost::DecodeError> {
    let (mut agent, mut worker) = (0, 0);
    while buf.has_remaining() {
        let (tag, wt) = decode_key(&mut buf)?;
        match (tag, wt) {
            (4 | 5, WireType::LengthDelimited) | (6, WireType::Varint) | (9 | 10, _) => agent += 1,
            (4 | 5, WireType::Varint) | (6, WireType::LengthDelimited) => worker += 1,
            _ => {}
        }
        skip_field(wt, tag, &mut buf, DecodeContext::default())?;
    }
    // Fields of both: read as tink-agent's, which fails on the first field
    // of the wrong type.
    Ok(worker > 0 && agent == 0)
}

impl Message for Report {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        match self {
            Report::Agent(m) => m.encode_raw(buf),
            Report::Worker(m) => m.encode_raw(buf),
        }
    }

    /// Field by field, into the message already chosen. [`Message::merge`]
    /// (what decoding calls) chooses first.
    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        match self {
            Report::Agent(m) => m.merge_field(tag, wire_type, buf, ctx),
            Report::Worker(m) => m.merge_field(tag, wire_type, buf, ctx),
        }
    }

    fn merge(&mut self, mut buf: impl Buf) -> Result<(), prost::DecodeError> {
        let bytes = buf.copy_to_bytes(buf.remaining());
        *self = if is_worker(&bytes)? {
            Report::Worker(WorkflowActionStatus::decode(bytes)?)
        } else {
            Report::Agent(ActionStatusRequest::decode(bytes)?)
        };
        Ok(())
    }

    fn encoded_len(&self) -> usize {
        match self {
            Report::Agent(m) => m.encoded_len(),
            Report::Worker(m) => m.encoded_len(),
        }
    }

    fn clear(&mut self) {
        *self = Report::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grpc::pb::{ActionMessage, State, action_status_request::StateType};

    #[test]
    fn each_worker_s_report_is_read_as_its_own() {
        let agent = ActionStatusRequest {
            workflow_id: Some("default/wf1".into()),
            agent_id: Some("02:00:00:00:00:01".into()),
            task_id: Some("01JTASK".into()),
            action_id: Some("01JACTION".into()),
            action_name: Some("stream".into()),
            action_state: Some(StateType::Success as i32),
            execution_duration: Some("41s".into()),
            message: Some(ActionMessage {
                message: Some("done".into()),
            }),
            ..Default::default()
        };
        let worker = WorkflowActionStatus {
            workflow_id: "default/wf1".into(),
            task_name: "install".into(),
            action_name: "stream".into(),
            action_status: State::Success as i32,
            seconds: 41,
            message: "done".into(),
            worker_id: "02:00:00:00:00:01".into(),
            created_at: None,
        };
        let a = Report::decode(agent.encode_to_vec().as_slice()).unwrap();
        assert_eq!(a, Report::Agent(agent.clone()));
        let w = Report::decode(worker.encode_to_vec().as_slice()).unwrap();
        assert_eq!(w, Report::Worker(worker.clone()));
        // RUNNING from the worker, with nothing but the names and the state.
        let running = WorkflowActionStatus {
            action_status: State::Running as i32,
            ..WorkflowActionStatus::default()
        };
        assert!(matches!(
            Report::decode(running.encode_to_vec().as_slice()).unwrap(),
            Report::Worker(_)
        ));
        // An agent report with only an action id.
        let only_id = ActionStatusRequest {
            action_id: Some("x".into()),
            ..Default::default()
        };
        assert!(matches!(
            Report::decode(only_id.encode_to_vec().as_slice()).unwrap(),
            Report::Agent(_)
        ));
        // Round trip through encode.
        assert_eq!(Report::decode(w.encode_to_vec().as_slice()).unwrap(), w);
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let mixed = [0x20, 0x01, 0x2a, 0x01, b'x']; // field 4 varint and field 5 string
        assert!(Report::decode(mixed.as_slice()).is_err());
        for bad in [&[0xff_u8][..], &[0x22, 0x05, b'a'], &[0x0a]] {
            assert!(Report::decode(bad).is_err(), "{bad:?}");
        }
    }
}
