//! `tinkerbox serve`: open the store, build the inventory, bind every
//! listener, then tell systemd we are ready; stop cleanly on SIGTERM/SIGINT.

use crate::app::App;
use crate::config::Config;
use crate::events;
use crate::inventory::{Inventory, Snapshot};
use crate::metrics::Metrics;
use crate::services::{BmcService, HardwareService, Services, WorkflowService};
use crate::store::Store;
use crate::{api, bmc, dhcp, http, syslog, tftp, token};
use anyhow::Context;
use sd_notify::NotifyState;
use std::os::unix::fs::DirBuilderExt;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

pub async fn run(config: Config) -> anyhow::Result<()> {
    let started = Instant::now();
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o750)
        .create(&config.state_dir)
        .with_context(|| format!("state_dir {}: cannot create", config.state_dir.display()))?;
    let token: Arc<str> = token::load_or_create(&config.token_path())
        .with_context(|| format!("api token {}", config.token_path().display()))?
        .into();
    let (app, bmc, writer) = open(&config, started).await?;
    let n = app.inventory.snapshot().len();
    // In kube mode an external role is an upstream controller's: its
    // engine does not run here.
    let native = |r: crate::config::Role| !config.kube.enabled || r == crate::config::Role::Native;
    let (tink, rufio) = (native(config.kube.tink), native(config.kube.rufio));
    let metal3_in_cluster = config.kube.enabled && config.kube.metal3;
    let clients = match &app.kube {
        Some(_) => {
            Some(crate::kube::client::clients(&config.kube, Some(app.metrics.clone())).await?)
        }
        None => None,
    };
    let client = clients.as_ref().map(|c| c.requests.clone());
    // Kube mode: the services reach the cluster through their port.
    let port = client.as_ref().map(|c| {
        let cluster = Arc::new(
            crate::kube::writer::Cluster::new(c.clone()).with_metrics(app.metrics.clone()),
        );
        Arc::new(crate::kube::writer::Port::new(cluster, app.store.clone()))
    });
    if let Some(p) = &port {
        app.services.link.connect(p.clone());
    }
    let mirror_port = port.clone();
    // The writers: what one instance at a time runs (kube mode: the
    // leader's), started again whenever this instance wins the Lease.
    let writers = {
        // The runner moves in: it holds an event sender, and the event
        // writer ends only when the last one is gone.
        let (app, poll) = (app.clone(), config.bmc.poll_interval);
        let inventory_every = config.bmc.inventory_interval;
        let cleaning = config.cleaning.on_release != crate::config::CleaningMode::Disabled;
        let supervisor = client
            .clone()
            .map(|client| crate::kube::supervisor::run::Supervisor {
                client,
                roles: crate::kube::rbac::Roles {
                    tink: config.kube.tink,
                    rufio: config.kube.rufio,
                    zero_touch: config.discovery.enabled || config.discovery.enroll,
                    metal3: metal3_in_cluster,
                    cleaning,
                },
                events: app.events.clone(),
            });
        move || {
            let mut t = vec![];
            // Kube mode: the leader supervises the cluster's Tinkerbell
            // resources (Tink and Rufio when they are external).
            if let Some(s) = &supervisor {
                t.push(tokio::spawn(s.clone().run()));
            }
            if tink {
                let engine =
                    crate::workflow::engine::Engine::new(app.store.clone(), app.services.clone());
                t.push(tokio::spawn(engine.run()));
            }
            if rufio {
                t.push(tokio::spawn(bmc.clone().run()));
                if !poll.is_zero() {
                    t.push(tokio::spawn(bmc.clone().poll(poll)));
                }
                if !inventory_every.is_zero() {
                    t.push(tokio::spawn(bmc.clone().inspect(inventory_every)));
                }
            }
            // BareMetalHosts: carried out with both engines' parts (kube
            // mode: when tinkerbox is their operator there).
            if tink && rufio && (app.kube.is_none() || metal3_in_cluster) {
                let c = crate::metal3::controller::Controller::new(
                    app.store.clone(),
                    app.services.clone(),
                    app.http_base(),
                );
                t.push(tokio::spawn(c.run()));
            }
            // Hardware CAPT releases: cleaned with both engines' parts.
            if tink && rufio && cleaning {
                let c = crate::cleaning::controller::Controller::new(
                    app.store.clone(),
                    app.services.clone(),
                );
                t.push(tokio::spawn(c.run()));
            }
            if let Some(p) = &port
                && (tink || rufio)
            {
                let pusher = crate::kube::writer::Pusher::new(p.clone(), tink, rufio);
                t.push(tokio::spawn(pusher.run()));
            }
            t
        }
    };
    // Bind everything before READY, so a port clash fails the start.
    let running = listen(&app, token).await?;
    // Kubernetes mode: the store already serves the last mirror; the
    // watches bring it up to date when (and whenever) the cluster answers.
    let mut kube_tasks = vec![];
    let mut host_writers = vec![];
    let stop_leading = Arc::new(tokio::sync::Notify::new());
    let mut lead_task = None;
    match (&app.kube, clients, mirror_port) {
        (Some(sync), Some(clients), Some(port)) => {
            let namespace = config.kube.namespace.clone();
            let kinds = crate::kube::mirror::kinds(&config.kube, config.discovery.enroll);
            let mirror = crate::kube::mirror::Mirror {
                services: app.services.clone(),
                port,
                sync: sync.clone(),
                metrics: app.metrics.clone(),
                events: app.events.clone(),
                tink_external: !tink,
                rufio_external: !rufio,
            };
            kube_tasks.extend(mirror.spawn(clients.watches.clone(), &namespace, &kinds));
            kube_tasks.push(tokio::spawn(crate::kube::supervisor::run::follow(
                clients.watches.clone(),
                sync.tink_address.clone(),
            )));
            let lease_ns = config.kube.lease_namespace();
            let election = crate::kube::lead::Election {
                api: kube::Api::namespaced(clients.lease.clone(), &lease_ns),
                name: config.kube.lease_name(),
                namespace: lease_ns,
                identity: crate::kube::lead::identity(),
                // Where followers forward the worker API to.
                address: (tink && config.tink.enabled)
                    .then(|| format!("{}:{}", app.public_ip, config.tink.listen.port())),
            };
            let requests = clients.requests.clone();
            let hooks = crate::kube::lead::Hooks {
                sync: sync.clone(),
                metrics: app.metrics.clone(),
                events: app.events.clone(),
                stop: stop_leading.clone(),
                start: writers,
                resync: move || {
                    let (mirror, client, namespace, kinds) = (
                        mirror.clone(),
                        requests.clone(),
                        namespace.clone(),
                        kinds.clone(),
                    );
                    async move { mirror.resync(client, &namespace, &kinds).await }
                },
            };
            lead_task = Some(tokio::spawn(crate::kube::lead::run(election, hooks)));
        }
        _ => {
            host_writers = writers();
            // It holds the runner and the app: event senders, which the
            // event writer waits for at the stop.
            drop(writers);
        }
    }
    let scheme = if config.api.tls_cert.is_some() {
        "https"
    } else {
        "http"
    };
    tracing::info!(
        public_ip = %app.public_ip,
        dhcp = config.dhcp.mode.as_str(),
        tftp = config.tftp.enabled,
        syslog = config.syslog.enabled,
        http = %config.http.listen,
        api = %format!("{scheme}://{}", config.api.listen),
        hardware = n,
        startup_ms = started.elapsed().as_millis() as u64,
        "tinkerbox ready"
    );
    let _ = sd_notify::notify(&[
        NotifyState::Ready,
        NotifyState::Status(&format!("serving {n} hardware")),
    ]);
    let watchdog =
        sd_notify::watchdog_enabled().map(|every| tokio::spawn(watchdog(app.store.clone(), every)));

    shutdown_signal().await;
    tracing::info!("stopping");
    let _ = sd_notify::notify(&[NotifyState::Stopping]);
    if let Some(w) = watchdog {
        w.abort();
    }
    for t in &host_writers {
        t.abort();
    }
    if let Some(t) = lead_task {
        // Stops the engines and releases the Lease for a follower.
        stop_leading.notify_one();
        let abort = t.abort_handle();
        if tokio::time::timeout(Duration::from_secs(6), t)
            .await
            .is_err()
        {
            abort.abort();
        }
    }
    for t in &kube_tasks {
        t.abort();
    }
    let (store, event_log) = (app.store.clone(), app.event_log.clone());
    stop(running, app, writer).await;
    event_log.close().await;
    store.close().await;
    Ok(())
}

