//! wipe-disks (tinkerbox's own image): the cleaning of a BareMetalHost,
//! as Ironic's "metadata" erase (erase_devices_metadata) and MAAS's quick
//! erase do it. On every disk ([`crate::hardware::disks`], or those `DISKS`
//! names), the first and last 2 MiB of each partition and then of the
//! whole disk are zeroed: that is where partition tables (MBR, GPT and its
//! backup) and the signatures of filesystems, LVM, md and ZFS are, so the
//! next owner finds a blank disk without waiting for a full erase. Then
//! fsync, and the kernel is asked to re-read the (now absent) table.
//! `MODE=metadata` is the default and the only mode.

use super::fetch::mib;
use super::{ActionError, Env, Progress, Runner};
use crate::hardware;
use std::io::{Seek, SeekFrom};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Zeroed at each end of a partition and of the disk: GPT's table and
/// its backup, and every common signature, are within it.
pub const EDGE: u64 = 2 << 20;
/// Partitions of one disk looked at (GPT's usual limit is 128).
const MAX_PARTITIONS: usize = 1024;
const ZEROS: usize = 1 << 20;

/// A partition, in bytes from the start of its disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    pub name: String,
    pub start: u64,
    pub len: u64,
}

/// What is wiped on one disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskPlan {
    /// The kernel's name (`sda`): the device is `/dev/<name>`.
    pub name: String,
    /// Bytes, as sysfs says.
    pub size: u64,
    pub partitions: Vec<Partition>,
}

impl DiskPlan {
    /// The byte ranges to zero on a device of `size` bytes (the device's
    /// own size, which is what counts): sorted, merged, within the device.
    pub fn ranges(&self, size: u64) -> Vec<Range<u64>> {
        let mut all = Vec::with_capacity(2 * self.partitions.len() + 2);
        let mut edges = |start: u64, len: u64| {
            let s = start.min(size);
            let e = start.saturating_add(len).min(size);
            if e > s {
                let n = EDGE.min(e - s);
                all.push(s..s + n);
                all.push(e - n..e);
            }
        };
        for p in &self.partitions {
            edges(p.start, p.len);
        }
        edges(0, size);
        all.sort_by_key(|r| r.start);
        let mut merged: Vec<Range<u64>> = Vec::with_capacity(all.len());
        for r in all {
            match merged.last_mut() {
                Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
                _ => merged.push(r),
            }
        }
        merged
    }
}

/// A partition's start and size, in 512-byte sectors as sysfs gives
/// them; None when unreadable or beyond u64 in bytes.
fn partition(root: &Path, disk: &str, name: &str) -> Option<Partition> {
    let at = |f: &str| hardware::number::<u64>(root, &format!("/sys/block/{disk}/{name}/{f}"));
    Some(Partition {
        name: name.to_string(),
        start: at("start")?.checked_mul(512)?,
        len: at("size")?.checked_mul(512)?,
    })
}

/// The kernel name of a `DISKS` entry: `/dev/sda`, or a link such as
/// `/dev/disk/by-id/...` (read under `root`), which must be one of `all`.
fn resolve(root: &Path, all: &[String], path: &str) -> Result<String, ActionError> {
    let rest = path
        .strip_prefix("/dev/")
        .ok_or_else(|| ActionError::Env(format!("DISKS: {path:?} is not a /dev path")))?;
    let name = if rest.contains('/') {
        let target = std::fs::read_link(root.join(path.trim_start_matches('/')))
            .map_err(|e| ActionError::Env(format!("DISKS: {path}: {e}")))?;
        target
            .file_name()
            .and_then(|f| f.to_str())
            .unwrap_or_default()
            .to_string()
    } else {
        rest.to_string()
    };
    if all.contains(&name) {
        Ok(name)
    } else {
        Err(ActionError::Env(format!(
            "DISKS: {path} is not one of this machine's disks ({})",
            all.join(", ")
        )))
    }
}

