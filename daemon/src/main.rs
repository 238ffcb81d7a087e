#![deny(unsafe_code)]

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use tinkerbox::cli::{self, Output, Target};
use tinkerbox::config::Role;
use tinkerbox::config::{Config, LogFormat, Sources};
use tinkerbox::kinds::Kind;

/// mimalloc rather than glibc's malloc: every DHCP reply's event is built
/// on a DHCP thread and freed by the event writer, and glibc pays for such
/// cross-thread frees with arena locks and chunk consolidation (~10% of the
/// server's CPU under a DHCP storm in `perf`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A bare-metal provisioning appliance compatible with the Tinkerbell stack.
#[derive(Parser)]
#[command(name = "tinkerbox", version, propagate_version = true)]
struct Args {
    /// Config file [default: /etc/tinkerbox/tinkerbox.toml if it exists]
    #[arg(long, global = true, env = "TINKERBOX_CONFIG", value_name = "PATH")]
    config: Option<PathBuf>,
    /// Log format (overrides log.format)
    #[arg(long, global = true, value_enum, value_name = "FORMAT")]
    log_format: Option<LogFormat>,
    /// Admin API URL, e.g. http://127.0.0.1:7081 [default: from the config's api.listen]
    #[arg(long, global = true, env = "TINKERBOX_SERVER", value_name = "URL")]
    server: Option<String>,
    /// Admin API token [default: read from state_dir/api-token]
    #[arg(
        long,
        global = true,
        env = "TINKERBOX_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    token: Option<String>,
    /// CA certificate (PEM) to trust for an HTTPS admin API [default: the config's api.tls_cert]
    #[arg(long, global = true, env = "TINKERBOX_CACERT", value_name = "PATH")]
    cacert: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon
    Serve {
        /// Override a config key, e.g. --set api.listen=127.0.0.1:9081 (repeatable)
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<String>,
    },
    /// Inspect the configuration
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Create or update documents of any kind (Hardware, Template, Workflow, BMC Machine/Job/Task, Secret)
    Apply {
        /// File or directory to read (its .yaml/.yml/.json files), or - for standard input (repeatable)
        #[arg(
            short = 'f',
            long = "filename",
            required = true,
            value_name = "FILE|DIR"
        )]
        files: Vec<String>,
        /// Check everything, then apply it all or nothing
        #[arg(long)]
        atomic: bool,
    },
    /// List objects of a kind, or show one
    Get {
        /// hardware, template, workflow, workflowruleset (wrs), machine, job, task
        #[arg(value_enum)]
        kind: Kind,
        #[command(flatten)]
        list: ListArgs,
    },
    /// Claim an available BareMetalHost matching a label selector (at random among equals, as CAPM3 does) and provision it with an image
    Claim {
        /// Label selector the host must match (kubectl's grammar: k=v,k2 in (a,b),!k3); empty: any
        #[arg(short = 'l', long, default_value = "")]
        selector: String,
        /// This host only, by name (it must still be available and match the selector)
        #[arg(long)]
        host: Option<String>,
        /// The image's URL (http or https)
        #[arg(long)]
        image: String,
        /// Its checksum: a hex digest, or the URL of a checksum file (sha256sum's format)
        #[arg(long)]
        checksum: Option<String>,
        /// md5, sha256, sha512 or auto (by the digest's length)
        #[arg(long)]
        checksum_type: Option<String>,
        /// raw (default; may be gzip, xz, zstd or bzip2 compressed) or qcow2
        #[arg(long)]
        format: Option<String>,
        /// cloud-init user data, given to the host in its config drive and by the metadata service
        #[arg(long, value_name = "FILE")]
        user_data: Option<std::path::PathBuf>,
        /// The consumer's name (spec.consumerRef.name); default claim-<time>
        #[arg(long)]
        consumer: Option<String>,
        #[command(flatten)]
        follow: FollowArgs,
    },
    /// Release a claimed BareMetalHost: its image cleared, its disks cleaned, then its consumer
    Release {
        name: String,
        #[command(flatten)]
        follow: FollowArgs,
    },
    /// Delete an object (hardware, template, workflow, baremetalhost)
    Delete {
        #[arg(value_enum)]
        kind: Kind,
        name: String,
        #[arg(short, long)]
        namespace: Option<String>,
    },
    /// Show a workflow (tasks, actions, state, durations, messages, conditions) or a BareMetalHost (state, errors, operations, hardware) in detail
    Describe {
        #[arg(value_enum)]
        kind: DescribeKind,
        name: String,
        #[arg(short, long)]
        namespace: Option<String>,
    },
    /// Manage Tinkerbell Hardware objects
    Hardware {
        #[command(subcommand)]
        command: HardwareCommand,
    },
    /// BMCs (Rufio Machine/Job/Task documents and Secrets): power, boot device, jobs
    Bmc {
        #[command(subcommand)]
        command: BmcCommand,
    },
    /// Machine-level actions
    Machine {
        #[command(subcommand)]
        command: MachineCommand,
    },
    /// Kubernetes mode: install the CRDs, print the RBAC tinkerbox needs
    Kube {
        #[command(subcommand)]
        command: KubeCommand,
    },
    /// Show what happened to machines (newest last)
    Events {
        /// Hardware name [default: every machine]
        name: Option<String>,
        #[arg(short, long)]
        namespace: Option<String>,
        /// How many of the newest events
        #[arg(long, default_value_t = 100)]
        limit: u32,
        #[arg(short, long, value_enum, default_value_t = Output::Table)]
        output: Output,
        /// Keep printing new events as they arrive
        #[arg(short, long)]
        follow: bool,
    },
}

