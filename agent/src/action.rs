//! An action as the server hands it out, and what the agent makes of its
//! image: the well-known Tinkerbell action images are recognised by name,
//! whatever the registry or tag, and run natively.

use crate::pb::ActionResponse;
use std::collections::BTreeMap;
use std::time::Duration;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Action {
    pub workflow_id: String,
    pub task_id: String,
    pub action_id: String,
    pub name: String,
    pub image: String,
    /// None when the template gave none (0).
    pub timeout: Option<Duration>,
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
}

impl From<ActionResponse> for Action {
    fn from(r: ActionResponse) -> Self {
        let env = r
            .environment
            .iter()
            .map(|kv| match kv.split_once('=') {
                Some((k, v)) => (k.to_string(), v.to_string()),
                None => (kv.clone(), String::new()),
            })
            .collect();
        Action {
            workflow_id: r.workflow_id.unwrap_or_default(),
            task_id: r.task_id.unwrap_or_default(),
            action_id: r.action_id.unwrap_or_default(),
            name: r.name.unwrap_or_default(),
            image: r.image.unwrap_or_default(),
            timeout: r
                .timeout
                .and_then(|t| u64::try_from(t).ok())
                .filter(|t| *t > 0)
                .map(Duration::from_secs),
            command: r.command,
            env,
        }
    }
}

/// What an action's image is, to this agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Image2Disk,
    QemuImg2Disk,
    Oci2Disk,
    WriteFile,
    Cexec,
    Kexec,
    Archive2Disk,
    WaitDaemon,
    Reboot,
    Poweroff,
    /// tinkerbox's own: the hardware, in Metal3's shape, to a URL.
    Inspect,
    /// tinkerbox's own: Ironic's metadata cleaning of every disk.
    WipeDisks,
    /// tinkerbox's own: a config drive partition for cloud-init, as
    /// Ironic's agent makes it.
    ConfigDrive,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Image2Disk => "image2disk",
            Kind::QemuImg2Disk => "qemuimg2disk",
            Kind::Oci2Disk => "oci2disk",
            Kind::WriteFile => "writefile",
            Kind::Cexec => "cexec",
            Kind::Kexec => "kexec",
            Kind::Archive2Disk => "archive2disk",
            Kind::WaitDaemon => "waitdaemon",
            Kind::Reboot => "reboot",
            Kind::Poweroff => "poweroff",
            Kind::Inspect => "inspect",
            Kind::WipeDisks => "wipe-disks",
            Kind::ConfigDrive => "configdrive",
        }
    }
}

/// The image's name without registry, path, tag or digest:
/// `quay.io/tinkerbell/actions/image2disk:v1.0.0` is `image2disk`.
pub fn image_name(image: &str) -> &str {
    let no_digest = image.split('@').next().unwrap_or(image);
    let last = no_digest.rsplit('/').next().unwrap_or(no_digest);
    last.split(':').next().unwrap_or(last)
}

/// The kind of `image` run with `command`. A generic image (alpine,
/// busybox, ...) whose command is only a reboot or a poweroff, as
/// Tinkerbell's docs end a Workflow, is that power action.
pub fn kind_of(image: &str, command: &[String]) -> Option<Kind> {
    let by_name = match image_name(image) {
        "image2disk" => Some(Kind::Image2Disk),
        "qemuimg2disk" => Some(Kind::QemuImg2Disk),
        "oci2disk" => Some(Kind::Oci2Disk),
        "writefile" => Some(Kind::WriteFile),
        "cexec" => Some(Kind::Cexec),
        "kexec" => Some(Kind::Kexec),
        "archive2disk" => Some(Kind::Archive2Disk),
        "waitdaemon" => Some(Kind::WaitDaemon),
        "reboot" => Some(Kind::Reboot),
        "poweroff" | "shutdown" => Some(Kind::Poweroff),
        "inspect" => Some(Kind::Inspect),
        "wipe-disks" => Some(Kind::WipeDisks),
        "configdrive" => Some(Kind::ConfigDrive),
        _ => None,
    };
    by_name.or_else(|| power_command(command))
}