/// The plan: every disk, or those of `disks` (a comma list of /dev
/// paths), with their partitions.
pub fn plan(root: &Path, disks: Option<&str>) -> Result<Vec<DiskPlan>, ActionError> {
    let all = hardware::disks(root);
    let names: Vec<String> = match disks {
        None => all.clone(),
        Some(list) => {
            let mut names = Vec::new();
            for p in list
                .split(',')
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .take(hardware::MAX_DISKS)
            {
                let n = resolve(root, &all, p)?;
                if !names.contains(&n) {
                    names.push(n);
                }
            }
            names
        }
    };
    names
        .into_iter()
        .map(|name| {
            let size = hardware::disk_bytes(root, &name).ok_or_else(|| {
                ActionError::Failed(format!(
                    "{name}: the kernel's size of the disk is unreadable"
                ))
            })?;
            let partitions = hardware::entries(root, &format!("/sys/block/{name}"))
                .into_iter()
                .filter(|p| p.starts_with(name.as_str()) && p != &name)
                .filter_map(|p| partition(root, &name, &p))
                .take(MAX_PARTITIONS)
                .collect();
            Ok(DiskPlan {
                name,
                size,
                partitions,
            })
        })
        .collect()
}

/// What was done to one disk.
#[derive(Debug)]
pub struct Wiped {
    pub name: String,
    pub partitions: Vec<String>,
    pub zeroed: u64,
    /// Why the kernel did not re-read the partition table, when it did not
    /// (EBUSY: something holds a partition).
    pub reread: Option<String>,
}

impl Wiped {
    pub fn describe(&self) -> String {
        let parts = match self.partitions.as_slice() {
            [] => String::new(),
            p if p.len() <= 8 => format!("{} and ", p.join(", ")),
            p => format!("{} and {} more and ", p[..8].join(", "), p.len() - 8),
        };
        let reread = self
            .reread
            .as_ref()
            .map(|e| format!(" (the kernel kept its old partition table: {e})"))
            .unwrap_or_default();
        format!(
            "{}: {parts}the disk, {} zeroed{reread}",
            self.name,
            mib(self.zeroed)
        )
    }
}

/// Zeroes `plan`'s ranges on `<root>/dev/<name>` (a disk, or a file
/// standing for one), fsyncs, and has the kernel re-read the table.
pub fn wipe(root: &Path, plan: &DiskPlan) -> Result<Wiped, ActionError> {
    let path = root.join("dev").join(&plan.name);
    let shown = format!("/dev/{}", plan.name);
    let mut dev = std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .map_err(ActionError::io(format!("opening {shown}")))?;
    let end = dev
        .seek(SeekFrom::End(0))
        .map_err(ActionError::io(format!("the size of {shown}")))?;
    let size = if end > 0 { end } else { plan.size };
    let zeros = vec![0u8; ZEROS];
    let mut zeroed = 0u64;
    for r in plan.ranges(size) {
        let mut at = r.start;
        // Bounded: each pass writes at least one byte of the range.
        while at < r.end {
            let n = usize::try_from(r.end - at).map_or(ZEROS, |n| n.min(ZEROS));
            dev.write_all_at(&zeros[..n], at).map_err(|e| {
                ActionError::Failed(format!("{shown}: writing zeros at byte {at}: {e}"))
            })?;
            at += n as u64;
        }
        zeroed += r.end - r.start;
    }
    dev.sync_all()
        .map_err(ActionError::io(format!("fsync of {shown}")))?;
    let reread = match crate::sys::reread_partitions(&dev) {
        Ok(()) => None,
        // A file standing for a disk has no table to re-read.
        Err(e) if rustix::io::Errno::from_io_error(&e) == Some(rustix::io::Errno::NOTTY) => None,
        Err(e) => {
            tracing::warn!(disk = %shown, error = %e, "BLKRRPART after wiping");
            Some(e.to_string())
        }
    };
    Ok(Wiped {
        name: plan.name.clone(),
        partitions: plan.partitions.iter().map(|p| p.name.clone()).collect(),
        zeroed,
        reread,
    })
}