/// Open the store and the event log, load the inventory, start the event
/// writer, and put together what the listeners share.
async fn open(
    config: &Config,
    started: Instant,
) -> anyhow::Result<(
    Arc<App>,
    Arc<bmc::jobs::Runner>,
    tokio::sync::oneshot::Receiver<()>,
)> {
    let store = Store::open(&config.db_path())
        .await
        .with_context(|| format!("opening {}", config.db_path().display()))?;
    let machines = store.load_machines().await?;
    let n = machines.len();
    let inventory = Arc::new(Inventory::new(Snapshot::build(machines)));
    tracing::info!(
        hardware = n,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "inventory loaded"
    );
    let event_log = events::EventLog::open(&config.events_path())
        .await
        .with_context(|| format!("opening {}", config.events_path().display()))?;
    let metrics = Arc::new(Metrics::new());
    let (sink, rx) = events::channel(config.events.queue, metrics.clone());
    let feed = events::Feed::default();
    let writer = events::spawn_writer(
        rx,
        event_log.clone(),
        feed.clone(),
        metrics.clone(),
        config.events.per_machine,
        config.events.max_age,
    )
    .context("starting the event writer")?;
    let public_ip = config.resolve_public_ip()?;
    let files = tftp::Files::load(&config.tftp.ipxe_dir)
        .with_context(|| format!("tftp.ipxe_dir {}", config.tftp.ipxe_dir.display()))?;
    if files.is_empty() {
        tracing::warn!(dir = %config.tftp.ipxe_dir.display(), "no iPXE binaries found (Debian: apt-get install ipxe); PXE clients cannot boot");
    }
    let wake = Arc::new(tokio::sync::Notify::new());
    let link = Arc::new(crate::services::Link::default());
    let services = Arc::new(Services {
        hardware: HardwareService::new(
            store.clone(),
            inventory.clone(),
            sink.clone(),
            metrics.clone(),
        )
        .with_link(link.clone()),
        bmc: BmcService::new(store.clone(), sink.clone(), wake).with_link(link.clone()),
        workflow: WorkflowService::new(
            store.clone(),
            sink.clone(),
            metrics.clone(),
            Arc::new(tokio::sync::Notify::new()),
        )
        .with_link(link.clone()),
        discovery: crate::services::Discovery::new(config.discovery.clone(), public_ip),
        metal3: crate::services::metal3::Metal3Service::new(store.clone(), sink.clone())
            .with_link(link.clone()),
        link,
    });
    let bmc = Arc::new(bmc::jobs::Runner::new(
        services.clone(),
        store.clone(),
        inventory.clone(),
        sink.clone(),
        config.bmc.task_timeout,
        config.bmc.attempts,
    ));
    let app = Arc::new(App {
        config: config.clone(),
        public_ip,
        files,
        tokens: crate::metadata::token::Tokens::new()
            .map_err(|_| anyhow::anyhow!("the system's random number generator failed"))?,
        store,
        inventory,
        events: sink,
        event_log,
        feed,
        metrics,
        services,
        kube: config.kube.enabled.then(|| {
            let kinds: Vec<&'static str> =
                crate::kube::mirror::kinds(&config.kube, config.discovery.enroll)
                    .into_iter()
                    .map(crate::kube::mirror::kind_name)
                    .collect();
            Arc::new(crate::kube::Sync::new(&kinds))
        }),
    });
    Ok((app, bmc, writer))
}

