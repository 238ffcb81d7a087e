//! The one typed configuration: embedded defaults, then the TOML file, then
//! `TINKERBOX_*` environment variables, then `--set key=value` flags. Unknown
//! keys and bad values stop the start with an error naming the key.

use figment::Figment;
use figment::providers::{Format, Serialized, Toml};
use serde::{Deserialize, Serialize};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

pub const DEFAULT_CONFIG_PATH: &str = "/etc/tinkerbox/tinkerbox.toml";

/// `TINKERBOX_*` variables that belong to the CLI, not to the config.
const NOT_CONFIG: &[&str] = &["SERVER", "TOKEN", "CONFIG", "CACERT"];

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Our address in DHCP replies and boot URLs; detected when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub public_ip: Option<Ipv4Addr>,
    /// Database, API token and artifacts live here.
    pub state_dir: PathBuf,
    pub dhcp: DhcpConfig,
    pub tftp: TftpConfig,
    pub http: HttpConfig,
    pub metadata: MetadataConfig,
    pub syslog: SyslogConfig,
    pub bmc: BmcConfig,
    pub api: ApiConfig,
    pub tink: TinkConfig,
    pub events: EventsConfig,
    pub log: LogConfig,
    pub kube: KubeConfig,
    pub discovery: DiscoveryConfig,
    pub cleaning: CleaningConfig,
}

/// Cleaning on release (`cleaning/`): Hardware that CAPT gives back is
/// held, its disks wiped, then given back.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CleaningConfig {
    pub on_release: CleaningMode,
}

/// A BareMetalHost's `automatedCleaningMode` values, for Hardware.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum CleaningMode {
    /// Given back as CAPT leaves it (upstream's behaviour).
    #[default]
    Disabled,
    /// Every disk's partition tables and signatures wiped first.
    Metadata,
}

/// Zero-touch: machines nobody entered are leased an address from a pool
/// (reservation mode), boot the OSIE, and become Hardware when their agent
/// first asks for work; WorkflowRuleSets enroll them (`discovery/`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DiscoveryConfig {
    pub enabled: bool,
    /// The pool's first and last address, "10.0.0.100-10.0.0.199"
    /// (reservation mode). Unset: no pool, for networks where another DHCP
    /// server gives the addresses (`dhcp.mode = "auto-proxy"`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<PoolRange>,
    /// The pool's netmask; unset: the narrowest one holding the pool, the
    /// gateway and tinkerbox's own address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub netmask: Option<Ipv4Addr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gateway: Option<Ipv4Addr>,
    pub dns: Vec<Ipv4Addr>,
    /// A pool lease, e.g. "1h". A discovered Hardware reserves its address
    /// for good.
    #[serde(with = "human_duration")]
    pub lease_time: Duration,
    /// Who may take a pool address: empty, every netboot client; else only
    /// netboot clients whose MAC matches one of these (`52:54:00:*`).
    pub mac_patterns: Vec<String>,
    /// How long an address a client DECLINEd (in use on the wire) is kept
    /// out of the pool.
    #[serde(with = "human_duration")]
    pub decline_hold: Duration,
    /// Where discovered Hardware is created (kube mode: in the cluster).
    pub namespace: String,
    /// WorkflowRuleSets enroll agents that have no Workflow (upstream's
    /// auto enrollment); a discovered Hardware gets
    /// `spec.auto.enrollmentEnabled` from it.
    pub enroll: bool,
    /// The most discovered Hardware kept, and the most enrollment
    /// Workflows: past it nothing more is created.
    pub max_hardware: usize,
    /// The most objects (Hardware and enrollment Workflows) zero touch
    /// creates in a minute.
    pub max_per_minute: u32,
}

impl Default for DiscoveryConfig {
    fn default() -> Self {
        DiscoveryConfig {
            enabled: false,
            pool: None,
            netmask: None,
            gateway: None,
            dns: vec![],
            lease_time: Duration::from_secs(3600),
            mac_patterns: vec![],
            decline_hold: Duration::from_secs(600),
            namespace: "default".into(),
            enroll: false,
            max_hardware: 1000,
            max_per_minute: 60,
        }
    }
}

/// `first-last`, both included.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct PoolRange {
    pub first: Ipv4Addr,
    pub last: Ipv4Addr,
}

impl TryFrom<String> for PoolRange {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        let err = || format!("{s:?}: want FIRST-LAST, e.g. \"10.0.0.100-10.0.0.199\"");
        let (a, b) = s.split_once('-').ok_or_else(err)?;
        let first: Ipv4Addr = a.trim().parse().map_err(|_| err())?;
        let last: Ipv4Addr = b.trim().parse().map_err(|_| err())?;
        if u32::from(first) > u32::from(last) {
            return Err(format!("{s:?}: {last} comes before {first}"));
        }
        let size = u64::from(u32::from(last) - u32::from(first)) + 1;
        if size > crate::discovery::POOL_MAX as u64 {
            return Err(format!(
                "{s:?} holds {size} addresses; a pool serves at most {}",
                crate::discovery::POOL_MAX
            ));
        }
        Ok(PoolRange { first, last })
    }
}

impl From<PoolRange> for String {
    fn from(r: PoolRange) -> String {
        format!("{}-{}", r.first, r.last)
    }
}

impl PoolRange {
    pub fn size(&self) -> usize {
        (u32::from(self.last) - u32::from(self.first)) as usize + 1
    }

    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        (u32::from(self.first)..=u32::from(self.last)).contains(&u32::from(ip))
    }
}

impl DiscoveryConfig {
    /// The pool's netmask: as set, else the narrowest subnet holding the
    /// pool, the gateway and `server` (tinkerbox's address, which the
    /// clients must reach on the link).
    pub fn pool_netmask(&self, server: Option<Ipv4Addr>) -> Option<Ipv4Addr> {
        let r = self.pool?;
        Some(self.netmask.unwrap_or_else(|| {
            let first = u32::from(r.first);
            let differ = [Some(r.last), self.gateway, server]
                .into_iter()
                .flatten()
                .fold(0, |d, a| d | (first ^ u32::from(a)));
            Ipv4Addr::from(!(u32::MAX.checked_shr(differ.leading_zeros()).unwrap_or(0)))
        }))
    }

