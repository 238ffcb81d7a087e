//! The action images this agent runs natively. Each action reads the
//! environment variables its image reads (as in tinkerbell/actions) and ends
//! with an [`Outcome`]; an image it does not know fails at once with a
//! message naming it: there is no container runtime to hand it to.

pub mod archive;
pub mod cexec;
pub mod checksum;
pub mod configdrive;
pub mod disk;
pub mod fetch;
pub mod inspect;
pub mod kexec;
pub mod mount;
pub mod oci;
pub mod qcow2;
pub mod wipe;
pub mod writefile;

use crate::action::{Action, Kind, kind_of};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;
use tokio::sync::watch;

/// How an action ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    Success,
    Failed,
    Timeout,
}

/// What is done once the action's end is reported: the machine goes
/// down only after the server knows the action succeeded.
#[derive(Debug)]
pub enum Ending {
    Reboot,
    Poweroff,
    /// A kernel loaded by kexec_file_load, started by reboot(KEXEC).
    Kexec,
    /// waitdaemon: this action, after this long, with nobody waiting.
    Later(Duration, Box<Action>),
}

#[derive(Debug)]
pub struct Outcome {
    pub state: End,
    pub message: String,
    pub then: Option<Ending>,
}

impl Outcome {
    pub fn ok(message: impl Into<String>) -> Self {
        Outcome {
            state: End::Success,
            message: message.into(),
            then: None,
        }
    }
    pub fn failed(message: impl Into<String>) -> Self {
        Outcome {
            state: End::Failed,
            message: message.into(),
            then: None,
        }
    }
}