/// What is serving, for [`stop`].
struct Running {
    /// Tink's gRPC server, when enabled.
    tink_task: Option<(
        axum_server::Handle<std::net::SocketAddr>,
        tokio::task::JoinHandle<std::io::Result<()>>,
    )>,
    udp_tasks: Vec<tokio::task::JoinHandle<()>>,
    dhcp_stop: Arc<std::sync::atomic::AtomicBool>,
    dhcp_threads: Vec<std::thread::JoinHandle<()>>,
    stop_tx: watch::Sender<bool>,
    http_task: tokio::task::JoinHandle<std::io::Result<()>>,
    /// `[metadata] listen` (Hegel's port), when set.
    metadata_task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
    api_handle: axum_server::Handle<std::net::SocketAddr>,
    api_task: tokio::task::JoinHandle<std::io::Result<()>>,
}

/// Bind and start every listener.
async fn listen(app: &Arc<App>, token: Arc<str>) -> anyhow::Result<Running> {
    let config = &app.config;
    let http_sock = tokio::net::TcpListener::bind(config.http.listen)
        .await
        .with_context(|| format!("http.listen {}: cannot bind", config.http.listen))?;
    let dhcp_stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let dhcp_threads = start_dhcp(app, &dhcp_stop).await?;
    let mut udp_tasks = Vec::new();
    if config.tftp.enabled {
        let sock = std::net::UdpSocket::bind(config.tftp.listen)
            .with_context(|| format!("tftp.listen {}: cannot bind", config.tftp.listen))?;
        let handler = tftp::MemHandler {
            files: app.files.clone(),
            inventory: app.inventory.clone(),
            events: app.events.clone(),
            metrics: app.metrics.clone(),
        };
        udp_tasks.push(tokio::spawn(tftp::serve(sock, config.tftp.listen, handler)));
    }
    if config.syslog.enabled {
        let sock = tokio::net::UdpSocket::bind(config.syslog.listen)
            .await
            .with_context(|| format!("syslog.listen {}: cannot bind", config.syslog.listen))?;
        udp_tasks.push(tokio::spawn(syslog::serve(
            sock,
            app.inventory.clone(),
            app.events.clone(),
            app.metrics.clone(),
        )));
    }
    let api_sock = std::net::TcpListener::bind(config.api.listen)
        .with_context(|| format!("api.listen {}: cannot bind", config.api.listen))?;
    api_sock.set_nonblocking(true)?;

    let (stop_tx, stop_rx) = watch::channel(false);
    let http_app = http::router(app.clone());
    // Plain artifact downloads are sent with sendfile; everything else
    // (or the rest of a connection) goes to axum.
    let (http_listener, fast_conns) =
        http::sendfile::listen(http_sock, app.clone(), stop_rx.clone());
    let mut http_stop = stop_rx.clone();
    let http_task = tokio::spawn(async move {
        let served = axum::serve(
            http_listener,
            http_app.into_make_service_with_connect_info::<std::net::SocketAddr>(),
        )
        .with_graceful_shutdown(async move {
            let _ = http_stop.wait_for(|s| *s).await;
        })
        .await;
        fast_conns.wait().await;
        served
    });

    let metadata_task = match config.metadata.listen {
        None => None,
        Some(addr) => {
            let sock = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("metadata.listen {addr}: cannot bind"))?;
            // Only the metadata, as Hegel served it.
            let router = http::counted(
                crate::metadata::http::router::<()>(app.clone())
                    .fallback(|| async { (axum::http::StatusCode::NOT_FOUND, "not found\n") }),
                app.metrics.clone(),
                "metadata",
            );
            let mut stop = stop_rx.clone();
            Some(tokio::spawn(async move {
                axum::serve(
                    sock,
                    router.into_make_service_with_connect_info::<std::net::SocketAddr>(),
                )
                .with_graceful_shutdown(async move {
                    let _ = stop.wait_for(|s| *s).await;
                })
                .await
            }))
        }
    };

    // The web UI beside the admin API, on its listener (its own login:
    // the API's bearer check does not cover it).
    let tls = config.api.tls_cert.is_some() && config.api.tls_key.is_some();
    let api_app =
        api::router(app.clone(), token.clone()).merge(crate::ui::router(app.clone(), token, tls));
    let api_handle = axum_server::Handle::<std::net::SocketAddr>::new();
    let api_task = match (&config.api.tls_cert, &config.api.tls_key) {
        (Some(cert), Some(key)) => {
            let tls = rustls_config(cert, key, "api").await?;
            let server = axum_server::from_tcp_rustls(api_sock, tls)?.handle(api_handle.clone());
            tokio::spawn(async move { server.serve(api_app.into_make_service()).await })
        }
        _ => {
            let server = axum_server::from_tcp(api_sock)?.handle(api_handle.clone());
            tokio::spawn(async move { server.serve(api_app.into_make_service()).await })
        }
    };

    let tink_task = if config.tink.enabled {
        // Kube mode with Tink native: a follower forwards to the leader.
        let forwarder = match &app.kube {
            Some(sync) if config.kube.tink == crate::config::Role::Native => Some(
                crate::grpc::forward::Forwarder::new(sync.clone(), config.tink.tls()),
            ),
            _ => None,
        };
        Some(serve_tink(app.clone(), &config.tink, forwarder).await?)
    } else {
        None
    };

    Ok(Running {
        tink_task,
        udp_tasks,
        dhcp_stop,
        dhcp_threads,
        stop_tx,
        http_task,
        metadata_task,
        api_handle,
        api_task,
    })
}

