//! writefile: mount `DEST_DISK` (a partition) and write `CONTENTS` to
//! `DEST_PATH` in it, owned by `UID`:`GID` with `MODE`, making missing
//! directories with `DIRMODE` and the same owner (as upstream does).
//!
//! Paths are resolved with openat2(RESOLVE_IN_ROOT): a symlink in the
//! installed system (`/etc/resolv.conf -> /run/...`) is followed inside
//! that system, never out into the OSIE's own files.

use super::mount::Mounts;
use super::{ActionError, Env, Runner};
use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileSpec {
    /// Relative to the filesystem's root, without `..`.
    pub path: String,
    pub contents: Vec<u8>,
    pub uid: u32,
    pub gid: u32,
    pub mode: u32,
    pub dir_mode: u32,
}

fn octal(env: &Env<'_>, k: &str, default: u32) -> Result<u32, ActionError> {
    match env.get(k) {
        None => Ok(default),
        Some(v) => u32::from_str_radix(v.trim_start_matches("0o"), 8)
            .ok()
            .filter(|m| *m <= 0o7777)
            .ok_or_else(|| ActionError::Env(format!("{k}={v:?} is not an octal file mode"))),
    }
}

fn id(env: &Env<'_>, k: &str) -> Result<u32, ActionError> {
    match env.get(k) {
        None => Ok(0),
        Some(v) => v
            .parse()
            .map_err(|_| ActionError::Env(format!("{k}={v:?} is not a numeric id"))),
    }
}

/// The file an action asks for. Unlike upstream, which fails without
/// them, UID/GID default to 0, MODE to 0644 and DIRMODE to 0755.
pub fn spec(env: &Env<'_>) -> Result<FileSpec, ActionError> {
    let dest = env.required("DEST_PATH")?;
    let p = Path::new(dest);
    if !p.is_absolute() {
        return Err(ActionError::Env(format!(
            "DEST_PATH={dest:?} must be an absolute path"
        )));
    }
    let mut parts = Vec::new();
    for c in p.components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(s) => parts.push(s.to_string_lossy().into_owned()),
            _ => {
                return Err(ActionError::Env(format!(
                    "DEST_PATH={dest:?} may not contain '..'"
                )));
            }
        }
    }
    if parts.is_empty() || dest.ends_with('/') {
        return Err(ActionError::Env(format!(
            "DEST_PATH={dest:?} must name a file"
        )));
    }
    Ok(FileSpec {
        path: parts.join("/"),
        contents: env
            .0
            .get("CONTENTS")
            .cloned()
            .unwrap_or_default()
            .into_bytes(),
        uid: id(env, "UID")?,
        gid: id(env, "GID")?,
        mode: octal(env, "MODE", 0o644)?,
        dir_mode: octal(env, "DIRMODE", 0o755)?,
    })
}

fn in_root(root: &OwnedFd, path: &str, flags: OFlags, mode: u32) -> Result<OwnedFd, Errno> {
    rustix::fs::openat2(
        root,
        path,
        flags | OFlags::CLOEXEC,
        Mode::from_raw_mode(mode),
        ResolveFlags::IN_ROOT,
    )
}

fn own(fd: impl AsFd, s: &FileSpec, mode: u32, what: &str) -> Result<(), ActionError> {
    let err = |e: Errno| ActionError::Failed(format!("{what}: {e}"));
    rustix::fs::fchown(
        &fd,
        Some(rustix::fs::Uid::from_raw(s.uid)),
        Some(rustix::fs::Gid::from_raw(s.gid)),
    )
    .map_err(err)?;
    rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode)).map_err(err)
}

/// Writes the file under `root` (a mounted filesystem, or any directory).
pub fn write_into(root: &Path, s: &FileSpec) -> Result<(), ActionError> {
    let root_fd = rustix::fs::open(
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| ActionError::Failed(format!("opening {}: {e}", root.display())))?;
    let parts: Vec<&str> = s.path.split('/').collect();
    let dirs = &parts[..parts.len() - 1];
    for i in 0..dirs.len() {
        let prefix = dirs[..=i].join("/");
        match in_root(&root_fd, &prefix, OFlags::RDONLY | OFlags::DIRECTORY, 0) {
            Ok(_) => continue,
            Err(Errno::NOENT) => {}
            Err(Errno::NOTDIR) => {
                return Err(ActionError::Failed(format!(
                    "/{prefix} exists and is not a directory"
                )));
            }
            Err(e) => return Err(ActionError::Failed(format!("/{prefix}: {e}"))),
        }
        let parent = if i == 0 {
            ".".to_string()
        } else {
            dirs[..i].join("/")
        };
        let parent_fd = in_root(&root_fd, &parent, OFlags::RDONLY | OFlags::DIRECTORY, 0)
            .map_err(|e| ActionError::Failed(format!("/{parent}: {e}")))?;
        rustix::fs::mkdirat(&parent_fd, dirs[i], Mode::from_raw_mode(s.dir_mode))
            .map_err(|e| ActionError::Failed(format!("creating directory /{prefix}: {e}")))?;
        let made = in_root(&root_fd, &prefix, OFlags::RDONLY | OFlags::DIRECTORY, 0)
            .map_err(|e| ActionError::Failed(format!("/{prefix}: {e}")))?;
        own(&made, s, s.dir_mode, &format!("directory /{prefix}"))?;
    }
    let f = in_root(
        &root_fd,
        &s.path,
        OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC,
        s.mode,
    )
    .map_err(|e| ActionError::Failed(format!("opening /{} for writing: {e}", s.path)))?;
    let mut file = std::fs::File::from(f);
    std::io::Write::write_all(&mut file, &s.contents)
        .map_err(ActionError::io(format!("writing /{}", s.path)))?;
    own(&file, s, s.mode, &format!("/{}", s.path))?;
    file.sync_all()
        .map_err(ActionError::io(format!("fsync of /{}", s.path)))?;
    Ok(())
}

