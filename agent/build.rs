//! The client for Tink's gRPC API comes from the daemon's own
//! `daemon/proto/workflow.proto`, the one definition of port 42113 in this
//! workspace. There `ReportActionStatus` takes a placeholder `Report` (the
//! server tells tink-agent's and tink-worker's requests apart by hand);
//! this agent is a tink-agent and sends `ActionStatusRequest`, so the
//! method's input is set to that before the code is generated. Only the
//! tink-agent methods are kept. protox parses the file: no `protoc`.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "../daemon/proto/workflow.proto";
    println!("cargo:rerun-if-changed={proto}");
    let mut fds = protox::compile([proto], ["../daemon/proto"])?;
    let mut found = false;
    for file in &mut fds.file {
        for service in &mut file.service {
            if service.name() != "WorkflowService" {
                continue;
            }
            service
                .method
                .retain(|m| matches!(m.name(), "GetAction" | "ReportActionStatus"));
            for m in &mut service.method {
                if m.name() == "ReportActionStatus" {
                    m.input_type = Some(".proto.ActionStatusRequest".into());
                    found = true;
                }
            }
        }
    }
    if !found {
        return Err("workflow.proto has no WorkflowService.ReportActionStatus".into());
    }
    tonic_prost_build::configure()
        .build_server(false)
        .build_transport(false)
        .compile_fds(fds)?;
    Ok(())
}
