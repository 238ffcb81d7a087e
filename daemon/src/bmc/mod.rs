//! BMC control: power and boot device over IPMI (RMCP+) and Redfish, as
//! Rufio does with bmclib. The protocol clients share one small vocabulary
//! (this module); jobs of ordered tasks drive them.

/// `pub struct $ty`, the [`Protocol`] whose calls are the invoking
/// module's `power`, `set_boot_device` and `virtual_media` functions.
macro_rules! protocol {
    ($ty:ident, $name:literal) => {
        #[doc = concat!("The ", $name, " protocol, for the job runner.")]
        pub struct $ty;

        impl super::Protocol for $ty {
            fn name(&self) -> &'static str {
                $name
            }

            fn power<'a>(
                &'a self,
                t: &'a Target,
                action: PowerAction,
            ) -> super::Call<'a, PowerState> {
                Box::pin(power(t, action))
            }

            fn set_boot_device<'a>(
                &'a self,
                t: &'a Target,
                dev: BootDevice,
                persistent: bool,
                efi: bool,
            ) -> super::Call<'a, ()> {
                Box::pin(set_boot_device(t, dev, persistent, efi))
            }

            fn virtual_media<'a>(
                &'a self,
                t: &'a Target,
                kind: super::model::MediaKind,
                url: &'a str,
            ) -> super::Call<'a, ()> {
                Box::pin(virtual_media(t, kind, url))
            }
        }
    };
}

pub mod inventory;
pub mod ipmi;
pub mod jobs;
pub mod model;
pub mod redfish;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

/// What a protocol call returns: boxed, so that protocols can sit behind
/// one trait object.
pub type Call<'a, T> = Pin<Box<dyn Future<Output = Result<T, BmcError>> + Send + 'a>>;

/// A way to talk to a BMC: what a job's tasks need of it.
pub trait Protocol: Send + Sync {
    /// `ipmi` or `redfish`, for status and events.
    fn name(&self) -> &'static str;

    /// Carry out a power action (or read the state, `Status`); the state
    /// it leads to.
    fn power<'a>(&'a self, t: &'a Target, action: PowerAction) -> Call<'a, PowerState>;

    /// Set the next boot device (`persistent`: every boot, else once).
    fn set_boot_device<'a>(
        &'a self,
        t: &'a Target,
        dev: BootDevice,
        persistent: bool,
        efi: bool,
    ) -> Call<'a, ()>;

    /// Insert `url` into the virtual media of `kind` (eject what is in it
    /// first), or eject it when `url` is empty.
    fn virtual_media<'a>(
        &'a self,
        t: &'a Target,
        kind: model::MediaKind,
        url: &'a str,
    ) -> Call<'a, ()>;
}

/// Rufio's power states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PowerState {
    On,
    Off,
    Unknown,
}

impl PowerState {
    pub fn as_str(self) -> &'static str {
        match self {
            PowerState::On => "on",
            PowerState::Off => "off",
            PowerState::Unknown => "unknown",
        }
    }

    /// As stored; anything else is `Unknown`.
    pub fn from_str_lossy(s: &str) -> PowerState {
        match s {
            "on" => PowerState::On,
            "off" => PowerState::Off,
            _ => PowerState::Unknown,
        }
    }
}

/// Rufio's `powerAction` values.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum PowerAction {
    On,
    Off,
    Soft,
    Cycle,
    Reset,
    Status,
}

impl PowerAction {
    pub fn as_str(self) -> &'static str {
        match self {
            PowerAction::On => "on",
            PowerAction::Off => "off",
            PowerAction::Soft => "soft",
            PowerAction::Cycle => "cycle",
            PowerAction::Reset => "reset",
            PowerAction::Status => "status",
        }
    }
}

/// Rufio's boot devices.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum BootDevice {
    Pxe,
    Disk,
    Bios,
    Cdrom,
}

impl BootDevice {
    pub fn as_str(self) -> &'static str {
        match self {
            BootDevice::Pxe => "pxe",
            BootDevice::Disk => "disk",
            BootDevice::Bios => "bios",
            BootDevice::Cdrom => "cdrom",
        }
    }
}

/// Where and how to reach one BMC.
#[derive(Clone)]
pub struct Target {
    pub host: String,
    /// Protocol default when `None` (IPMI 623, Redfish 443).
    pub port: Option<u16>,
    pub username: String,
    pub password: String,
    /// Redfish: accept a self-signed certificate.
    pub insecure_tls: bool,
    /// Redfish: plain HTTP instead of HTTPS (emulators, labs).
    pub plain_http: bool,
    /// Redfish: use HTTP Basic auth instead of a session.
    pub basic_auth: bool,
    /// Redfish: the ComputerSystem id; discovered when `None`.
    pub system: Option<String>,
    /// IPMI: cipher suite (3 = HMAC-SHA1, HMAC-SHA1-96, AES-CBC-128).
    pub cipher_suite: u8,
    /// Every call to the BMC gives up after this.
    pub timeout: Duration,
}

impl std::fmt::Debug for Target {
    /// Never prints the credentials.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("username", &"<redacted>")
            .field("insecure_tls", &self.insecure_tls)
            .field("system", &self.system)
            .finish()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BmcError {
    /// Wrong user name or password (or no such user).
    #[error("authentication failed: {0}")]
    Auth(String),
    /// No answer within the deadline.
    #[error("BMC at {0} did not answer within {1:?}")]
    Timeout(String, Duration),
    /// Reachable but refused or failed the request.
    #[error("{0}")]
    Protocol(String),
    /// The protocol has no such operation (IPMI and virtual media).
    #[error("{0}")]
    Unsupported(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}
