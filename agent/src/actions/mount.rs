//! Mounting a partition of the machine's disk for an action, unmounted
//! when the guard goes, whatever happened in between.

use super::ActionError;
use rustix::mount::{MountFlags, UnmountFlags};
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

/// Filesystems tried, in order, when an action gives no FS_TYPE.
const GUESSES: &[&str] = &["ext4", "xfs", "btrfs", "vfat"];

/// How long a partition's device node may take to appear after the
/// partition table was re-read (devtmpfs adds it asynchronously).
const DEVICE_WAIT: Duration = Duration::from_secs(10);

/// Mounts, in the order made; unmounted in reverse on drop.
pub struct Mounts {
    points: Vec<PathBuf>,
    /// The directory made for the first mount, removed at the end.
    made: Option<PathBuf>,
}

impl Mounts {
    /// `device` (with `fs_type`, or each of [`GUESSES`]) on a fresh
    /// directory under `work_dir`.
    pub fn device(
        work_dir: &Path,
        device: &str,
        fs_type: Option<&str>,
    ) -> Result<Mounts, ActionError> {
        wait_for(Path::new(device))?;
        std::fs::create_dir_all(work_dir)
            .map_err(ActionError::io(format!("creating {}", work_dir.display())))?;
        let dir = tempdir_in(work_dir)?;
        let mut m = Mounts {
            points: Vec::new(),
            made: Some(dir.clone()),
        };
        let types: Vec<&str> = match fs_type {
            Some(t) => vec![t],
            None => GUESSES.to_vec(),
        };
        let mut last = None;
        for t in &types {
            match rustix::mount::mount(device, &dir, *t, MountFlags::empty(), None) {
                Ok(()) => {
                    m.points.push(dir);
                    return Ok(m);
                }
                Err(e) => last = Some((*t, e)),
            }
        }
        let (t, e) = last.unwrap_or(("none", rustix::io::Errno::INVAL));
        Err(ActionError::Failed(match fs_type {
            Some(_) => format!("mounting {device} ({t}) on {}: {e}", dir.display()),
            None => format!(
                "mounting {device}: FS_TYPE is not set and it is none of {} (last: {e})",
                GUESSES.join(", ")
            ),
        }))
    }

    pub fn root(&self) -> &Path {
        self.points
            .first()
            .map(PathBuf::as_path)
            .unwrap_or(Path::new("/"))
    }

    /// Binds `/dev`, `/proc` and `/sys` into the mounted root, for a chroot.
    pub fn bind_system_dirs(&mut self) -> Result<(), ActionError> {
        let root = self.root().to_path_buf();
        for d in ["dev", "proc", "sys"] {
            let target = root.join(d);
            std::fs::create_dir_all(&target)
                .map_err(ActionError::io(format!("creating {}", target.display())))?;
            rustix::mount::mount_bind(format!("/{d}"), &target).map_err(|e| {
                ActionError::Failed(format!("binding /{d} on {}: {e}", target.display()))
            })?;
            self.points.push(target);
        }
        Ok(())
    }
}

impl Drop for Mounts {
    fn drop(&mut self) {
        while let Some(p) = self.points.pop() {
            if let Err(e) = rustix::mount::unmount(&p, UnmountFlags::empty()) {
                tracing::warn!(path = %p.display(), error = %e, "unmount failed; detaching");
                let _ = rustix::mount::unmount(&p, UnmountFlags::DETACH);
            }
        }
        if let Some(d) = self.made.take() {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// Waits for a device node that the kernel is about to create.
pub fn wait_for(device: &Path) -> Result<(), ActionError> {
    let t0 = Instant::now();
    while !device.exists() {
        if t0.elapsed() > DEVICE_WAIT {
            return Err(ActionError::Failed(format!(
                "{} does not exist (waited {}s)",
                device.display(),
                DEVICE_WAIT.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

fn tempdir_in(dir: &Path) -> Result<PathBuf, ActionError> {
    for _ in 0..100 {
        let p = dir.join(format!("mnt-{:08x}", fastrand::u32(..)));
        match std::fs::create_dir(&p) {
            Ok(()) => return Ok(p),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(ActionError::io(format!("creating {}", p.display()))(e)),
        }
    }
    Err(ActionError::Failed(format!(
        "no free mount point name under {}",
        dir.display()
    )))
}

/// `p` (absolute or not) under a mounted `root`, refusing `..`: a path an
/// action names inside the machine's filesystem.
pub fn under(root: &Path, p: &str) -> Result<PathBuf, ActionError> {
    let mut out = root.to_path_buf();
    for c in Path::new(p).components() {
        match c {
            Component::Normal(s) => out.push(s),
            Component::RootDir | Component::CurDir => {}
            _ => return Err(ActionError::Env(format!("{p:?} may not contain '..'"))),
        }
    }
    Ok(out)
}