    fn check(&self) -> Result<(), String> {
        let bad = |k: &str, m: String| Err(format!("config key discovery.{k}: {m}"));
        if let (Some(r), Some(m)) = (self.pool, self.netmask) {
            let m = u32::from(m);
            if m.leading_ones() + m.trailing_zeros() != 32 {
                return bad("netmask", format!("{} is not a netmask", Ipv4Addr::from(m)));
            }
            if u32::from(r.first) & m != u32::from(r.last) & m {
                return bad(
                    "netmask",
                    format!("{} and {} are not in one subnet of it", r.first, r.last),
                );
            }
        }
        for p in &self.mac_patterns {
            if let Err(e) = p.parse::<crate::discovery::MacPattern>() {
                return bad("mac_patterns", e);
            }
        }
        if crate::hardware::check_dns_label(&self.namespace).is_err() {
            return bad(
                "namespace",
                format!("{:?} is not a namespace name (a DNS label)", self.namespace),
            );
        }
        if self.max_per_minute == 0 {
            return bad("max_per_minute", "must be at least 1".into());
        }
        if self.lease_time < Duration::from_secs(60) {
            return bad("lease_time", "must be at least 1m".into());
        }
        Ok(())
    }
}

/// Kubernetes mode: the cluster's Tinkerbell objects are mirrored into the
/// store and served from it (`kube/`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct KubeConfig {
    pub enabled: bool,
    /// A kubeconfig file; unset: in-cluster (a pod's service account), else
    /// `$KUBECONFIG`, else `~/.kube/config`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubeconfig: Option<PathBuf>,
    /// Mirror this namespace only; empty: every namespace.
    pub namespace: String,
    /// Who runs the cluster's Workflows: tinkerbox's engine (native), or
    /// tink-controller and tink-server on the cluster (external: tinkerbox
    /// only reads them).
    pub tink: Role,
    /// Who runs the cluster's BMC Machines, Jobs and Tasks: tinkerbox's
    /// BMC engine (native) or Rufio (external).
    pub rufio: Role,
    /// tinkerbox is the cluster's BareMetalHost operator (BMO's role, with
    /// Ironic's done by its own parts): needs Metal3's CRDs (`kube
    /// install-crds`) and Tink and Rufio native. Off by default: a cluster
    /// may run BMO, and a watch of a kind with no CRD keeps the mirror from
    /// being current.
    pub metal3: bool,
    /// The `coordination.k8s.io` Lease whose holder runs the engines (every
    /// instance mirrors and serves); empty: "tinkerbox".
    pub lease: String,
    /// Its namespace; empty: `namespace`, or "default" when that is empty.
    pub lease_namespace: String,
    /// Requests per second to the API server, on average (controller-
    /// runtime's default); 0: no limit. Watches are one request each.
    pub qps: f64,
    /// Requests sent at once before `qps` applies.
    pub burst: u32,
}

impl Default for KubeConfig {
    fn default() -> Self {
        KubeConfig {
            enabled: false,
            kubeconfig: None,
            namespace: String::new(),
            tink: Role::Native,
            rufio: Role::Native,
            metal3: false,
            lease: String::new(),
            lease_namespace: String::new(),
            qps: 20.0,
            burst: 30,
        }
    }
}

impl KubeConfig {
    pub fn lease_name(&self) -> String {
        if self.lease.is_empty() {
            "tinkerbox".into()
        } else {
            self.lease.clone()
        }
    }

    pub fn lease_namespace(&self) -> String {
        [&self.lease_namespace, &self.namespace]
            .into_iter()
            .find(|n| !n.is_empty())
            .cloned()
            .unwrap_or_else(|| "default".into())
    }
}

/// Who plays a Tinkerbell role in kube mode.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// tinkerbox does it, and writes the objects' status as upstream does.
    #[default]
    Native,
    /// An upstream controller on the cluster does it; tinkerbox only reads.
    External,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DhcpConfig {
    pub mode: crate::dhcp::Mode,
    /// Port 67; the proxy modes also listen on 4011 at the same address.
    pub listen: SocketAddr,
    /// Serve only this interface (SO_BINDTODEVICE); replies leave through it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interface: Option<String>,
    /// iPXE for x86-64 UEFI: "ipxe.efi" (own drivers) or "snponly.efi"
    /// (the firmware's network driver).
    pub efi_binary: String,
    /// Threads answering port 67 (unset: one per CPU, at most
    /// [`DHCP_AUTO_THREADS_MAX`]); see [`DhcpConfig::threads`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threads: Option<usize>,
    /// Under load, the longest the socket's reader lets requests gather
    /// before it reads and answers them all at once (`dhcp::server::Pace`):
    /// less CPU per request for this much more latency at most. "0s":
    /// never, a wake-up for each request.
    #[serde(with = "human_duration")]
    pub gather: Duration,
}

/// The most DHCP threads chosen when `dhcp.threads` is unset.
pub const DHCP_AUTO_THREADS_MAX: usize = 4;