/// A listener's certificate and key (`[table] tls_cert`, `tls_key`).
async fn rustls_config(
    cert: &std::path::Path,
    key: &std::path::Path,
    table: &str,
) -> anyhow::Result<axum_server::tls_rustls::RustlsConfig> {
    axum_server::tls_rustls::RustlsConfig::from_pem_file(cert, key)
        .await
        .with_context(|| {
            format!(
                "{table}.tls_cert/{table}.tls_key ({}, {})",
                cert.display(),
                key.display()
            )
        })
}

/// Tink's gRPC API (HTTP/2, optionally TLS) on `[tink] listen`.
async fn serve_tink(
    app: Arc<App>,
    tink: &crate::config::TinkConfig,
    forwarder: Option<Arc<crate::grpc::forward::Forwarder>>,
) -> anyhow::Result<(
    axum_server::Handle<std::net::SocketAddr>,
    tokio::task::JoinHandle<std::io::Result<()>>,
)> {
    let sock = std::net::TcpListener::bind(tink.listen)
        .with_context(|| format!("tink.listen {}: cannot bind", tink.listen))?;
    sock.set_nonblocking(true)?;
    let mut router = tonic::service::Routes::new(crate::grpc::service(app)).into_axum_router();
    if let Some(f) = forwarder {
        router = router.layer(axum::middleware::from_fn_with_state(
            f,
            crate::grpc::forward::forward,
        ));
    }
    let handle = axum_server::Handle::<std::net::SocketAddr>::new();
    let task = match (&tink.tls_cert, &tink.tls_key) {
        (Some(cert), Some(key)) => {
            let tls = rustls_config(cert, key, "tink").await?;
            // TCP_NODELAY, as gRPC servers set it: an answer is several
            // small HTTP/2 frames, none of which should wait for an ACK.
            let acceptor = axum_server::tls_rustls::RustlsAcceptor::new(tls)
                .acceptor(axum_server::accept::NoDelayAcceptor::new());
            let server = axum_server::from_tcp(sock)?
                .acceptor(acceptor)
                .handle(handle.clone());
            tokio::spawn(async move { server.serve(router.into_make_service()).await })
        }
        _ => {
            let server = axum_server::from_tcp(sock)?
                .acceptor(axum_server::accept::NoDelayAcceptor::new())
                .handle(handle.clone());
            tokio::spawn(async move { server.serve(router.into_make_service()).await })
        }
    };
    Ok((handle, task))
}