fn power_command(command: &[String]) -> Option<Kind> {
    let words: Vec<&str> = command
        .iter()
        .flat_map(|c| c.split_whitespace())
        .filter(|w| !w.starts_with('-'))
        .collect();
    let (prog, rest) = words.split_first()?;
    let prog = prog.rsplit('/').next().unwrap_or(prog);
    match (prog, rest) {
        ("reboot", []) => Some(Kind::Reboot),
        ("poweroff" | "halt", []) => Some(Kind::Poweroff),
        ("shutdown", _) if rest.iter().all(|w| *w == "now") => Some(Kind::Poweroff),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd(c: &[&str]) -> Vec<String> {
        c.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn names_whatever_the_registry_or_tag() {
        assert_eq!(
            kind_of("quay.io/tinkerbell/actions/image2disk:v1.0.0", &[]),
            Some(Kind::Image2Disk)
        );
        assert_eq!(
            kind_of("10.99.0.1:5000/actions/oci2disk", &[]),
            Some(Kind::Oci2Disk)
        );
        assert_eq!(
            kind_of("ghcr.io/jacobweinstock/waitdaemon:latest", &[]),
            Some(Kind::WaitDaemon)
        );
        assert_eq!(
            kind_of(
                "quay.io/tinkerbell/actions/writefile@sha256:0123456789abcdef",
                &[]
            ),
            Some(Kind::WriteFile)
        );
        assert_eq!(kind_of("kexec", &[]), Some(Kind::Kexec));
        assert_eq!(
            kind_of("quay.io/tinkerbell/actions/qemuimg2disk:latest", &[]),
            Some(Kind::QemuImg2Disk)
        );
        assert_eq!(Kind::QemuImg2Disk.as_str(), "qemuimg2disk");
        assert_eq!(kind_of("qemu-img", &[]), None);
        assert_eq!(
            kind_of("quay.io/tinkerbox/inspect:latest", &[]),
            Some(Kind::Inspect)
        );
        assert_eq!(
            kind_of("10.99.0.1:5000/tinkerbox/wipe-disks@sha256:0123", &[]),
            Some(Kind::WipeDisks)
        );
        assert_eq!(kind_of("quay.io/tinkerbox/wipe-disks-full", &[]), None);
        assert_eq!(Kind::WipeDisks.as_str(), "wipe-disks");
        assert_eq!(
            kind_of("quay.io/tinkerbox/configdrive:latest", &[]),
            Some(Kind::ConfigDrive)
        );
        assert_eq!(
            kind_of("10.99.0.1:5000/tinkerbox/configdrive@sha256:0123", &[]),
            Some(Kind::ConfigDrive)
        );
        assert_eq!(kind_of("quay.io/tinkerbox/config-drive", &[]), None);
        assert_eq!(Kind::ConfigDrive.as_str(), "configdrive");
        assert_eq!(kind_of("bash", &cmd(&["sleep", "2"])), None);
        assert_eq!(kind_of("alpine", &[]), None);
    }

    #[test]
    fn a_generic_image_that_only_reboots_is_a_reboot() {
        assert_eq!(kind_of("alpine", &cmd(&["reboot"])), Some(Kind::Reboot));
        assert_eq!(
            kind_of("busybox", &cmd(&["/sbin/poweroff", "-f"])),
            Some(Kind::Poweroff)
        );
        assert_eq!(kind_of("alpine", &cmd(&["reboot now please"])), None);
        assert_eq!(kind_of("alpine", &cmd(&["sh", "-c", "reboot"])), None);
    }

    #[test]
    fn from_the_wire() {
        let a = Action::from(ActionResponse {
            workflow_id: Some("default/wf".into()),
            timeout: Some(0),
            environment: vec!["A=1=2".into(), "B".into()],
            ..Default::default()
        });
        assert_eq!(a.timeout, None);
        assert_eq!(a.env["A"], "1=2");
        assert_eq!(a.env["B"], "");
        let a = Action::from(ActionResponse {
            timeout: Some(-5),
            ..Default::default()
        });
        assert_eq!(a.timeout, None);
    }
}