impl DhcpConfig {
    /// How many threads answer port 67: one reads the socket, the others
    /// help when it finds a backlog (`dhcp::server::Crew`). More than one
    /// lets a burst be answered on another core while the reader waits for
    /// its CPU (taken by TFTP, HTTP or anything else on the host): with the
    /// server sharing 2 cores with the load generators at 16000-24000
    /// DORA/s (100k machines), the median reply p99 was 0.24-0.37 ms with
    /// one thread and 0.13-0.27 ms with two (BENCHMARKS.md).
    pub fn threads(&self) -> usize {
        self.threads.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map_or(1, |n| n.get())
                .min(DHCP_AUTO_THREADS_MAX)
        })
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TftpConfig {
    pub enabled: bool,
    pub listen: SocketAddr,
    /// iPXE binaries (Debian's `ipxe` package), loaded into memory at start.
    pub ipxe_dir: PathBuf,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Public, unauthenticated listener: iPXE scripts and binaries,
    /// artifacts, health, metrics.
    pub listen: SocketAddr,
    /// Served under /artifacts/ (kernels, initrds); default state_dir/artifacts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub artifacts_dir: Option<PathBuf>,
    /// Kernel parameters for the OSIE, after Smee's own (facility=, ...).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub extra_kernel_args: Vec<String>,
    /// gRPC authority of the Tink server for the OSIE (`grpc_authority=`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tink_server: Option<String>,
    /// `tinkerbell_tls=` for the OSIE.
    pub tink_server_tls: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct MetadataConfig {
    /// Proxies (CIDRs) whose X-Forwarded-For is believed.
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// Refuse requests without an IMDSv2 token (IMDSv1 off).
    pub require_token: bool,
    /// A second listener serving only the metadata, as Hegel did
    /// ("0.0.0.0:50061": CAPT's default template points cloud-init there).
    /// The metadata is always on `[http] listen` too.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<SocketAddr>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SyslogConfig {
    pub enabled: bool,
    pub listen: SocketAddr,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct BmcConfig {
    /// Each attempt of a job's task gives up after this, e.g. "20s".
    #[serde(with = "human_duration")]
    pub task_timeout: Duration,
    /// Attempts per task before the job fails (backoff 1 s, 2 s, 4 s, ...).
    pub attempts: u32,
    /// How often every BMC's power state is read ("0s": never).
    #[serde(with = "human_duration")]
    pub poll_interval: Duration,
    /// How often a Redfish BMC's inventory is read into its Hardware's
    /// `status.attributes.outOfBand` (Rufio's default, ±10%; "0s": never).
    #[serde(with = "human_duration")]
    pub inventory_interval: Duration,
}

impl Default for BmcConfig {
    fn default() -> Self {
        BmcConfig {
            task_timeout: Duration::from_secs(20),
            attempts: 3,
            poll_interval: Duration::from_secs(60),
            inventory_interval: Duration::from_secs(24 * 3600),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ApiConfig {
    /// Admin API; every request needs the bearer token.
    pub listen: SocketAddr,
    /// PEM certificate chain and key: when both are set the API speaks HTTPS.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_cert: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_key: Option<PathBuf>,
}

/// Tink's gRPC server for the workers in the OSIE.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TinkConfig {
    pub enabled: bool,
    pub listen: SocketAddr,
    /// PEM certificate chain and key: when both are set gRPC is served over
    /// TLS, and the iPXE script says `tinkerbell_tls=true`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_cert: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_key: Option<PathBuf>,
}

impl Default for TinkConfig {
    fn default() -> Self {
        TinkConfig {
            enabled: true,
            listen: SocketAddr::from(([0, 0, 0, 0], 42113)),
            tls_cert: None,
            tls_key: None,
        }
    }
}

impl TinkConfig {
    pub fn tls(&self) -> bool {
        self.tls_cert.is_some() && self.tls_key.is_some()
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct EventsConfig {
    /// Newest events kept per machine (older ones are trimmed).
    pub per_machine: u32,
    /// Events older than this are deleted, e.g. "30d", "12h".
    #[serde(with = "human_duration")]
    pub max_age: Duration,
    /// Events waiting to be written; when full, new ones are dropped (and
    /// counted) rather than slowing the packet path.
    pub queue: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    pub format: LogFormat,
    /// A tracing filter: "info", "tinkerbox=debug,sqlx=warn", ...
    pub level: String,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            public_ip: None,
            state_dir: PathBuf::from("/var/lib/tinkerbox"),
            dhcp: DhcpConfig::default(),
            tftp: TftpConfig::default(),
            http: HttpConfig::default(),
            metadata: MetadataConfig::default(),
            syslog: SyslogConfig::default(),
            bmc: BmcConfig::default(),
            api: ApiConfig::default(),
            tink: TinkConfig::default(),
            events: EventsConfig::default(),
            log: LogConfig::default(),
            kube: KubeConfig::default(),
            discovery: DiscoveryConfig::default(),
            cleaning: CleaningConfig::default(),
        }
    }
}

impl Default for DhcpConfig {
    fn default() -> Self {
        DhcpConfig {
            mode: crate::dhcp::Mode::Reservation,
            listen: SocketAddr::from(([0, 0, 0, 0], 67)),
            interface: None,
            efi_binary: "ipxe.efi".into(),
            threads: None,
            gather: crate::dhcp::server::GATHER,
        }
    }
}

impl Default for TftpConfig {
    fn default() -> Self {
        TftpConfig {
            enabled: true,
            listen: SocketAddr::from(([0, 0, 0, 0], 69)),
            ipxe_dir: PathBuf::from("/usr/lib/ipxe"),
        }
    }
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            listen: SocketAddr::from(([0, 0, 0, 0], 7080)),
            artifacts_dir: None,
            extra_kernel_args: vec![],
            tink_server: None,
            tink_server_tls: false,
        }
    }
}

impl Default for SyslogConfig {
    fn default() -> Self {
        SyslogConfig {
            enabled: true,
            listen: SocketAddr::from(([0, 0, 0, 0], 514)),
        }
    }
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 7081)),
            tls_cert: None,
            tls_key: None,
        }
    }
}

impl Default for EventsConfig {
    fn default() -> Self {
        EventsConfig {
            per_machine: 1000,
            max_age: Duration::from_secs(30 * 86400),
            queue: 65536,
        }
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            format: LogFormat::Text,
            level: "info".into(),
        }
    }
}

