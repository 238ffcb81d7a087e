//! archive2disk: mount `DEST_DISK` and unpack a tar (`ARCHIVE_TYPE=tar`)
//! or gzip'd tar (`targz`) from `ARCHIVE_URL` into `DEST_PATH` there, in
//! one streaming pass. `TARFILE_CHECKSUM` (`sha256:HEX` or `sha512:HEX`,
//! over the tar stream) is required, as upstream requires it, unless
//! `INSECURE_NO_TARFILE_CHECKSUM_VERIFICATION=true`.

use super::fetch::{self, Alg, Counter, Hashing, mib};
use super::mount::{Mounts, under};
use super::{ActionError, Env, Progress, Runner};
use std::io::Read;
use std::path::Path;
use std::sync::Arc;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArchiveType {
    Tar,
    TarGz,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checksum {
    Sha256(String),
    Sha512(String),
}

pub fn archive_type(v: &str) -> Result<ArchiveType, ActionError> {
    match v.to_ascii_lowercase().as_str() {
        "tar" => Ok(ArchiveType::Tar),
        "targz" | "tar.gz" | "tgz" => Ok(ArchiveType::TarGz),
        _ => Err(ActionError::Env(format!(
            "ARCHIVE_TYPE={v:?}: tar or targz"
        ))),
    }
}

pub fn checksum(env: &Env<'_>) -> Result<Option<Checksum>, ActionError> {
    if env.flag("INSECURE_NO_TARFILE_CHECKSUM_VERIFICATION", false)? {
        return Ok(None);
    }
    let v = env.get("TARFILE_CHECKSUM").ok_or_else(|| {
        ActionError::Env(
            "TARFILE_CHECKSUM (sha256:HEX or sha512:HEX) is required, or set INSECURE_NO_TARFILE_CHECKSUM_VERIFICATION=true"
                .into(),
        )
    })?;
    let (alg, hex) = v.split_once(':').unwrap_or(("", v));
    let ok = |n: usize| hex.len() == n && hex.bytes().all(|b| b.is_ascii_hexdigit());
    match alg {
        "sha256" if ok(64) => Ok(Some(Checksum::Sha256(hex.to_ascii_lowercase()))),
        "sha512" if ok(128) => Ok(Some(Checksum::Sha512(hex.to_ascii_lowercase()))),
        _ => Err(ActionError::Env(format!(
            "TARFILE_CHECKSUM={v:?} is not sha256:HEX or sha512:HEX"
        ))),
    }
}

/// Unpacks the tar stream `src` into `dest`, keeping modes and owners.
/// The tar crate refuses entries that would land outside `dest`.
pub fn unpack(
    src: impl Read,
    kind: ArchiveType,
    dest: &Path,
    sum: Option<&Checksum>,
) -> Result<u64, ActionError> {
    let tar: Box<dyn Read> = match kind {
        ArchiveType::Tar => Box::new(src),
        ArchiveType::TarGz => Box::new(flate2::read::MultiGzDecoder::new(src)),
    };
    let alg = sum.map(|c| match c {
        Checksum::Sha256(_) => Alg::Sha256,
        Checksum::Sha512(_) => Alg::Sha512,
    });
    let mut hashing = Hashing::new(tar, alg);
    let mut entries = 0u64;
    {
        let mut a = tar::Archive::new(&mut hashing);
        a.set_preserve_permissions(true);
        a.set_preserve_ownerships(true);
        a.set_overwrite(true);
        for e in a
            .entries()
            .map_err(|e| ActionError::Failed(format!("reading the archive: {e}")))?
        {
            let mut e = e.map_err(|e| ActionError::Failed(format!("reading the archive: {e}")))?;
            e.unpack_in(dest).map_err(|err| {
                ActionError::Failed(format!(
                    "unpacking {}: {}",
                    e.path()
                        .map(|p| p.display().to_string())
                        .unwrap_or_default(),
                    fetch::chain(&err)
                ))
            })?;
            entries += 1;
        }
    }
    // Whatever follows the end-of-archive blocks is part of the file.
    std::io::copy(&mut hashing, &mut std::io::sink())
        .map_err(|e| ActionError::Failed(format!("reading the archive's end: {e}")))?;
    let got = hashing.finish();
    if let (Some(got), Some(Checksum::Sha256(want) | Checksum::Sha512(want))) = (got, sum)
        && &got != want
    {
        return Err(ActionError::Failed(format!(
            "TARFILE_CHECKSUM mismatch: the archive is {got} ({entries} entries were unpacked)"
        )));
    }
    Ok(entries)
}

pub async fn run(
    runner: &Runner,
    env: &Env<'_>,
    progress: &Progress,
) -> Result<String, ActionError> {
    let url = env.required("ARCHIVE_URL")?.to_string();
    let kind = archive_type(env.required("ARCHIVE_TYPE")?)?;
    let disk = env.required("DEST_DISK")?.to_string();
    let fs_type = env.get("FS_TYPE").map(str::to_string);
    let dest = env.get("DEST_PATH").unwrap_or("/").to_string();
    let sum = checksum(env)?;
    let resp = fetch::get(&url).await?;
    let read = Arc::new(Counter::default());
    let (pump, body) = fetch::stream(resp, read.clone());
    let work = runner.work_dir.clone();
    let d = disk.clone();
    let dest2 = dest.clone();
    let unpacker = tokio::task::spawn_blocking(move || {
        let m = Mounts::device(&work, &d, fs_type.as_deref())?;
        let target = under(m.root(), &dest2)?;
        std::fs::create_dir_all(&target)
            .map_err(ActionError::io(format!("creating {dest2} on {d}")))?;
        let n = unpack(body, kind, &target, sum.as_ref())?;
        drop(m);
        Ok::<_, ActionError>(n)
    });
    let watch = async {
        tokio::pin!(unpacker);
        loop {
            tokio::select! {
                r = &mut unpacker => break r,
                _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {
                    progress.set(format!("{url}: read {}", mib(read.get())));
                }
            }
        }
    };
    let (_, done) = tokio::join!(pump, watch);
    let n = done.map_err(|e| ActionError::Failed(format!("archive2disk stopped: {e}")))??;
    Ok(format!(
        "unpacked {n} entries ({}) from {url} into {dest} on {disk}",
        mib(read.get())
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::Digest;
    use std::collections::BTreeMap;
    use std::os::unix::fs::PermissionsExt;

    fn tarball() -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(6);
        h.set_mode(0o750);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        h.set_cksum();
        b.append_data(&mut h, "etc/motd", &b"hello\n"[..]).unwrap();
        b.into_inner().unwrap()
    }

    #[test]
    fn tar_and_targz_with_their_checksums() {
        let t = tarball();
        let d = tempfile::tempdir().unwrap();
        let sum = Checksum::Sha256(hex::encode(sha2::Sha256::digest(&t)));
        assert_eq!(
            unpack(&t[..], ArchiveType::Tar, d.path(), Some(&sum)).unwrap(),
            1
        );
        let f = d.path().join("etc/motd");
        assert_eq!(std::fs::read(&f).unwrap(), b"hello\n");
        assert_eq!(
            std::fs::metadata(&f).unwrap().permissions().mode() & 0o777,
            0o750
        );

        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, &t).unwrap();
        let gz = gz.finish().unwrap();
        let d = tempfile::tempdir().unwrap();
        let sum = Checksum::Sha512(hex::encode(sha2::Sha512::digest(&t)));
        unpack(&gz[..], ArchiveType::TarGz, d.path(), Some(&sum)).unwrap();
        let bad = Checksum::Sha256("0".repeat(64));
        let e = unpack(&t[..], ArchiveType::Tar, d.path(), Some(&bad)).unwrap_err();
        assert!(e.to_string().contains("mismatch"), "{e}");
    }

    #[test]
    fn an_entry_outside_the_destination_is_refused() {
        // A header naming ../escape, written raw (the builder refuses it).
        let mut h = tar::Header::new_old();
        h.as_old_mut().name[..9].copy_from_slice(b"../escape");
        h.set_size(1);
        h.set_mode(0o644);
        h.set_cksum();
        let mut raw = h.as_bytes().to_vec();
        raw.extend_from_slice(&[b'x'; 512]);
        raw.extend_from_slice(&[0; 1024]);
        let outer = tempfile::tempdir().unwrap();
        let d = outer.path().join("in");
        std::fs::create_dir(&d).unwrap();
        let _ = unpack(&raw[..], ArchiveType::Tar, &d, None);
        assert!(!outer.path().join("escape").exists());
    }

    #[test]
    fn env_rules() {
        let mut m = BTreeMap::new();
        assert!(
            checksum(&Env(&m))
                .unwrap_err()
                .to_string()
                .contains("required")
        );
        m.insert(
            "INSECURE_NO_TARFILE_CHECKSUM_VERIFICATION".into(),
            "true".into(),
        );
        assert_eq!(checksum(&Env(&m)).unwrap(), None);
        m.clear();
        m.insert("TARFILE_CHECKSUM".into(), "md5:abc".into());
        assert!(checksum(&Env(&m)).is_err());
        assert!(archive_type("zip").is_err());
        assert_eq!(archive_type("TARGZ").unwrap(), ArchiveType::TarGz);
    }
}