/// The DHCP socket threads (none when `dhcp.mode = off`), and the
/// discovery pool's (joined last: the socket threads hold its channel).
async fn start_dhcp(
    app: &Arc<App>,
    dhcp_stop: &Arc<std::sync::atomic::AtomicBool>,
) -> anyhow::Result<Vec<std::thread::JoinHandle<()>>> {
    let config = &app.config;
    let mut dhcp_threads = Vec::new();
    if config.dhcp.mode != dhcp::Mode::Off {
        let iface = config.dhcp.interface.as_deref();
        let sock = dhcp::server::bind(config.dhcp.listen, iface)
            .with_context(|| format!("dhcp.listen {}: cannot bind", config.dhcp.listen))?;
        let mut pool_thread = None;
        let pool = match (
            config.dhcp.mode,
            config.discovery.enabled,
            config.discovery.pool,
        ) {
            (dhcp::Mode::Reservation, true, Some(range)) => {
                let (handoff, thread) =
                    start_pool(app, range, sock.try_clone()?, dhcp_stop).await?;
                pool_thread = Some(thread);
                Some(handoff)
            }
            (mode, true, Some(_)) => {
                tracing::warn!(
                    mode = mode.as_str(),
                    "discovery.pool is leased only in dhcp.mode = \"reservation\"; unknown machines get no address from tinkerbox"
                );
                None
            }
            _ => None,
        };
        let shell = Arc::new(dhcp::server::Shell {
            inventory: app.inventory.clone(),
            settings: app.dhcp_settings(),
            events: app.events.clone(),
            metrics: app.metrics.clone(),
            pool,
            gather: config.dhcp.gather,
        });
        // One thread reads the socket; the others help only when it finds
        // a backlog (dhcp::server::Crew).
        let crew = Arc::new(dhcp::server::Crew::default());
        for i in 0..config.dhcp.threads() {
            let role = if i == 0 {
                dhcp::server::Role::Reader
            } else {
                dhcp::server::Role::Helper
            };
            dhcp_threads.push(shell.clone().spawn(
                sock.try_clone()?,
                dhcp::Port::Dhcp,
                role,
                crew.clone(),
                dhcp_stop.clone(),
            )?);
        }
        if config.dhcp.mode.is_proxy() {
            let addr = std::net::SocketAddr::new(config.dhcp.listen.ip(), dhcp::PROXY_PORT);
            let sock = dhcp::server::bind(addr, iface)
                .with_context(|| format!("dhcp proxy port {addr}: cannot bind"))?;
            dhcp_threads.push(shell.spawn(
                sock,
                dhcp::Port::Proxy,
                dhcp::server::Role::Reader,
                Arc::new(dhcp::server::Crew::default()),
                dhcp_stop.clone(),
            )?);
        }
        dhcp_threads.extend(pool_thread);
    }
    Ok(dhcp_threads)
}