/// Where the configuration comes from.
#[derive(Debug, Clone, Default)]
pub struct Sources {
    /// `--config`; when `None` the default path is read if it exists.
    pub path: Option<PathBuf>,
    /// `--set key=value` overrides, applied last.
    pub overrides: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {0}: not found")]
    NotFound(PathBuf),
    #[error("{0}")]
    Invalid(String),
}

impl Config {
    pub fn load(src: &Sources) -> Result<Config, ConfigError> {
        Self::load_with_env(src, std::env::vars())
    }

    /// `load` with the environment passed in, so tests need not touch the
    /// process environment.
    pub fn load_with_env(
        src: &Sources,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        let mut fig = Figment::from(Serialized::defaults(Config::default()));
        match &src.path {
            Some(p) if !p.exists() => return Err(ConfigError::NotFound(p.clone())),
            Some(p) => fig = fig.merge(Toml::file_exact(p)),
            None if Path::new(DEFAULT_CONFIG_PATH).exists() => {
                fig = fig.merge(Toml::file_exact(DEFAULT_CONFIG_PATH))
            }
            None => {}
        }
        // Env vars come from the given list rather than the process so that
        // tests are hermetic (figment's Env provider reads the process only).
        let mut env_dict = std::collections::BTreeMap::new();
        for (k, v) in env {
            let Some(rest) = k.strip_prefix("TINKERBOX_") else {
                continue;
            };
            if NOT_CONFIG.contains(&rest) || rest.is_empty() {
                continue;
            }
            let key = env_key(rest);
            env_dict.insert(key, parse_value(&v));
        }
        for (k, v) in env_dict {
            let name = format!(
                "environment variable TINKERBOX_{}",
                k.replace('.', "_").to_uppercase()
            );
            fig = fig.merge(Layer::new(name, &k, v));
        }
        for o in &src.overrides {
            let (k, v) = o.split_once('=').ok_or_else(|| {
                ConfigError::Invalid(format!(
                    "--set {o:?}: want KEY=VALUE, e.g. api.listen=127.0.0.1:7081"
                ))
            })?;
            let k = k.trim();
            fig = fig.merge(Layer::new(format!("--set {k}"), k, parse_value(v)));
        }
        let cfg: Config = fig.extract().map_err(|e| {
            ConfigError::Invalid(
                e.into_iter()
                    .map(|e| describe(&e))
                    .collect::<Vec<_>>()
                    .join("; "),
            )
        })?;
        cfg.check()?;
        Ok(cfg)
    }

    fn check(&self) -> Result<(), ConfigError> {
        let bad = |k: &str, m: &str| Err(ConfigError::Invalid(format!("config key {k}: {m}")));
        match (&self.api.tls_cert, &self.api.tls_key) {
            (Some(_), None) => return bad("api.tls_key", "required when api.tls_cert is set"),
            (None, Some(_)) => return bad("api.tls_cert", "required when api.tls_key is set"),
            _ => {}
        }
        match (&self.tink.tls_cert, &self.tink.tls_key) {
            (Some(_), None) => return bad("tink.tls_key", "required when tink.tls_cert is set"),
            (None, Some(_)) => return bad("tink.tls_cert", "required when tink.tls_key is set"),
            _ => {}
        }
        if self.events.per_machine == 0 {
            return bad("events.per_machine", "must be at least 1");
        }
        if self.bmc.attempts == 0 {
            return bad("bmc.attempts", "must be at least 1");
        }
        if self.kube.qps.is_nan() || self.kube.qps < 0.0 || self.kube.qps.is_infinite() {
            return bad(
                "kube.qps",
                "must be a number of requests per second, 0 or more (0: no limit)",
            );
        }
        if self.kube.enabled
            && self.kube.metal3
            && (self.kube.tink != Role::Native || self.kube.rufio != Role::Native)
        {
            return bad(
                "kube.metal3",
                "BareMetalHosts are carried out with tinkerbox's own Workflows and BMC jobs: kube.tink and kube.rufio must be \"native\"",
            );
        }
        if self.kube.enabled
            && self.cleaning.on_release != CleaningMode::Disabled
            && (self.kube.tink != Role::Native || self.kube.rufio != Role::Native)
        {
            return bad(
                "cleaning.on_release",
                "the cleaning is a tinkerbox Workflow netbooted by its BMC jobs: kube.tink and kube.rufio must be \"native\"",
            );
        }
        if self.events.queue == 0 {
            return bad("events.queue", "must be at least 1");
        }
        if !self.dhcp.listen.is_ipv4() {
            return bad(
                "dhcp.listen",
                "DHCPv4 needs an IPv4 address, e.g. 0.0.0.0:67",
            );
        }
        if matches!(self.dhcp.threads, Some(n) if n == 0 || n > 64) {
            return bad(
                "dhcp.threads",
                "must be 1 to 64 (unset: one per CPU, at most 4)",
            );
        }
        if !matches!(self.dhcp.efi_binary.as_str(), "ipxe.efi" | "snponly.efi") {
            return bad("dhcp.efi_binary", "must be \"ipxe.efi\" or \"snponly.efi\"");
        }
        if let Some(ip) = self.public_ip
            && (ip.is_unspecified() || ip.is_broadcast() || ip.is_multicast())
        {
            return bad(
                "public_ip",
                "must be a unicast address the machines can reach",
            );
        }
        if self.state_dir.as_os_str().is_empty() {
            return bad("state_dir", "must not be empty");
        }
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&self.log.level) {
            return bad("log.level", &e.to_string());
        }
        if self.kube.enabled
            && self.discovery.enabled
            && !self.kube.namespace.is_empty()
            && self.discovery.namespace != self.kube.namespace
        {
            return bad(
                "discovery.namespace",
                &format!(
                    "{:?}: discovered Hardware would be made where it is not mirrored (kube.namespace is {:?}); set it to that",
                    self.discovery.namespace, self.kube.namespace
                ),
            );
        }
        self.discovery.check().map_err(ConfigError::Invalid)
    }

    /// TOML of the effective configuration (`tinkerbox config show`).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_else(|e| format!("# cannot render config: {e}\n"))
    }

    pub fn db_path(&self) -> PathBuf {
        self.state_dir.join("tinkerbox.db")
    }

    pub fn events_path(&self) -> PathBuf {
        self.state_dir.join(crate::events::log::FILE)
    }

    pub fn token_path(&self) -> PathBuf {
        self.state_dir.join("api-token")
    }

    pub fn artifacts_dir(&self) -> PathBuf {
        self.http
            .artifacts_dir
            .clone()
            .unwrap_or_else(|| self.state_dir.join("artifacts"))
    }

    /// `public_ip`, else the first IPv4 address of `dhcp.interface`, else
    /// the first non-loopback IPv4 address of the host.
    pub fn resolve_public_ip(&self) -> Result<Ipv4Addr, ConfigError> {
        if let Some(ip) = self.public_ip {
            return Ok(ip);
        }
        let addrs = if_addrs::get_if_addrs().map_err(|e| {
            ConfigError::Invalid(format!(
                "config key public_ip: unset, and listing interfaces failed: {e}"
            ))
        })?;
        let pick = addrs
            .iter()
            .find_map(|a| match (a.ip(), &self.dhcp.interface) {
                (std::net::IpAddr::V4(ip), Some(ifname)) if &a.name == ifname => Some(ip),
                (std::net::IpAddr::V4(ip), None) if !ip.is_loopback() => Some(ip),
                _ => None,
            });
        pick.ok_or_else(|| {
            ConfigError::Invalid(match &self.dhcp.interface {
                Some(i) => {
                    format!("config key public_ip: unset, and interface {i} has no IPv4 address")
                }
                None => {
                    "config key public_ip: unset, and no non-loopback IPv4 address found".into()
                }
            })
        })
    }
}