pub async fn run(runner: &Runner, env: &Env<'_>) -> Result<String, ActionError> {
    let disk = env.required("DEST_DISK")?.to_string();
    let fs_type = env.get("FS_TYPE").map(str::to_string);
    let s = spec(env)?;
    let work = runner.work_dir.clone();
    tokio::task::spawn_blocking(move || {
        let m = Mounts::device(&work, &disk, fs_type.as_deref())?;
        write_into(m.root(), &s)?;
        drop(m);
        Ok(format!(
            "wrote /{} ({} bytes, {:o}, {}:{}) on {disk}",
            s.path,
            s.contents.len(),
            s.mode,
            s.uid,
            s.gid
        ))
    })
    .await
    .map_err(|e| ActionError::Failed(format!("writefile stopped: {e}")))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn env(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn capt_cloud_init_file() {
        let e = env(&[
            ("DEST_DISK", "/dev/vda3"),
            ("FS_TYPE", "ext4"),
            ("DEST_PATH", "/etc/cloud/cloud.cfg.d/10_tinkerbell.cfg"),
            ("UID", "0"),
            ("GID", "0"),
            ("MODE", "0600"),
            ("DIRMODE", "0700"),
            ("CONTENTS", "datasource:\n  Ec2: {}\n"),
        ]);
        let s = spec(&Env(&e)).unwrap();
        assert_eq!(s.path, "etc/cloud/cloud.cfg.d/10_tinkerbell.cfg");
        assert_eq!((s.mode, s.dir_mode), (0o600, 0o700));
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("etc")).unwrap();
        std::fs::set_permissions(
            root.path().join("etc"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        write_into(root.path(), &s).unwrap();
        let f = root.path().join("etc/cloud/cloud.cfg.d/10_tinkerbell.cfg");
        assert_eq!(
            std::fs::read_to_string(&f).unwrap(),
            "datasource:\n  Ec2: {}\n"
        );
        assert_eq!(std::fs::metadata(&f).unwrap().mode() & 0o7777, 0o600);
        // New directories get DIRMODE; an existing one is left as it was.
        let mode = |p: &str| std::fs::metadata(root.path().join(p)).unwrap().mode() & 0o7777;
        assert_eq!(mode("etc/cloud"), 0o700);
        assert_eq!(mode("etc/cloud/cloud.cfg.d"), 0o700);
        assert_eq!(mode("etc"), 0o755);
        // Written again: replaced, not appended.
        let s2 = FileSpec {
            contents: b"x".to_vec(),
            ..s
        };
        write_into(root.path(), &s2).unwrap();
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "x");
    }

    #[test]
    fn an_absolute_symlink_stays_inside_the_installed_system() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("etc")).unwrap();
        // In the installed system, /etc/hostname -> /run/hostname: that is
        // the installed system's /run, not the OSIE's.
        std::os::unix::fs::symlink(
            outside.path().join("hostname"),
            root.path().join("etc/hostname"),
        )
        .unwrap();
        let inside_dir = root.path().join(outside.path().strip_prefix("/").unwrap());
        std::fs::create_dir_all(&inside_dir).unwrap();
        let e = env(&[("DEST_PATH", "/etc/hostname"), ("CONTENTS", "node-1\n")]);
        let s = spec(&Env(&e)).unwrap();
        write_into(root.path(), &s).unwrap();
        assert!(!outside.path().join("hostname").exists());
        assert_eq!(
            std::fs::read_to_string(inside_dir.join("hostname")).unwrap(),
            "node-1\n"
        );
    }

    #[test]
    fn bad_input_is_named() {
        for (kv, want) in [
            (vec![("DEST_PATH", "etc/x")], "absolute"),
            (vec![("DEST_PATH", "/etc/../x")], ".."),
            (vec![("DEST_PATH", "/etc/")], "must name a file"),
            (vec![("DEST_PATH", "/x"), ("MODE", "0999")], "octal"),
            (vec![("DEST_PATH", "/x"), ("UID", "root")], "numeric"),
            (vec![], "DEST_PATH is required"),
        ] {
            let e = env(&kv);
            let err = spec(&Env(&e)).unwrap_err().to_string();
            assert!(err.contains(want), "{kv:?}: {err}");
        }
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("etc"), "a file").unwrap();
        let e = env(&[("DEST_PATH", "/etc/x")]);
        let err = write_into(root.path(), &spec(&Env(&e)).unwrap())
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a directory"), "{err}");
    }
}