#[derive(Subcommand)]
enum BmcCommand {
    /// Create or update BMC Machines and Secrets, start Jobs and Tasks (YAML/JSON)
    Apply {
        #[arg(short = 'f', long = "filename", required = true, value_name = "FILE")]
        files: Vec<String>,
    },
    /// List BMC Machines with their power state, or show one
    Get {
        name: Option<String>,
        #[arg(short, long)]
        namespace: Option<String>,
        #[arg(short, long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Power on/off/soft/cycle/reset, or read the status (a one-task job)
    Power {
        name: String,
        #[arg(value_enum)]
        action: tinkerbox::bmc::PowerAction,
        #[arg(short, long)]
        namespace: Option<String>,
        /// Return once the job is created
        #[arg(long)]
        no_wait: bool,
    },
    /// Set the next boot device (a one-task job)
    Bootdev {
        name: String,
        #[arg(value_enum)]
        device: tinkerbox::bmc::BootDevice,
        /// For every boot, not just the next
        #[arg(long)]
        persistent: bool,
        /// UEFI boot
        #[arg(long)]
        efi: bool,
        #[arg(short, long)]
        namespace: Option<String>,
        #[arg(long)]
        no_wait: bool,
    },
    /// Insert an ISO into the BMC's virtual media (Redfish), or eject it
    Media {
        name: String,
        /// http(s) URL the BMC fetches the image from
        #[arg(required_unless_present = "eject", conflicts_with = "eject")]
        url: Option<String>,
        /// Eject what is inserted
        #[arg(long)]
        eject: bool,
        #[arg(long, value_enum, default_value_t = tinkerbox::bmc::model::MediaKind::Cd)]
        kind: tinkerbox::bmc::model::MediaKind,
        #[arg(short, long)]
        namespace: Option<String>,
        #[arg(long)]
        no_wait: bool,
    },
    /// Jobs and their tasks
    Job {
        #[command(subcommand)]
        command: JobCommand,
    },
}

#[derive(Subcommand)]
enum KubeCommand {
    /// Server-side apply the Tinkerbell CRDs tinkerbox serves (upstream's, embedded), then wait for them to be Established
    InstallCrds {
        /// Kubeconfig file [default: the config's kube.kubeconfig, else in-cluster, $KUBECONFIG, ~/.kube/config]
        #[arg(long, value_name = "PATH")]
        kubeconfig: Option<PathBuf>,
        /// Print the YAML that would be applied; contact no server
        #[arg(long)]
        dry_run: bool,
        /// Take over fields another field manager owns (as kubectl apply --server-side --force-conflicts)
        #[arg(long)]
        force_conflicts: bool,
        /// How long to wait for Established (0: do not wait)
        #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration)]
        wait_timeout: std::time::Duration,
    },
    /// What the supervisor runs on the cluster (Tinkerbell resources): versions, components, health
    Status {
        /// Kubeconfig file [default: the config's kube.kubeconfig, else in-cluster, $KUBECONFIG, ~/.kube/config]
        #[arg(long, value_name = "PATH")]
        kubeconfig: Option<PathBuf>,
        #[arg(short, long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Print the ServiceAccount and (Cluster)Role and binding tinkerbox needs, as YAML for kubectl apply
    Rbac {
        /// The one namespace mirrored (a Role and RoleBinding) [default: every namespace, a ClusterRole and ClusterRoleBinding]
        #[arg(short, long, value_name = "NS")]
        namespace: Option<String>,
        /// native: tinkerbox drives the BMCs; external: upstream Rufio does
        #[arg(long, value_enum, default_value_t = Role::Native)]
        rufio: Role,
        /// native: tinkerbox runs the workflows; external: upstream tink-controller does
        #[arg(long, value_enum, default_value_t = Role::Native)]
        tink: Role,
        /// Zero touch ([discovery] enabled or enroll): create Hardware and Workflows
        #[arg(long)]
        zero_touch: bool,
        /// BareMetalHosts (kube.metal3): tinkerbox is their operator, and makes their parts
        #[arg(long)]
        metal3: bool,
        /// Cleaning on release ([cleaning] on_release): hold released Hardware, make its cleaning Workflow
        #[arg(long)]
        cleaning: bool,
        #[arg(long, value_name = "NAME", default_value = "tinkerbox")]
        service_account: String,
        /// The ServiceAccount's namespace
        #[arg(long, value_name = "NS", default_value = "tinkerbell")]
        sa_namespace: String,
    },
}

#[derive(Subcommand)]
enum JobCommand {
    /// List jobs, or show one
    Get {
        name: Option<String>,
        #[arg(short, long)]
        namespace: Option<String>,
        #[arg(short, long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
}

#[derive(Subcommand)]
enum MachineCommand {
    /// Network-boot a Hardware through its BMC: allowPXE on, power off, PXE once, power on
    Netboot {
        name: String,
        #[arg(short, long)]
        namespace: Option<String>,
        #[arg(long)]
        no_wait: bool,
    },
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Print the effective configuration (defaults, file, env, --set) as TOML
    Show {
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<String>,
    },
}

/// `get`'s arguments after the kind.
#[derive(clap::Args)]
struct ListArgs {
    name: Option<String>,
    #[arg(short, long)]
    namespace: Option<String>,
    /// Every namespace
    #[arg(short = 'A', long, conflicts_with = "namespace")]
    all_namespaces: bool,
    /// Label selector for lists, as kubectl's: k=v, k!=v, k, !k, k in (a,b)
    #[arg(short = 'l', long, conflicts_with = "name")]
    selector: Option<String>,
    #[arg(short, long, value_enum, default_value_t = Output::Table)]
    output: Output,
}

/// `claim` and `release`: the host's namespace, and how they follow it.
#[derive(clap::Args)]
struct FollowArgs {
    #[arg(short, long)]
    namespace: Option<String>,
    /// Return at once, without following the host (to provisioned, or
    /// through its cleaning)
    #[arg(long)]
    no_wait: bool,
    #[arg(long, value_name = "DURATION", default_value = "30m", value_parser = humantime::parse_duration)]
    timeout: std::time::Duration,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum DescribeKind {
    #[value(alias = "workflows", alias = "wf")]
    Workflow,
    /// Metal3's host: its state, errors, operations and hardware.
    #[value(
        name = "baremetalhost",
        alias = "bmh",
        alias = "bmhost",
        alias = "baremetalhosts"
    )]
    BareMetalHost,
}

#[derive(Subcommand)]
enum HardwareCommand {
    /// Create or update Hardware from YAML/JSON (one or many documents, or a list)
    Apply {
        /// File to read, or - for standard input (repeatable)
        #[arg(short = 'f', long = "filename", required = true, value_name = "FILE")]
        files: Vec<String>,
        /// Apply every document in one transaction: all or nothing
        #[arg(long)]
        atomic: bool,
    },
    /// List Hardware, or show one
    Get {
        #[command(flatten)]
        list: ListArgs,
    },
    /// Delete a Hardware
    Delete {
        name: String,
        #[arg(short, long)]
        namespace: Option<String>,
    },
}

fn init_logging(format: LogFormat, level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(level).unwrap_or_else(|_| "info".into());
    // Colour only for a person at a terminal, not for journald or log files.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().flatten_event(true).init(),
        LogFormat::Text => builder.init(),
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    // One process-wide TLS provider, for the API server and the CLI client.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", format!("{e:#}").replace('\n', " "));
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let target = |sets: Vec<String>| Target {
        server: args.server.clone(),
        token: args.token.clone(),
        cacert: args.cacert.clone(),
        config: Sources {
            path: args.config.clone(),
            overrides: sets,
        },
    };
    match &args.command {
        Command::Serve { set } => {
            let config = Config::load(&target(set.clone()).config)?;
            init_logging(
                args.log_format.unwrap_or(config.log.format),
                &config.log.level,
            );
            tinkerbox::serve::run(config).await
        }
        Command::Config {
            command: ConfigCommand::Show { set },
        } => {
            let config = Config::load(&target(set.clone()).config)?;
            print!("{}", config.to_toml());
            Ok(())
        }
        Command::Apply { files, atomic } => cli::apply(&target(vec![]), files, *atomic, None).await,
        Command::Get { kind, list } => {
            let a = cli::objects::GetArgs {
                kind: *kind,
                name: list.name.as_deref(),
                namespace: list.namespace.as_deref(),
                all_namespaces: list.all_namespaces,
                selector: list.selector.as_deref(),
                output: list.output,
            };
            cli::objects::get(&target(vec![]), a).await
        }
        Command::Delete {
            kind,
            name,
            namespace,
        } => cli::objects::delete(&target(vec![]), *kind, name, namespace.as_deref()).await,
        Command::Claim {
            selector,
            host,
            image,
            checksum,
            checksum_type,
            format,
            user_data,
            consumer,
            follow,
        } => {
            let user_data = match user_data {
                Some(p) => Some(
                    std::fs::read_to_string(p)
                        .map_err(|e| anyhow::anyhow!("reading --user-data {}: {e}", p.display()))?,
                ),
                None => None,
            };
            cli::metal3::claim(
                &target(vec![]),
                cli::metal3::ClaimArgs {
                    namespace: follow.namespace.as_deref(),
                    selector,
                    host: host.as_deref(),
                    image,
                    checksum: checksum.as_deref(),
                    checksum_type: checksum_type.as_deref(),
                    format: format.as_deref(),
                    user_data,
                    consumer: consumer.as_deref(),
                    wait: !follow.no_wait,
                    timeout: follow.timeout,
                },
            )
            .await
        }
        Command::Release { name, follow } => {
            cli::metal3::release(
                &target(vec![]),
                name,
                follow.namespace.as_deref(),
                !follow.no_wait,
                follow.timeout,
            )
            .await
        }
        Command::Describe {
            kind: DescribeKind::Workflow,
            name,
            namespace,
        } => cli::objects::describe(&target(vec![]), name, namespace.as_deref()).await,
        Command::Describe {
            kind: DescribeKind::BareMetalHost,
            name,
            namespace,
        } => cli::objects::describe_host(&target(vec![]), name, namespace.as_deref()).await,
        Command::Hardware { command } => match command {
            HardwareCommand::Apply { files, atomic } => {
                cli::apply(&target(vec![]), files, *atomic, Some(Kind::Hardware)).await
            }
            HardwareCommand::Get { list } => {
                cli::get(
                    &target(vec![]),
                    list.name.as_deref(),
                    list.namespace.as_deref(),
                    list.all_namespaces,
                    list.selector.as_deref(),
                    list.output,
                )
                .await
            }
            HardwareCommand::Delete { name, namespace } => {
                cli::delete(&target(vec![]), name, namespace.as_deref()).await
            }
        },
        Command::Bmc { command } => {
            let t = target(vec![]);
            match command {
                BmcCommand::Apply { files } => cli::bmc::apply(&t, files).await,
                BmcCommand::Get {
                    name,
                    namespace,
                    output,
                } => cli::bmc::get(&t, name.as_deref(), namespace.as_deref(), None, *output).await,
                BmcCommand::Power {
                    name,
                    action,
                    namespace,
                    no_wait,
                } => cli::bmc::power(&t, name, namespace.as_deref(), *action, !no_wait).await,
                BmcCommand::Bootdev {
                    name,
                    device,
                    persistent,
                    efi,
                    namespace,
                    no_wait,
                } => {
                    cli::bmc::bootdev(
                        &t,
                        name,
                        namespace.as_deref(),
                        *device,
                        *persistent,
                        *efi,
                        !no_wait,
                    )
                    .await
                }
                BmcCommand::Media {
                    name,
                    url,
                    eject: _,
                    kind,
                    namespace,
                    no_wait,
                } => {
                    cli::bmc::media(
                        &t,
                        name,
                        namespace.as_deref(),
                        *kind,
                        url.as_deref(),
                        !no_wait,
                    )
                    .await
                }
                BmcCommand::Job {
                    command:
                        JobCommand::Get {
                            name,
                            namespace,
                            output,
                        },
                } => cli::bmc::jobs(&t, name.as_deref(), namespace.as_deref(), *output).await,
            }
        }
        Command::Machine {
            command:
                MachineCommand::Netboot {
                    name,
                    namespace,
                    no_wait,
                },
        } => cli::bmc::netboot(&target(vec![]), name, namespace.as_deref(), !no_wait).await,
        Command::Kube { command } => kube(&args, command).await,
        Command::Events {
            name,
            namespace,
            limit,
            output,
            follow,
        } => {
            cli::events(
                &target(vec![]),
                cli::EventsArgs {
                    name: name.as_deref(),
                    namespace: namespace.as_deref(),
                    limit: *limit,
                    output: *output,
                    follow: *follow,
                },
            )
            .await
        }
    }
}

async fn kube(args: &Args, command: &KubeCommand) -> anyhow::Result<()> {
    use tinkerbox::kube::{crds, rbac};
    match command {
        KubeCommand::InstallCrds {
            kubeconfig,
            dry_run,
            force_conflicts,
            wait_timeout,
        } => {
            if *dry_run {
                return print(&crds::dry_run_yaml(&crds::embedded()?));
            }
            let sources = Sources {
                path: args.config.clone(),
                overrides: vec![],
            };
            let opts = crds::Install {
                kube: crds::kube_config(kubeconfig.clone(), &sources)?,
                force_conflicts: *force_conflicts,
                wait: *wait_timeout,
            };
            crds::install(&opts, &mut std::io::stdout(), &mut std::io::stderr()).await
        }
        KubeCommand::Status { kubeconfig, output } => {
            use tinkerbox::kube::supervisor::view;
            let sources = Sources {
                path: args.config.clone(),
                overrides: vec![],
            };
            let items = view::fetch(&crds::kube_config(kubeconfig.clone(), &sources)?).await?;
            match output {
                Output::Json => print(&(serde_json::to_string_pretty(&items)? + "\n")),
                Output::Yaml => print(&serde_saphyr::to_string(&items)?),
                Output::Table | Output::Wide => print(&view::table(&items)),
            }
        }
        KubeCommand::Rbac {
            namespace,
            rufio,
            tink,
            zero_touch,
            metal3,
            cleaning,
            service_account,
            sa_namespace,
        } => {
            let yaml = rbac::render(&rbac::Options {
                roles: rbac::Roles {
                    tink: *tink,
                    rufio: *rufio,
                    zero_touch: *zero_touch,
                    metal3: *metal3,
                    cleaning: *cleaning,
                },
                namespace: namespace.clone(),
                service_account: service_account.clone(),
                sa_namespace: sa_namespace.clone(),
            })?;
            print(&yaml)
        }
    }
}

/// Write `text` to stdout; a reader that stopped early (`| head`) is no
/// error.
fn print(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}
