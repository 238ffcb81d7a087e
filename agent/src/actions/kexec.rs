//! kexec: load the installed system's kernel from `BLOCK_DEVICE` (by
//! `KERNEL_PATH`/`INITRD_PATH`/`CMD_LINE`, or from its GRUB config's
//! default entry as upstream's kexec does) and, once the action's success
//! is reported, jump into it. Also reboot and poweroff.

use super::mount::{Mounts, under};
use super::{ActionError, Env, Runner};
use std::path::Path;

/// A GRUB menu entry: the kernel, its initrds and arguments.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BootEntry {
    pub name: String,
    pub kernel: String,
    pub initrds: Vec<String>,
    pub args: String,
}

/// The entry GRUB boots by default: `set default=N` (a number; GRUB
/// counts from 0), among the entries that have both a kernel and an
/// initrd (upstream's rule). A default beyond the list is the first.
pub fn grub_default(cfg: &str) -> Option<BootEntry> {
    let mut entries = Vec::new();
    let mut cur: Option<BootEntry> = None;
    let mut default = 0usize;
    let push = |e: Option<BootEntry>, entries: &mut Vec<BootEntry>| {
        if let Some(e) = e.filter(|e| !e.kernel.is_empty() && !e.initrds.is_empty()) {
            entries.push(e);
        }
    };
    for line in cfg.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let Some((first, rest)) = words.split_first() else {
            continue;
        };
        match *first {
            "set" => {
                if let Some(v) = rest.first().and_then(|w| w.strip_prefix("default=")) {
                    default = v
                        .trim_matches(|c| c == '"' || c == '\'')
                        .parse()
                        .unwrap_or(0);
                }
            }
            "menuentry" => {
                push(cur.take(), &mut entries);
                let name = entry_name(&rest.join(" "));
                cur = Some(BootEntry {
                    name,
                    ..Default::default()
                });
            }
            "linux" | "linux16" | "linuxefi" if !rest.is_empty() => {
                if let Some(e) = cur.as_mut() {
                    e.kernel = rest[0].to_string();
                    e.args = rest[1..].join(" ").replace("\\$", "$");
                }
            }
            "initrd" | "initrd16" | "initrdefi" if !rest.is_empty() => {
                if let Some(e) = cur.as_mut() {
                    e.initrds = rest.iter().map(|s| s.to_string()).collect();
                }
            }
            _ => {}
        }
    }
    push(cur, &mut entries);
    let n = entries.len();
    if n == 0 {
        return None;
    }
    Some(entries.swap_remove(if default < n { default } else { 0 }))
}

/// A menuentry's title: quoted, or its first word.
fn entry_name(rest: &str) -> String {
    let rest = rest.trim_start();
    match rest.chars().next() {
        Some(q @ ('\'' | '"')) => rest[1..].split(q).next().unwrap_or("").to_string(),
        _ => rest
            .split(|c: char| c.is_whitespace() || c == '{')
            .next()
            .unwrap_or("")
            .to_string(),
    }
}

fn open(p: &Path) -> Result<std::fs::File, ActionError> {
    std::fs::File::open(p).map_err(ActionError::io(format!("opening {}", p.display())))
}