impl From<Result<String, ActionError>> for Outcome {
    fn from(r: Result<String, ActionError>) -> Self {
        match r {
            Ok(m) => Outcome::ok(m),
            Err(e) => Outcome::failed(e.to_string()),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ActionError {
    #[error("{0}")]
    Env(String),
    #[error("{0}")]
    Failed(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

impl ActionError {
    pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ActionError {
        let what = what.into();
        move |source| ActionError::Io { what, source }
    }
}

/// The progress message of the running action; the loop sends it to the
/// server every few seconds when it changed.
#[derive(Clone)]
pub struct Progress(watch::Sender<String>);

impl Progress {
    pub fn channel() -> (Progress, watch::Receiver<String>) {
        let (tx, rx) = watch::channel(String::new());
        (Progress(tx), rx)
    }
    pub fn set(&self, message: String) {
        self.0.send_replace(message);
    }
}

/// Where the actions do their work: the root the OSIE's devices and the
/// temporary mount points live under, and whether the machine may really
/// be rebooted (not in tests).
#[derive(Debug, Clone)]
pub struct Runner {
    /// Mount points are made here.
    pub work_dir: PathBuf,
    /// Reboot, poweroff and kexec really happen (false: they are logged).
    pub power: bool,
    /// Registries oci2disk may reach in plain HTTP (`insecure_registries=`
    /// on the kernel command line), beside an action's own list.
    pub insecure_registries: String,
    /// Where /proc, /sys and /dev are (inspect, wipe-disks, configdrive's
    /// sector size): `/`, or a fixture tree in tests.
    pub root: PathBuf,
}

impl Default for Runner {
    fn default() -> Self {
        Runner {
            work_dir: PathBuf::from("/run/tinkerbox-agent"),
            power: true,
            insecure_registries: String::new(),
            root: PathBuf::from("/"),
        }
    }
}

/// The action's environment with a typed accessor per rule the images
/// follow.
pub struct Env<'a>(pub &'a BTreeMap<String, String>);

impl Env<'_> {
    pub fn get(&self, k: &str) -> Option<&str> {
        self.0.get(k).map(|v| v.trim()).filter(|v| !v.is_empty())
    }
    pub fn required(&self, k: &str) -> Result<&str, ActionError> {
        self.get(k)
            .ok_or_else(|| ActionError::Env(format!("{k} is required and not set")))
    }
    /// Go's strconv.ParseBool, which the images use; unset is `default`.
    pub fn flag(&self, k: &str, default: bool) -> Result<bool, ActionError> {
        match self.get(k) {
            None => Ok(default),
            Some("1" | "t" | "T" | "TRUE" | "true" | "True") => Ok(true),
            Some("0" | "f" | "F" | "FALSE" | "false" | "False") => Ok(false),
            Some(v) => Err(ActionError::Env(format!("{k}={v:?} is not a boolean"))),
        }
    }
}

/// Runs `action` under its timeout.
pub async fn run_with_timeout(runner: &Runner, action: &Action, progress: Progress) -> Outcome {
    let work = run(runner, action, progress);
    match action.timeout {
        None => work.await,
        Some(t) => match tokio::time::timeout(t, work).await {
            Ok(o) => o,
            Err(_) => Outcome {
                state: End::Timeout,
                message: format!("action timed out after {}s", t.as_secs()),
                then: None,
            },
        },
    }
}

/// Runs `action` by its image's kind.
pub async fn run(runner: &Runner, action: &Action, progress: Progress) -> Outcome {
    let Some(kind) = kind_of(&action.image, &action.command) else {
        return Outcome::failed(format!(
            "image {:?} is not an action tinkerbox-agent runs natively (image2disk, qemuimg2disk, oci2disk, \
             writefile, cexec, kexec, archive2disk, waitdaemon, reboot, poweroff, inspect, wipe-disks, \
             configdrive) and \
             this OSIE has no container runtime",
            action.image
        ));
    };
    let env = Env(&action.env);
    match kind {
        Kind::Image2Disk => disk::image2disk(&env, &progress).await.into(),
        Kind::QemuImg2Disk => disk::qemuimg2disk(&env, &progress).await.into(),
        Kind::Oci2Disk => oci::oci2disk(&env, &runner.insecure_registries, &progress)
            .await
            .into(),
        Kind::WriteFile => writefile::run(runner, &env).await.into(),
        Kind::Cexec => cexec::run(runner, &env, &action.command).await.into(),
        Kind::Archive2Disk => archive::run(runner, &env, &progress).await.into(),
        Kind::Kexec => match kexec::load(runner, &env).await {
            Ok(m) => Outcome {
                then: Some(Ending::Kexec),
                ..Outcome::ok(m)
            },
            Err(e) => Outcome::failed(e.to_string()),
        },
        Kind::Reboot => Outcome {
            then: Some(Ending::Reboot),
            ..Outcome::ok("rebooting")
        },
        Kind::Poweroff => Outcome {
            then: Some(Ending::Poweroff),
            ..Outcome::ok("powering off")
        },
        Kind::WaitDaemon => wait_daemon(action),
        Kind::Inspect => inspect::run(runner, &env, &progress).await.into(),
        Kind::WipeDisks => wipe::run(runner, &env, &progress).await.into(),
        Kind::ConfigDrive => configdrive::run(runner, &env, &progress).await.into(),
    }
}

/// waitdaemon: success now, and `IMAGE` (with the same environment and
/// command) after `WAIT_SECONDS`, once the success is reported, so that a
/// Workflow can end with a reboot or a kexec and still be SUCCESS.
fn wait_daemon(action: &Action) -> Outcome {
    let env = Env(&action.env);
    let image = match env.required("IMAGE") {
        Ok(i) => i.to_string(),
        Err(e) => return Outcome::failed(e.to_string()),
    };
    let secs = match env.get("WAIT_SECONDS").map(str::parse::<u64>) {
        None => 10, // waitdaemon's default
        Some(Ok(s)) => s,
        Some(Err(_)) => return Outcome::failed("WAIT_SECONDS is not a whole number of seconds"),
    };
    match kind_of(&image, &action.command) {
        None | Some(Kind::WaitDaemon) => Outcome::failed(format!(
            "waitdaemon: IMAGE {image:?} is not an action tinkerbox-agent runs natively and this OSIE has no container runtime"
        )),
        Some(kind) => {
            let mut inner = action.clone();
            inner.image = image;
            inner.timeout = None;
            Outcome {
                then: Some(Ending::Later(Duration::from_secs(secs), Box::new(inner))),
                ..Outcome::ok(format!("{} will run in {secs}s, detached", kind.as_str()))
            }
        }
    }
}

/// What follows a reported action: the machine going down, or
/// waitdaemon's detached action (which may itself end in going down).
pub async fn after_report(runner: &Runner, ending: Ending) {
    match ending {
        Ending::Later(wait, inner) => {
            let runner = runner.clone();
            tokio::spawn(async move {
                tokio::time::sleep(wait).await;
                let (progress, _rx) = Progress::channel();
                let out = run(&runner, &inner, progress).await;
                tracing::info!(action = %inner.name, image = %inner.image, state = ?out.state, message = %out.message, "waitdaemon's action ended");
                // waitdaemon's IMAGE may not be waitdaemon: no nesting.
                if let Some(e) = out.then {
                    go_down(&runner, e);
                }
            });
        }
        other => go_down(runner, other),
    }
}

fn go_down(runner: &Runner, ending: Ending) {
    match ending {
        Ending::Reboot => kexec::power(runner, kexec::Power::Reboot),
        Ending::Poweroff => kexec::power(runner, kexec::Power::Poweroff),
        Ending::Kexec => kexec::power(runner, kexec::Power::Kexec),
        Ending::Later(..) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_unknown_image_fails_naming_those_run_natively() {
        let action = Action {
            image: "alpine".into(),
            command: vec!["sleep".into(), "1".into()],
            ..Action::default()
        };
        let (progress, _rx) = Progress::channel();
        let out = run(&Runner::default(), &action, progress).await;
        assert_eq!(out.state, End::Failed);
        assert!(
            out.message.contains(
                "inspect, wipe-disks, configdrive) and this OSIE has no container runtime"
            ),
            "{}",
            out.message
        );
    }
}