pub async fn run(
    runner: &Runner,
    env: &Env<'_>,
    progress: &Progress,
) -> Result<String, ActionError> {
    match env.get("MODE") {
        None | Some("metadata") => {}
        Some(m) => {
            return Err(ActionError::Env(format!(
                "MODE={m:?} is not supported: only metadata (the first and last 2 MiB of every partition and disk are zeroed)"
            )));
        }
    }
    let disks = env.get("DISKS").map(str::to_string);
    let root = runner.root.clone();
    let progress = progress.clone();
    tokio::task::spawn_blocking(move || {
        let plans = plan(&root, disks.as_deref())?;
        if plans.is_empty() {
            return Ok("no disks to wipe".to_string());
        }
        let (mut done, mut failed) = (Vec::new(), Vec::new());
        for (i, d) in plans.iter().enumerate() {
            progress.set(format!("wiping {} ({}/{})", d.name, i + 1, plans.len()));
            match wipe(&root, d) {
                Ok(w) => done.push(w.describe()),
                Err(e) => failed.push(e.to_string()),
            }
        }
        let disks = |n: usize| if n == 1 { "disk" } else { "disks" };
        if failed.is_empty() {
            Ok(format!(
                "wiped the metadata of {} {}: {}",
                done.len(),
                disks(done.len()),
                done.join("; ")
            ))
        } else {
            let wiped = if done.is_empty() {
                String::new()
            } else {
                format!("; wiped {}", done.join("; "))
            };
            Err(ActionError::Failed(format!(
                "{} of {} {} failed: {}{wiped}",
                failed.len(),
                plans.len(),
                disks(plans.len()),
                failed.join("; ")
            )))
        }
    })
    .await
    .map_err(|e| ActionError::Failed(format!("wipe-disks stopped: {e}")))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::process::Command;

    const MIB: u64 = 1 << 20;

    fn put(root: &Path, p: &str, v: &str) {
        let f = root.join(p.trim_start_matches('/'));
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(f, v).unwrap();
    }

    fn part(name: &str, start: u64, len: u64) -> Partition {
        Partition {
            name: name.into(),
            start,
            len,
        }
    }

    #[test]
    fn ranges() {
        let d = DiskPlan {
            name: "sda".into(),
            size: 100 * MIB,
            partitions: vec![
                part("sda1", MIB, 10 * MIB),
                part("sda2", 11 * MIB, MIB),      // smaller than EDGE
                part("sda3", 90 * MIB, 50 * MIB), // beyond the disk
                part("sda4", 200 * MIB, MIB),     // wholly beyond
            ],
        };
        assert_eq!(
            d.ranges(100 * MIB),
            [
                0..3 * MIB,
                9 * MIB..12 * MIB,
                90 * MIB..92 * MIB,
                98 * MIB..100 * MIB
            ]
        );
        // The device's size is what counts.
        assert_eq!(
            DiskPlan {
                partitions: vec![],
                ..d.clone()
            }
            .ranges(3 * MIB),
            std::slice::from_ref(&(0..3 * MIB))
        );
        assert!(d.ranges(0).is_empty());
        let huge = DiskPlan {
            name: "sdb".into(),
            size: u64::MAX,
            partitions: vec![part("sdb1", u64::MAX - 1, u64::MAX)],
        };
        assert_eq!(huge.ranges(u64::MAX).last().unwrap().end, u64::MAX);
    }

    fn sysfs(r: &Path) {
        put(r, "/sys/block/sda/size", "204800\n");
        put(r, "/sys/block/sda/sda1/start", "2048\n");
        put(r, "/sys/block/sda/sda1/size", "4096\n");
        put(r, "/sys/block/sda/sda2/start", "6144\n");
        put(r, "/sys/block/sda/sda2/size", "lots\n");
        put(r, "/sys/block/sda/queue/rotational", "1\n");
        put(r, "/sys/block/nvme0n1/size", "8192\n");
        put(r, "/sys/block/nvme0n1/nvme0n1p1/start", "2048\n");
        put(r, "/sys/block/nvme0n1/nvme0n1p1/size", "2048\n");
        put(r, "/sys/block/loop0/size", "8192\n");
        put(r, "/sys/block/sdb/size", "8192\n");
        put(r, "/sys/block/sdb/ro", "1\n");
        std::fs::create_dir_all(r.join("dev/disk/by-id")).unwrap();
        std::os::unix::fs::symlink("../../nvme0n1", r.join("dev/disk/by-id/nvme-eui.01")).unwrap();
    }

    #[test]
    fn plans_from_sysfs() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        sysfs(r);
        let p = plan(r, None).unwrap();
        assert_eq!(
            p,
            [
                DiskPlan {
                    name: "nvme0n1".into(),
                    size: 4 * MIB,
                    partitions: vec![part("nvme0n1p1", MIB, MIB)],
                },
                DiskPlan {
                    name: "sda".into(),
                    size: 100 * MIB,
                    // sda2's size is unreadable: only the disk's edges
                    // cover it.
                    partitions: vec![part("sda1", MIB, 2 * MIB)],
                },
            ]
        );
        let only = plan(r, Some(" /dev/disk/by-id/nvme-eui.01, /dev/nvme0n1,")).unwrap();
        assert_eq!(only.len(), 1);
        assert_eq!(only[0].name, "nvme0n1");
        for (list, want) in [
            (
                "/dev/sdb",
                "/dev/sdb is not one of this machine's disks (nvme0n1, sda)",
            ),
            ("/dev/loop0", "not one of this machine's disks"),
            ("sda", "\"sda\" is not a /dev path"),
            ("/dev/disk/by-id/nothing", "DISKS: /dev/disk/by-id/nothing:"),
            ("/dev/../etc/passwd", "DISKS: /dev/../etc/passwd:"),
        ] {
            let e = plan(r, Some(list)).unwrap_err().to_string();
            assert!(e.contains(want), "{list}: {e}");
        }
        assert!(plan(&r.join("nothing"), None).unwrap().is_empty());
    }

    fn have(tool: &str) -> bool {
        Command::new(tool).arg("--version").output().is_ok()
    }

    /// A 64 MiB file with a real GPT and an ext4 filesystem in its second
    /// partition stands for the disk `sdx`; after the wipe neither
    /// sfdisk nor blkid finds anything, the ranges are zero and every
    /// other byte is as it was.
    #[tokio::test]
    async fn wipes_a_real_gpt_and_filesystem() {
        if !have("sfdisk") || !have("blkid") {
            eprintln!("sfdisk or blkid is missing: skipped");
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        let disk = r.join("dev/sdx");
        std::fs::create_dir_all(disk.parent().unwrap()).unwrap();
        std::fs::write(&disk, vec![0xabu8; 64 << 20]).unwrap();
        let mut sf = Command::new("sfdisk")
            .args(["--quiet", "--no-reread", "--no-tell-kernel"])
            .arg(&disk)
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(
            sf.stdin.as_mut().unwrap(),
            b"label: gpt\nstart=2048, size=16384\nstart=18432, size=65536\n",
        )
        .unwrap();
        drop(sf.stdin.take());
        assert!(sf.wait().unwrap().success());
        let mkfs = Command::new("mkfs.ext4")
            .args([
                "-q",
                "-F",
                "-E",
                &format!("offset={},nodiscard", 18432 * 512),
            ])
            .arg(&disk)
            .arg("32M")
            .status()
            .is_ok_and(|s| s.success());
        let probe = |offset: u64| {
            Command::new("blkid")
                .args(["-p", "-O", &offset.to_string()])
                .arg(&disk)
                .output()
                .unwrap()
        };
        assert!(String::from_utf8_lossy(&probe(0).stdout).contains("PTTYPE=\"gpt\""));
        if mkfs {
            assert!(String::from_utf8_lossy(&probe(18432 * 512).stdout).contains("ext4"));
        }
        put(r, "/sys/block/sdx/size", "131072\n");
        put(r, "/sys/block/sdx/sdx1/start", "2048\n");
        put(r, "/sys/block/sdx/sdx1/size", "16384\n");
        put(r, "/sys/block/sdx/sdx2/start", "18432\n");
        put(r, "/sys/block/sdx/sdx2/size", "65536\n");
        let before = std::fs::read(&disk).unwrap();

        let runner = Runner {
            root: r.to_path_buf(),
            power: false,
            ..Runner::default()
        };
        let env: BTreeMap<String, String> = [("MODE".to_string(), "metadata".to_string())].into();
        let (p, _rx) = Progress::channel();
        let msg = run(&runner, &Env(&env), &p).await.unwrap();
        assert_eq!(
            msg,
            "wiped the metadata of 1 disk: sdx: sdx1, sdx2 and the disk, 11.0 MiB zeroed"
        );

        let after = std::fs::read(&disk).unwrap();
        assert_eq!(after.len(), before.len(), "the file is not grown");
        let ranges = plan(r, None).unwrap()[0].ranges(64 << 20);
        assert_eq!(
            ranges,
            [
                0..3 * MIB,
                7 * MIB..11 * MIB,
                39 * MIB..41 * MIB,
                62 * MIB..64 * MIB
            ]
        );
        let mut at = 0;
        for r in &ranges {
            let (s, e) = (r.start as usize, r.end as usize);
            assert!(after[s..e].iter().all(|b| *b == 0), "{r:?} is zeroed");
            assert!(before[at..s] == after[at..s], "{at}..{s} is untouched");
            at = e;
        }
        assert!(before[at..] == after[at..]);
        let dump = Command::new("sfdisk")
            .arg("--dump")
            .arg(&disk)
            .output()
            .unwrap();
        assert!(
            !dump.status.success(),
            "{}",
            String::from_utf8_lossy(&dump.stdout)
        );
        for offset in [0, 2048 * 512, 18432 * 512] {
            let out = probe(offset);
            assert!(
                out.stdout.is_empty(),
                "{}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
    }

    #[tokio::test]
    async fn the_environment() {
        let d = tempfile::tempdir().unwrap();
        let runner = Runner {
            root: d.path().to_path_buf(),
            power: false,
            ..Runner::default()
        };
        let (p, _rx) = Progress::channel();
        let env = |kv: &[(&str, &str)]| -> BTreeMap<String, String> {
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let e = env(&[("MODE", "full")]);
        let err = run(&runner, &Env(&e), &p).await.unwrap_err().to_string();
        assert!(err.contains("MODE=\"full\" is not supported"), "{err}");
        let e = env(&[]);
        assert_eq!(
            run(&runner, &Env(&e), &p).await.unwrap(),
            "no disks to wipe"
        );

        // A disk whose device cannot be opened fails the action; the
        // others are still wiped.
        sysfs(d.path());
        // The device (8 MiB) is smaller than sysfs says: its own size counts.
        std::fs::write(d.path().join("dev/sda"), vec![1u8; 8 << 20]).unwrap();
        let err = run(&runner, &Env(&e), &p).await.unwrap_err().to_string();
        assert!(
            err.starts_with("1 of 2 disks failed: opening /dev/nvme0n1: "),
            "{err}"
        );
        assert!(
            err.ends_with("; wiped sda: sda1 and the disk, 5.0 MiB zeroed"),
            "{err}"
        );
    }
}
