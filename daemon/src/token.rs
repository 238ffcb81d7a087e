//! The admin API token: 32 random bytes, hex, in `state_dir/api-token`
//! (mode 0600), made on first start and reused after.

use std::fs::OpenOptions;
use std::io::{ErrorKind, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

pub fn load_or_create(path: &Path) -> anyhow::Result<String> {
    match std::fs::read_to_string(path) {
        Ok(t) if !t.trim().is_empty() => {
            let mode = std::fs::metadata(path)?.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                tracing::warn!(path = %path.display(), mode = format!("{mode:o}"), "api token is readable by others; fixing to 0600");
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
            }
            return Ok(t.trim().to_string());
        }
        Ok(_) => {}
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => anyhow::bail!("reading {}: {e}", path.display()),
    }
    let mut raw = [0u8; 32];
    getrandom::fill(&mut raw)
        .map_err(|e| anyhow::anyhow!("no randomness for the api token: {e}"))?;
    let token = hex::encode(raw);
    // Write a temporary file with 0600 from the start, then rename: the token
    // is never world-readable, and a crash never leaves a half-written file.
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| anyhow::anyhow!("creating {}: {e}", tmp.display()))?;
    f.write_all(format!("{token}\n").as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_once_with_0600() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("api-token");
        let a = load_or_create(&p).unwrap();
        assert_eq!(a.len(), 64);
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(load_or_create(&p).unwrap(), a);
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(load_or_create(&p).unwrap(), a);
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }
}