/// The discovery pool's thread, its pool loaded from the store (leases and
/// holds that ended are dropped).
async fn start_pool(
    app: &Arc<App>,
    range: crate::config::PoolRange,
    sock: std::net::UdpSocket,
    stop: &Arc<std::sync::atomic::AtomicBool>,
) -> anyhow::Result<(dhcp::discovery::Handoff, std::thread::JoinHandle<()>)> {
    let d = &app.config.discovery;
    let now = crate::clock::now_ms();
    let mut pool = crate::discovery::pool::Pool::new(range, d.lease_time, d.decline_hold);
    let rows = app
        .store
        .load_discovery_pool(now)
        .await
        .context("loading the discovery pool's leases")?;
    tracing::info!(pool = %String::from(range), leases = rows.len(), "discovery pool loaded");
    pool.load(rows, now);
    let thread = dhcp::discovery::PoolThread {
        pool,
        sock,
        inventory: app.inventory.clone(),
        settings: app.dhcp_settings(),
        pool_settings: dhcp::pool::PoolSettings::from_config(d, app.public_ip),
        store: app.store.clone(),
        runtime: tokio::runtime::Handle::current(),
        events: app.events.clone(),
        metrics: app.metrics.clone(),
    };
    thread
        .spawn(stop.clone())
        .context("starting the discovery pool thread")
}

/// Stop serving within one deadline, inside systemd's `TimeoutStopSec=20s`,
/// and let the event writer drain what the listeners left.
async fn stop(r: Running, app: Arc<App>, writer: tokio::sync::oneshot::Receiver<()>) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    for t in &r.udp_tasks {
        t.abort();
    }
    // The DHCP threads see the flag within their receive timeout; they hold
    // event senders, so the writer below waits for them to go.
    r.dhcp_stop
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let threads = r.dhcp_threads;
    let dhcp_joined = tokio::task::spawn_blocking(move || {
        for t in threads {
            if t.join().is_err() {
                tracing::error!("a DHCP thread panicked");
            }
        }
    });
    let _ = r.stop_tx.send(true);
    r.api_handle.graceful_shutdown(Some(Duration::from_secs(5)));
    if let Some((h, _)) = &r.tink_task {
        h.graceful_shutdown(Some(Duration::from_secs(5)));
    }
    let _ = tokio::time::timeout_at(deadline, r.http_task).await;
    if let Some(t) = r.metadata_task {
        let _ = tokio::time::timeout_at(deadline, t).await;
    }
    let _ = tokio::time::timeout_at(deadline, r.api_task).await;
    if let Some((_, t)) = r.tink_task {
        let _ = tokio::time::timeout_at(deadline, t).await;
    }
    let _ = tokio::time::timeout_at(deadline, dhcp_joined).await;
    // The last sender goes with the app: the writer then drains and exits.
    drop(app);
    if tokio::time::timeout_at(deadline, writer).await.is_err() {
        tracing::warn!("event writer did not finish in time; unwritten events are lost");
    }
}

/// Feed systemd's watchdog at half its period, but only while the store
/// answers: a wedged database should get the service restarted.
async fn watchdog(store: Store, period: Duration) {
    let mut tick = tokio::time::interval(period / 2);
    loop {
        tick.tick().await;
        match tokio::time::timeout(period / 4, store.ping()).await {
            Ok(Ok(())) => {
                let _ = sd_notify::notify(&[NotifyState::Watchdog]);
            }
            Ok(Err(e)) => tracing::error!(error = %e, "watchdog: store check failed"),
            Err(_) => tracing::error!("watchdog: store check timed out"),
        }
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
