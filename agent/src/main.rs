//! `tinkerbox-agent`: see the library's docs. Settings come from the
//! kernel command line as Smee writes it, overridden by tink-agent's flags
//! and environment variables.

use clap::Parser;
use std::path::PathBuf;
use std::process::ExitCode;
use tinkerbox_agent::actions::Runner;
use tinkerbox_agent::config::{self, Overrides};
use tinkerbox_agent::run::Agent;
use tinkerbox_agent::{attributes, syslog, transport};
use tracing_subscriber::prelude::*;

#[derive(Parser)]
#[command(
    version,
    about = "Runs this machine's Tinkerbell Workflow actions natively"
)]
struct Args {
    /// Tink's gRPC server, HOST:PORT (kernel command line: grpc_authority)
    #[arg(long, env = "AGENT_GRPC_SERVER")]
    grpc_server: Option<String>,
    /// This worker's id (kernel command line: worker_id, else hw_addr)
    #[arg(long, env = "AGENT_ID")]
    id: Option<String>,
    /// TLS to the server (kernel command line: tinkerbell_tls)
    #[arg(long, env = "AGENT_GRPC_TLS")]
    grpc_tls: Option<bool>,
    /// TLS without verifying the server (tinkerbell_insecure_tls)
    #[arg(long, env = "AGENT_GRPC_INSECURE_TLS")]
    grpc_insecure_tls: Option<bool>,
    /// Also send log lines to this host's syslog (UDP 514) (syslog_host)
    #[arg(long, env = "AGENT_SYSLOG_HOST")]
    syslog_host: Option<String>,
    /// Where the kernel command line is read from
    #[arg(long, default_value = "/proc/cmdline")]
    cmdline: PathBuf,
    /// Send the machine's hardware with each GetAction, as tink-agent does
    #[arg(long, env = "AGENT_ATTRIBUTE_DETECTION", default_value_t = true, action = clap::ArgAction::Set)]
    attribute_detection: bool,
    /// Mount points for the actions are made here
    #[arg(long, default_value = "/run/tinkerbox-agent")]
    work_dir: PathBuf,
    /// Never reboot, power off or kexec: log it instead (for trying the
    /// agent on a machine that is not being provisioned)
    #[arg(long)]
    no_power: bool,
}

/// tink-worker's unprefixed variables, which HookOS sets; as in
/// tink-agent they win over flags.
fn legacy_env(o: &mut Overrides) {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let boolean = |k: &str| var(k).and_then(|v| v.parse::<bool>().ok());
    if let Some(v) = var("TINKERBELL_GRPC_AUTHORITY") {
        o.authority = Some(v);
    }
    if let Some(v) = boolean("TINKERBELL_TLS") {
        o.tls = Some(v);
    }
    if let Some(v) = boolean("TINKERBELL_INSECURE_TLS") {
        o.insecure_tls = Some(v);
    }
    if let Some(v) = var("WORKER_ID").or_else(|| var("ID")) {
        o.worker_id = Some(v);
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cmdline = std::fs::read_to_string(&args.cmdline).unwrap_or_default();
    let mut o = Overrides {
        authority: args.grpc_server.clone(),
        worker_id: args.id.clone(),
        tls: args.grpc_tls,
        insecure_tls: args.grpc_insecure_tls,
        syslog_host: args.syslog_host.clone(),
    };
    legacy_env(&mut o);
    let opts = match config::resolve(&config::parse_cmdline(&cmdline), &o) {
        Ok(opts) => opts,
        Err(e) => {
            eprintln!("tinkerbox-agent: {e}");
            return ExitCode::from(2);
        }
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Plain text: the console is a serial line that ends up in log files.
    let console = tracing_subscriber::fmt::layer()
        .with_ansi(false)
        .with_writer(std::io::stderr);
    let remote = opts
        .syslog_host
        .as_deref()
        .and_then(|h| match syslog::Syslog::connect(h) {
            Ok(s) => Some(
                tracing_subscriber::fmt::layer()
                    .with_ansi(false)
                    .without_time()
                    .with_writer(s),
            ),
            Err(e) => {
                eprintln!("tinkerbox-agent: syslog to {h}: {e} (logging to the console only)");
                None
            }
        });
    tracing_subscriber::registry()
        .with(filter)
        .with(console)
        .with(remote)
        .init();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tinkerbox-agent: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    rt.block_on(async {
        let client = match transport::client(&opts) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "cannot set up the connection to {}", opts.authority);
                return ExitCode::FAILURE;
            }
        };
        let attrs = args
            .attribute_detection
            .then(|| attributes::collect(std::path::Path::new("/")));
        tracing::info!(
            server = %opts.authority, worker_id = %opts.worker_id, tls = opts.tls,
            version = env!("CARGO_PKG_VERSION"), "tinkerbox-agent started"
        );
        let agent = Agent {
            client,
            worker_id: opts.worker_id.clone(),
            attributes: attrs,
            runner: Runner {
                work_dir: args.work_dir.clone(),
                power: !args.no_power,
                insecure_registries: opts.insecure_registries.clone(),
                ..Runner::default()
            },
        };
        let stop = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        agent.run(stop).await;
        tracing::info!("stopped");
        ExitCode::SUCCESS
    })
}
