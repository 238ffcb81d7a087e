//! cexec: mount `BLOCK_DEVICE` and run `CMD_LINE` in it. With `CHROOT`
//! set, /dev, /proc and /sys are bound in and the command runs chrooted
//! (through the OSIE's `chroot` program: the agent itself never changes
//! its root). With `DEFAULT_INTERPRETER` ("/bin/sh -c") the command line
//! is one argument to it; without, it is split on ';' into commands and
//! each on spaces into words, as upstream's cexec does.

use super::mount::Mounts;
use super::{ActionError, Env, Runner};
use std::process::Stdio;

/// Each command's output kept for the action's message, at most.
const OUTPUT_TAIL: usize = 2048;

/// The commands to run: each a program and its arguments.
pub fn commands(
    cmd_line: &str,
    interpreter: Option<&str>,
    command: &[String],
) -> Result<Vec<Vec<String>>, ActionError> {
    if let Some(i) = interpreter {
        let mut words: Vec<String> = i
            .split(' ')
            .filter(|w| !w.is_empty())
            .map(String::from)
            .collect();
        if words.is_empty() {
            return Err(ActionError::Env("DEFAULT_INTERPRETER is empty".into()));
        }
        words.push(cmd_line.to_string());
        return Ok(vec![words]);
    }
    if cmd_line.trim().is_empty() {
        // The action's own `command:` is what a container would have run.
        if command.is_empty() {
            return Err(ActionError::Env("CMD_LINE is required and not set".into()));
        }
        return Ok(vec![command.to_vec()]);
    }
    Ok(cmd_line
        .split(';')
        .map(|c| {
            c.split(' ')
                .filter(|w| !w.is_empty())
                .map(String::from)
                .collect::<Vec<_>>()
        })
        .filter(|w| !w.is_empty())
        .collect())
}

fn tail(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(b);
    let s = s.trim();
    match s.char_indices().rev().nth(OUTPUT_TAIL) {
        Some((i, _)) => format!("...{}", &s[i..]),
        None => s.to_string(),
    }
}

pub async fn run(
    runner: &Runner,
    env: &Env<'_>,
    command: &[String],
) -> Result<String, ActionError> {
    let device = env.required("BLOCK_DEVICE")?.to_string();
    let fs_type = env.get("FS_TYPE").map(str::to_string);
    let chroot = env.get("CHROOT").is_some();
    let cmds = commands(
        env.0.get("CMD_LINE").map(String::as_str).unwrap_or(""),
        env.get("DEFAULT_INTERPRETER"),
        command,
    )?;
    let work = runner.work_dir.clone();
    let mounts = tokio::task::spawn_blocking(move || {
        let mut m = Mounts::device(&work, &device, fs_type.as_deref())?;
        if chroot {
            m.bind_system_dirs()?;
        }
        Ok::<_, ActionError>(m)
    })
    .await
    .map_err(|e| ActionError::Failed(format!("cexec stopped: {e}")))??;
    let root = mounts.root().to_path_buf();
    let mut out = String::new();
    for words in &cmds {
        let (prog, args) = words
            .split_first()
            .ok_or_else(|| ActionError::Env("an empty command".into()))?;
        let mut c = if chroot {
            let mut c = tokio::process::Command::new("chroot");
            c.arg(&root).arg(prog).args(args);
            c
        } else {
            let mut c = tokio::process::Command::new(prog);
            c.args(args).current_dir(&root);
            c
        };
        c.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for (k, v) in env.0 {
            c.env(k, v);
        }
        let shown = words.join(" ");
        let o = c.output().await.map_err(|e| {
            ActionError::Failed(format!(
                "starting {shown:?}{}: {e}",
                if chroot { " (chroot)" } else { "" }
            ))
        })?;
        let mut both = o.stdout.clone();
        both.extend_from_slice(&o.stderr);
        if !o.status.success() {
            return Err(ActionError::Failed(format!(
                "{shown:?} failed ({}): {}",
                o.status,
                tail(&both)
            )));
        }
        out = tail(&both);
    }
    drop(mounts);
    Ok(if out.is_empty() {
        format!("ran {} command(s)", cmds.len())
    } else {
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn split_as_upstream() {
        assert_eq!(
            commands("apt update; apt install -y x", None, &[]).unwrap(),
            vec![s(&["apt", "update"]), s(&["apt", "install", "-y", "x"])]
        );
        assert_eq!(
            commands("echo a; echo b", Some("/bin/sh -c"), &[]).unwrap(),
            vec![s(&["/bin/sh", "-c", "echo a; echo b"])]
        );
        assert_eq!(
            commands("", None, &s(&["update-grub"])).unwrap(),
            vec![s(&["update-grub"])]
        );
        assert!(commands("  ", None, &[]).is_err());
        assert!(commands("x", Some(" "), &[]).is_err());
    }

    #[test]
    fn output_is_cut_to_its_tail() {
        let long = "a".repeat(5000) + "END";
        let t = tail(long.as_bytes());
        assert!(t.starts_with("...") && t.ends_with("END") && t.len() < 2100);
    }
}