/// Mounts, finds and loads the kernel. The jump is [`power`]'s.
pub async fn load(runner: &Runner, env: &Env<'_>) -> Result<String, ActionError> {
    let device = env.required("BLOCK_DEVICE")?.to_string();
    let fs_type = env.get("FS_TYPE").map(str::to_string);
    let kernel_path = env.get("KERNEL_PATH").map(str::to_string);
    let initrd_path = env.get("INITRD_PATH").map(str::to_string);
    let cmd_line = env.get("CMD_LINE").map(str::to_string);
    let grub_cfg = env
        .get("GRUBCFG_PATH")
        .unwrap_or("boot/grub/grub.cfg")
        .to_string();
    let work = runner.work_dir.clone();
    let power = runner.power;
    tokio::task::spawn_blocking(move || {
        let m = Mounts::device(&work, &device, fs_type.as_deref())?;
        let root = m.root();
        let entry = match kernel_path {
            Some(k) => BootEntry {
                name: "KERNEL_PATH".into(),
                kernel: k,
                initrds: initrd_path.into_iter().collect(),
                args: String::new(),
            },
            None => {
                let p = under(root, &grub_cfg)?;
                let text = std::fs::read_to_string(&p).map_err(|e| {
                    ActionError::Failed(format!(
                        "no KERNEL_PATH given and {grub_cfg} cannot be read on {device}: {e}"
                    ))
                })?;
                grub_default(&text).ok_or_else(|| {
                    ActionError::Failed(format!(
                        "no KERNEL_PATH given and {grub_cfg} on {device} has no entry with a kernel and an initrd"
                    ))
                })?
            }
        };
        let args = cmd_line.unwrap_or_else(|| entry.args.clone());
        let kernel = open(&under(root, &entry.kernel)?)?;
        // Several initrds are one, concatenated, as GRUB loads them.
        let initrd = match entry.initrds.as_slice() {
            [] => None,
            [one] => Some(open(&under(root, one)?)?),
            many => {
                let mut joined = tempfile_in(&work)?;
                for p in many {
                    let mut f = open(&under(root, p)?)?;
                    std::io::copy(&mut f, &mut joined)
                        .map_err(ActionError::io(format!("reading {p}")))?;
                }
                Some(joined)
            }
        };
        if power {
            crate::sys::kexec_file_load(&kernel, initrd.as_ref(), &args).map_err(|e| {
                ActionError::Failed(format!("kexec_file_load of {}: {e}", entry.kernel))
            })?;
        }
        drop(m);
        Ok(format!(
            "loaded {} ({}) from {device} with {:?}; kexec once reported",
            entry.kernel,
            if entry.initrds.is_empty() {
                "no initrd".to_string()
            } else {
                entry.initrds.join(" ")
            },
            args
        ))
    })
    .await
    .map_err(|e| ActionError::Failed(format!("kexec stopped: {e}")))?
}

fn tempfile_in(dir: &Path) -> Result<std::fs::File, ActionError> {
    let p = dir.join(format!("initrd-{:08x}", fastrand::u32(..)));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&p)
        .map_err(ActionError::io(format!("creating {}", p.display())))?;
    // Unlinked at once: it lives as long as the open file.
    let _ = std::fs::remove_file(&p);
    Ok(f)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Power {
    Reboot,
    Poweroff,
    Kexec,
}

/// Syncs the disks and takes the machine down (or logs it, when the
/// runner may not).
pub fn power(runner: &Runner, what: Power) {
    tracing::info!(?what, "the machine goes down");
    if !runner.power {
        return;
    }
    rustix::fs::sync();
    let cmd = match what {
        Power::Reboot => rustix::system::RebootCommand::Restart,
        Power::Poweroff => rustix::system::RebootCommand::PowerOff,
        Power::Kexec => rustix::system::RebootCommand::Kexec,
    };
    if let Err(e) = rustix::system::reboot(cmd) {
        tracing::error!(?what, error = %e, "reboot(2) failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UBUNTU: &str = r#"
set default="1"
menuentry 'Ubuntu' --class ubuntu --class gnu-linux $menuentry_id_option 'gnulinux-simple' {
	recordfail
	linux	/boot/vmlinuz-6.8.0-31-generic root=UUID=abc ro console=ttyS0 \$vt_handoff
	initrd	/boot/initrd.img-6.8.0-31-generic
}
menuentry 'no initrd' {
	linux /boot/vmlinuz-x root=/dev/vda1
}
menuentry 'Ubuntu, recovery' {
	linux	/boot/vmlinuz-6.8.0-31-generic root=UUID=abc ro recovery nomodeset
	initrd	/boot/intel-ucode.img /boot/initrd.img-6.8.0-31-generic
}
"#;

    #[test]
    fn grub_default_entry() {
        // Entries without an initrd do not count (upstream's rule).
        let e = grub_default(UBUNTU).unwrap();
        assert_eq!(e.name, "Ubuntu, recovery");
        assert_eq!(e.initrds.len(), 2);
        let first = grub_default(&UBUNTU.replace("set default=\"1\"", "")).unwrap();
        assert_eq!(first.kernel, "/boot/vmlinuz-6.8.0-31-generic");
        assert_eq!(first.args, "root=UUID=abc ro console=ttyS0 $vt_handoff");
        // A default beyond the entries is the first, not a panic.
        assert_eq!(
            grub_default(&UBUNTU.replace("default=\"1\"", "default=7"))
                .unwrap()
                .name,
            "Ubuntu"
        );
        assert_eq!(grub_default("set timeout=5\n"), None);
    }

    #[test]
    fn paths_stay_under_the_root() {
        let r = Path::new("/run/m");
        assert_eq!(
            under(r, "/boot/vmlinuz").unwrap(),
            Path::new("/run/m/boot/vmlinuz")
        );
        assert!(under(r, "/boot/../../etc/shadow").is_err());
    }
}