/// One override (`api.listen = ...`) with a name that errors quote.
struct Layer {
    name: String,
    dict: figment::value::Dict,
}

impl Layer {
    fn new(name: String, key: &str, value: figment::value::Value) -> Self {
        Layer {
            name,
            dict: figment::util::nest(key, value)
                .into_dict()
                .unwrap_or_default(),
        }
    }
}

impl figment::Provider for Layer {
    fn metadata(&self) -> figment::Metadata {
        figment::Metadata::named(self.name.clone())
    }

    fn data(
        &self,
    ) -> Result<figment::value::Map<figment::Profile, figment::value::Dict>, figment::Error> {
        Ok(figment::Profile::Default.collect(self.dict.clone()))
    }
}

/// The config's sections (`api`, `bmc`, ...), from the type itself: the
/// top-level keys whose values are tables when `Config::default()` is
/// serialised. Longest first, so that of two sections where one's name
/// begins with the other's and `_`, the longer one wins.
fn sections() -> &'static [String] {
    static SECTIONS: OnceLock<Vec<String>> = OnceLock::new();
    SECTIONS.get_or_init(|| {
        let tree = figment::value::Value::serialize(Config::default())
            .expect("the default config serialises"); // ok: compiled-in defaults, not input; tests load every key
        let mut sections: Vec<String> = tree
            .into_dict()
            .expect("the default config serialises to a table") // ok: Config is a struct
            .into_iter()
            .filter(|(_, v)| matches!(v, figment::value::Value::Dict(..)))
            .map(|(k, _)| k)
            .collect();
        sections.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        sections
    })
}

/// The key of `TINKERBOX_<rest>`: lower-cased, and when it begins with a
/// section's name and `_`, that section's key (`API_TLS_CERT` ->
/// `api.tls_cert`, `BMC_ATTEMPTS` -> `bmc.attempts`); else a top-level key
/// (`STATE_DIR` -> `state_dir`). So a top-level key must not begin with a
/// section's name and `_` (`every_key_is_settable_by_file_env_and_flag`
/// checks every key).
fn env_key(rest: &str) -> String {
    let lower = rest.to_ascii_lowercase();
    for s in sections() {
        if let Some(k) = lower
            .strip_prefix(s.as_str())
            .and_then(|r| r.strip_prefix('_'))
        {
            return format!("{s}.{k}");
        }
    }
    lower
}

/// A value from the environment or a flag: TOML syntax when it parses
/// (`42`, `true`, `["a"]`), else the plain string.
fn parse_value(v: &str) -> figment::value::Value {
    let parsed = format!("v = {v}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"));
    match parsed {
        Some(t) => figment::value::Value::serialize(t).unwrap_or_else(|_| v.into()),
        None => v.into(),
    }
}

/// One figment error as one line that names the key and where it came from.
fn describe(e: &figment::Error) -> String {
    let key = e.path.join(".");
    let source = e
        .metadata
        .as_ref()
        .map(|m| match &m.source {
            Some(s) => format!(" (from {s})"),
            None => format!(" (from {})", m.name),
        })
        .unwrap_or_default();
    match &e.kind {
        figment::error::Kind::UnknownField(f, _) => {
            // figment's path already ends with the unknown key, usually.
            let full = if e.path.last() == Some(f) || key.is_empty() {
                if key.is_empty() { f.clone() } else { key }
            } else {
                format!("{key}.{f}")
            };
            format!("config key {full}: unknown key{source}")
        }
        kind if key.is_empty() => format!("config: {kind}{source}"),
        kind => format!("config key {key}: {kind}{source}"),
    }
}

