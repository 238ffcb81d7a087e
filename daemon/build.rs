//! sqlx's `migrate!` embeds `migrations/` at compile time; a new file there
//! must rebuild the crate (sqlx's documented build script).
//!
//! The gRPC code for port 42113 is generated from `proto/workflow.proto`.
//! protox (a protobuf compiler in Rust) parses it, so building tinkerbox
//! needs no `protoc` on the machine.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=../migrations");
    println!("cargo:rerun-if-changed=proto/workflow.proto");
    let fds = protox::compile(["proto/workflow.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_transport(false)
        .extern_path(".proto.Report", "crate::grpc::report::Report")
        .compile_fds(fds)?;
    Ok(())
}