mod human_duration {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        humantime::parse_duration(&s).map_err(|e| {
            serde::de::Error::custom(format!("{e} in {s:?} (want e.g. \"30d\", \"12h\")"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file(body: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(body.as_bytes()).unwrap();
        f
    }

    fn load(body: &str, env: &[(&str, &str)], sets: &[&str]) -> Result<Config, ConfigError> {
        let f = file(body);
        let src = Sources {
            path: Some(f.path().to_path_buf()),
            overrides: sets.iter().map(|s| s.to_string()).collect(),
        };
        Config::load_with_env(
            &src,
            env.iter().map(|(k, v)| (k.to_string(), v.to_string())),
        )
    }

    /// The package's /etc/tinkerbox/tinkerbox.toml shows the defaults as
    /// `#key = value`: as shipped it sets nothing, and with every such line
    /// uncommented it is still exactly the defaults (so it stays true).
    #[test]
    fn discovery_is_checked() {
        let e = |body: &str| load(body, &[], &[]).unwrap_err().to_string();
        assert!(e("[discovery]\npool = \"10.0.0.9-10.0.0.1\"\n").contains("comes before"));
        assert!(e("[discovery]\npool = \"10.0.0.0-10.1.0.0\"\n").contains("at most 65536"));
        assert!(
            e("[discovery]\npool = \"10.0.0.1-10.0.1.9\"\nnetmask = \"255.255.255.0\"\n")
                .contains("not in one subnet")
        );
        assert!(e("[discovery]\nmac_patterns = [\"52:54\"]\n").contains("not a MAC pattern"));
        assert!(
            e("[kube]\nenabled = true\nnamespace = \"tink\"\n[discovery]\nenabled = true\n")
                .contains("discovery.namespace")
        );
        let c = load(
            "[discovery]\nenabled = true\npool = \"10.0.0.100-10.0.0.199\"\n",
            &[],
            &[],
        )
        .unwrap();
        assert_eq!(
            c.discovery.pool_netmask(None),
            Some(Ipv4Addr::new(255, 255, 255, 0))
        );
        // The server's address is on the clients' link too.
        let c = load(
            "[discovery]\npool = \"10.99.0.100-10.99.0.120\"\n",
            &[],
            &[],
        )
        .unwrap();
        assert_eq!(
            c.discovery.pool_netmask(None),
            Some(Ipv4Addr::new(255, 255, 255, 224))
        );
        assert_eq!(
            c.discovery.pool_netmask(Some(Ipv4Addr::new(10, 99, 0, 1))),
            Some(Ipv4Addr::new(255, 255, 255, 128))
        );
        assert_eq!(c.discovery.pool.unwrap().size(), 21);
    }

    #[test]
    fn the_packaged_config_file_shows_the_defaults() {
        let shipped = include_str!("../../systemd/tinkerbox.toml");
        let c = load(shipped, &[], &[]).unwrap();
        assert_eq!(c, Config::default());
        fn setting(l: &str) -> Option<&str> {
            l.strip_prefix('#').filter(|r| {
                r.starts_with('[')
                    || r.split_once(" =").is_some_and(|(k, _)| {
                        !k.is_empty() && k.chars().all(|c| c.is_ascii_lowercase() || c == '_')
                    })
            })
        }
        let uncommented: String = shipped
            .lines()
            .map(|l| setting(l).unwrap_or(l))
            .collect::<Vec<_>>()
            .join("\n");
        let sections = uncommented.lines().filter(|l| l.starts_with('[')).count();
        assert_eq!(sections, 13, "every section shown:\n{uncommented}");
        let c = load(&uncommented, &[], &[]).unwrap();
        assert_eq!(c, Config::default());
    }

    #[test]
    fn defaults_and_layers() {
        let c = load("", &[], &[]).unwrap();
        assert_eq!(c, Config::default());
        let c = load(
            "state_dir = \"/tmp/x\"\n[api]\nlisten = \"127.0.0.1:9000\"\n",
            &[
                ("TINKERBOX_API_LISTEN", "127.0.0.1:9001"),
                ("TINKERBOX_SERVER", "http://x"),
                ("OTHER", "1"),
            ],
            &[],
        )
        .unwrap();
        assert_eq!(c.state_dir, PathBuf::from("/tmp/x"));
        assert_eq!(c.api.listen.port(), 9001, "env beats file");
        let c = load(
            "[events]\nmax_age = \"2h\"\n",
            &[("TINKERBOX_EVENTS_PER_MACHINE", "5")],
            &["events.per_machine=7", "http.listen=127.0.0.1:1"],
        )
        .unwrap();
        assert_eq!(c.events.per_machine, 7, "flag beats env");
        assert_eq!(c.events.max_age, Duration::from_secs(7200));
        assert_eq!(c.http.listen.port(), 1);
    }

    #[test]
    fn errors_name_the_key() {
        type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a [&'a str], &'a str);
        let cases: &[Case] = &[
            ("bogus = 1\n", &[], &[], "config key bogus: unknown key"),
            ("[api]\nlisten = 5\n", &[], &[], "config key api.listen"),
            (
                "[api]\nlisten = \"nope\"\n",
                &[],
                &[],
                "config key api.listen",
            ),
            (
                "[api]\nlistne = \"x\"\n",
                &[],
                &[],
                "config key api.listne: unknown key",
            ),
            (
                "[events]\nmax_age = \"soon\"\n",
                &[],
                &[],
                "config key events.max_age",
            ),
            (
                "[log]\nformat = \"xml\"\n",
                &[],
                &[],
                "config key log.format",
            ),
            (
                "",
                &[("TINKERBOX_API_LISTNE", "x")],
                &[],
                "config key api.listne: unknown key",
            ),
            (
                "",
                &[("TINKERBOX_HTTP_LISTEN", "x")],
                &[],
                "TINKERBOX_HTTP_LISTEN",
            ),
            ("", &[], &["api.tls_cert=/x"], "config key api.tls_key"),
            (
                "",
                &[],
                &["events.per_machine=0"],
                "config key events.per_machine",
            ),
            ("", &[], &["dhcp.threads=0"], "config key dhcp.threads"),
            ("", &[], &["kube.qps=-1"], "config key kube.qps"),
            (
                "[kube]\nenabled = true\nmetal3 = true\nrufio = \"external\"\n",
                &[],
                &[],
                "config key kube.metal3",
            ),
            (
                "[kube]\nenabled = true\ntink = \"external\"\n[cleaning]\non_release = \"metadata\"\n",
                &[],
                &[],
                "config key cleaning.on_release",
            ),
            (
                "[cleaning]\non_release = \"secure\"\n",
                &[],
                &[],
                "cleaning.on_release",
            ),
            (
                "[dhcp]\nthreads = 65\n",
                &[],
                &[],
                "config key dhcp.threads",
            ),
            ("", &[], &["nokey"], "--set"),
            ("[api\n", &[], &[], "config"),
        ];
        for (body, env, sets, want) in cases {
            let err = load(body, env, sets).expect_err(body).to_string();
            assert!(
                err.contains(want),
                "{body:?} {env:?} {sets:?}: {err:?} lacks {want:?}"
            );
        }
    }

    #[test]
    fn missing_explicit_file_is_an_error() {
        let src = Sources {
            path: Some("/nonexistent/t.toml".into()),
            overrides: vec![],
        };
        assert!(matches!(
            Config::load_with_env(&src, Vec::new()),
            Err(ConfigError::NotFound(_))
        ));
    }

    /// A config with every key set to a valid value other than its
    /// default: every `Option` is `Some`, every `Vec` non-empty. The struct
    /// literals have no `..`, so a new key does not compile until it has a
    /// value here.
    fn every_key_set() -> Config {
        Config {
            public_ip: Some(Ipv4Addr::new(10, 9, 8, 7)),
            state_dir: "/srv/tinkerbox-test".into(),
            dhcp: DhcpConfig {
                mode: crate::dhcp::Mode::Proxy,
                listen: "0.0.0.0:1067".parse().unwrap(),
                interface: Some("br-test".into()),
                efi_binary: "snponly.efi".into(),
                threads: Some(3),
                gather: Duration::from_micros(300),
            },
            tftp: TftpConfig {
                enabled: false,
                listen: "127.0.0.1:1069".parse().unwrap(),
                ipxe_dir: "/opt/ipxe".into(),
            },
            http: HttpConfig {
                listen: "127.0.0.1:8080".parse().unwrap(),
                artifacts_dir: Some("/srv/artifacts".into()),
                extra_kernel_args: vec!["console=ttyS0,115200".into(), "quiet".into()],
                tink_server: Some("10.9.8.7:42113".into()),
                tink_server_tls: true,
            },
            metadata: MetadataConfig {
                trusted_proxies: vec!["10.0.0.0/8".parse().unwrap(), "fd00::/8".parse().unwrap()],
                require_token: true,
                listen: Some("0.0.0.0:50061".parse().unwrap()),
            },
            syslog: SyslogConfig {
                enabled: false,
                listen: "127.0.0.1:1514".parse().unwrap(),
            },
            bmc: BmcConfig {
                task_timeout: Duration::from_secs(45),
                attempts: 5,
                poll_interval: Duration::from_secs(300),
                inventory_interval: Duration::from_secs(7200),
            },
            api: ApiConfig {
                listen: "127.0.0.1:9081".parse().unwrap(),
                tls_cert: Some("/etc/tb/api.crt".into()),
                tls_key: Some("/etc/tb/api.key".into()),
            },
            tink: TinkConfig {
                enabled: false,
                listen: "127.0.0.1:1113".parse().unwrap(),
                tls_cert: Some("/etc/tb/tink.crt".into()),
                tls_key: Some("/etc/tb/tink.key".into()),
            },
            events: EventsConfig {
                per_machine: 50,
                max_age: Duration::from_secs(7200),
                queue: 1024,
            },
            log: LogConfig {
                format: LogFormat::Json,
                level: "debug".into(),
            },
            kube: KubeConfig {
                enabled: true,
                kubeconfig: Some("/etc/tb/kubeconfig".into()),
                namespace: "tinkerbell".into(),
                tink: Role::External,
                rufio: Role::External,
                metal3: true,
                lease: "tb-lease".into(),
                lease_namespace: "tb-system".into(),
                qps: 50.0,
                burst: 80,
            },
            discovery: DiscoveryConfig {
                enabled: true,
                pool: Some(PoolRange {
                    first: Ipv4Addr::new(10, 9, 8, 100),
                    last: Ipv4Addr::new(10, 9, 8, 199),
                }),
                netmask: Some(Ipv4Addr::new(255, 255, 255, 0)),
                gateway: Some(Ipv4Addr::new(10, 9, 8, 1)),
                dns: vec![Ipv4Addr::new(10, 9, 8, 2)],
                lease_time: Duration::from_secs(1800),
                mac_patterns: vec!["52:54:00:*".into()],
                decline_hold: Duration::from_secs(120),
                namespace: "discovered".into(),
                enroll: true,
                max_hardware: 50,
                max_per_minute: 10,
            },
            cleaning: CleaningConfig {
                on_release: CleaningMode::Metadata,
            },
        }
    }

    /// Keys that are only valid together (`check`): each is set with the
    /// others of its group.
    const TOGETHER: &[&[&str]] = &[
        &["api.tls_cert", "api.tls_key"],
        &["tink.tls_cert", "tink.tls_key"],
    ];

    /// The fields of the table at `path` ("" for the top level) as the
    /// type declares them, from the error an unknown key there gives; `None`
    /// when `path` is not a table.
    fn declared_fields(path: &str) -> Option<&'static [&'static str]> {
        let probe = match path {
            "" => "__probe".to_string(),
            p => format!("{p}.__probe"),
        };
        let err = Figment::from(Serialized::defaults(Config::default()))
            .merge(Layer::new("probe".into(), &probe, parse_value("1")))
            .extract::<Config>()
            .expect_err(&probe);
        err.into_iter().find_map(|e| match e.kind {
            figment::error::Kind::UnknownField(f, expected) if f == "__probe" => Some(expected),
            _ => None,
        })
    }

    /// Every leaf key (`state_dir`, `api.tls_cert`, ...) the type declares.
    fn declared_keys(path: &str, out: &mut Vec<String>) {
        for f in declared_fields(path).unwrap_or_else(|| panic!("{path:?} is not a table")) {
            let key = match path {
                "" => f.to_string(),
                p => format!("{p}.{f}"),
            };
            match declared_fields(&key) {
                Some(_) => declared_keys(&key, out),
                None => out.push(key),
            }
        }
    }

    /// The leaves of a serialised config, by dotted key.
    fn leaves(
        prefix: &str,
        v: &toml::Value,
        out: &mut std::collections::BTreeMap<String, toml::Value>,
    ) {
        match v {
            toml::Value::Table(t) => {
                for (k, v) in t {
                    let key = match prefix {
                        "" => k.clone(),
                        p => format!("{p}.{k}"),
                    };
                    leaves(&key, v, out);
                }
            }
            v => {
                out.insert(prefix.to_string(), v.clone());
            }
        }
    }

    /// Sets the dotted `key` in `tree`, making the tables on the way.
    fn set_key(tree: &mut toml::Table, key: &str, v: toml::Value) {
        match key.split_once('.') {
            None => {
                tree.insert(key.to_string(), v);
            }
            Some((head, rest)) => {
                let sub = tree
                    .entry(head)
                    .or_insert_with(|| toml::Value::Table(toml::Table::new()));
                set_key(sub.as_table_mut().expect(head), rest, v);
            }
        }
    }

    /// Every key the type declares, set to a non-default value through the
    /// file, its `TINKERBOX_*` variable and `--set`, in turn, lands in the
    /// config (and nothing else changes). A key added later whose variable
    /// does not reach it fails here.
    #[test]
    fn every_key_is_settable_by_file_env_and_flag() {
        let mut keys = Vec::new();
        declared_keys("", &mut keys);
        let mut full = std::collections::BTreeMap::new();
        leaves(
            "",
            &toml::Value::try_from(every_key_set()).unwrap(),
            &mut full,
        );
        let mut defaults = std::collections::BTreeMap::new();
        leaves(
            "",
            &toml::Value::try_from(Config::default()).unwrap(),
            &mut defaults,
        );
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(
            sorted,
            full.keys().cloned().collect::<Vec<_>>(),
            "every_key_set() must set every key the type declares (Option: Some)"
        );
        assert!(keys.iter().any(|k| k == "bmc.attempts"), "{keys:?}");

        let mut failed = Vec::new();
        for key in &keys {
            let value = &full[key];
            assert_ne!(
                defaults.get(key),
                Some(value),
                "{key}: every_key_set() has its default"
            );
            if let toml::Value::Array(a) = value {
                assert!(!a.is_empty(), "{key}: every_key_set() has an empty list");
            }
            let group: Vec<&str> = TOGETHER
                .iter()
                .find(|g| g.contains(&key.as_str()))
                .map_or(vec![], |g| g.iter().copied().filter(|k| k != key).collect());
            let mut base = toml::Table::new();
            for k in &group {
                set_key(&mut base, k, full[*k].clone());
            }
            let mut with_key = base.clone();
            set_key(&mut with_key, key, value.clone());
            let mut want = toml::Value::try_from(Config::default())
                .unwrap()
                .as_table()
                .unwrap()
                .clone();
            for k in group.iter().copied().chain([key.as_str()]) {
                set_key(&mut want, k, full[k].clone());
            }
            let want: Config = toml::Value::Table(want).try_into().unwrap();

            // A string as a person types it; anything else in TOML syntax.
            let text = match value {
                toml::Value::String(s) => s.clone(),
                v => v.to_string(),
            };
            let var = format!("TINKERBOX_{}", key.replace('.', "_").to_ascii_uppercase());
            if NOT_CONFIG.contains(&&var["TINKERBOX_".len()..]) {
                failed.push(format!("{key}: {var} belongs to the CLI"));
            }
            let base = toml::to_string(&base).unwrap();
            let tries = [
                ("file", load(&toml::to_string(&with_key).unwrap(), &[], &[])),
                (
                    var.as_str(),
                    load(&base, &[(var.as_str(), text.as_str())], &[]),
                ),
                ("--set", load(&base, &[], &[&format!("{key}={text}")])),
            ];
            for (how, got) in tries {
                match got {
                    Ok(c) if c == want => {}
                    Ok(c) => failed.push(format!("{key} by {how} = {text}: got {c:?}")),
                    Err(e) => failed.push(format!("{key} by {how} = {text}: {e}")),
                }
            }
        }
        assert!(
            failed.is_empty(),
            "{} failed:\n{}",
            failed.len(),
            failed.join("\n")
        );
    }

    #[test]
    fn env_names_map_to_keys() {
        for (var, key) in [
            ("STATE_DIR", "state_dir"),
            ("PUBLIC_IP", "public_ip"),
            ("API_TLS_CERT", "api.tls_cert"),
            ("DHCP_EFI_BINARY", "dhcp.efi_binary"),
            ("HTTP_TINK_SERVER", "http.tink_server"),
            ("HTTP_TINK_SERVER_TLS", "http.tink_server_tls"),
            ("BMC_ATTEMPTS", "bmc.attempts"),
            ("BMC_POLL_INTERVAL", "bmc.poll_interval"),
            ("LOG_LEVEL", "log.level"),
        ] {
            assert_eq!(env_key(var), key, "TINKERBOX_{var}");
        }
        let c = load("", &[("TINKERBOX_BMC_ATTEMPTS", "5")], &[]).unwrap();
        assert_eq!(c.bmc.attempts, 5);
    }

    #[test]
    fn show_round_trips() {
        let c = load("[api]\ntls_cert = \"/c\"\ntls_key = \"/k\"\n", &[], &[]).unwrap();
        let again = load(&c.to_toml(), &[], &[]).unwrap();
        assert_eq!(c, again);
    }
}
