//! A host's config drive, as Ironic writes one for BMO: a small VFAT
//! filesystem labelled `CONFIG-2` (cloud-init's ConfigDrive datasource
//! looks for `config-2` or `CONFIG-2`, vfat or iso9660) holding
//! `openstack/latest/meta_data.json`, `user_data` and
//! `network_data.json`. The agent's `configdrive` action writes it into a
//! partition at the end of the installed disk.

use serde_json::{Map, Value, json};
use std::io::{Cursor, Write};

/// The image is at least this big (FAT12 with room to spare) and grows
/// with its content.
const MIN_BYTES: u64 = 2 << 20;

/// At most this much content: the agent refuses images over 64 MiB.
pub const MAX_CONTENT_BYTES: usize = 16 << 20;

/// BMO's `meta_data.json` (`getConfigDrive`): the host's identity, then
/// the user's metaData Secret (YAML or JSON map) over it.
pub fn meta_data(
    uid: &str,
    namespace: &str,
    name: &str,
    user: Option<&str>,
) -> Result<Value, String> {
    let mut m = json!({
        "uuid": uid,
        "metal3-namespace": namespace,
        "metal3-name": name,
        "local-hostname": name,
        "local_hostname": name,
        "name": name,
    });
    if let Some(text) = user.filter(|t| !t.trim().is_empty()) {
        let extra: Map<String, Value> = serde_saphyr::from_str(text)
            .map_err(|e| format!("failed to unmarshal metadata from secret: {e}"))?;
        if let Some(o) = m.as_object_mut() {
            o.extend(extra);
        }
    }
    Ok(m)
}

/// The network data Secret (OpenStack's network_data.json, as YAML or
/// JSON), as JSON.
pub fn network_data(text: &str) -> Result<Value, String> {
    let v: Map<String, Value> = serde_saphyr::from_str(text)
        .map_err(|e| format!("failed to unmarshal network_data.json from secret: {e}"))?;
    Ok(Value::Object(v))
}

/// The VFAT image.
pub fn build(
    meta: &Value,
    user_data: Option<&str>,
    network: Option<&Value>,
) -> Result<Vec<u8>, String> {
    let meta = serde_json::to_vec(meta).map_err(|e| e.to_string())?;
    let network = network
        .map(serde_json::to_vec)
        .transpose()
        .map_err(|e| e.to_string())?;
    let content = meta.len() + user_data.map_or(0, str::len) + network.as_ref().map_or(0, Vec::len);
    if content > MAX_CONTENT_BYTES {
        return Err(format!(
            "the config drive's content is {content} bytes, more than {MAX_CONTENT_BYTES}"
        ));
    }
    // Room for the files and FAT's own structures, in whole MiB.
    let size = (MIN_BYTES + 2 * content as u64).div_ceil(1 << 20) << 20;
    let mut disk = Cursor::new(vec![0u8; size as usize]);
    fatfs::format_volume(
        &mut disk,
        fatfs::FormatVolumeOptions::new().volume_label(*b"CONFIG-2   "),
    )
    .map_err(|e| format!("formatting the config drive: {e}"))?;
    disk.set_position(0);
    {
        let fs = fatfs::FileSystem::new(&mut disk, fatfs::FsOptions::new())
            .map_err(|e| format!("opening the config drive: {e}"))?;
        let io = |e: std::io::Error| format!("writing the config drive: {e}");
        {
            let latest = fs
                .root_dir()
                .create_dir("openstack")
                .and_then(|d| d.create_dir("latest"))
                .map_err(io)?;
            let put = |name: &str, bytes: &[u8]| -> Result<(), String> {
                let mut f = latest.create_file(name).map_err(io)?;
                f.truncate().map_err(io)?;
                f.write_all(bytes).map_err(io)
            };
            put("meta_data.json", &meta)?;
            if let Some(u) = user_data {
                put("user_data", u.as_bytes())?;
            }
            if let Some(n) = &network {
                put("network_data.json", n)?;
            }
        }
        fs.unmount().map_err(io)?;
    }
    Ok(disk.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn bmos_meta_data_with_the_users_over_it() {
        let m = meta_data(
            "u-1",
            "lab",
            "node-0",
            Some("local-hostname: custom\nrole: worker\n"),
        )
        .unwrap();
        assert_eq!(m["uuid"], "u-1");
        assert_eq!(m["metal3-namespace"], "lab");
        assert_eq!(m["local_hostname"], "node-0");
        assert_eq!(m["local-hostname"], "custom");
        assert_eq!(m["role"], "worker");
        assert!(meta_data("u", "n", "h", Some("- a list")).is_err());
        assert!(network_data("links: []\nnetworks: []\n").unwrap()["links"].is_array());
    }

    #[test]
    fn the_image_is_a_config_2_vfat_with_the_files() {
        let m = meta_data("u-1", "lab", "node-0", None).unwrap();
        let img = build(
            &m,
            Some("#cloud-config\nhostname: node-0\n"),
            Some(&json!({"links": []})),
        )
        .unwrap();
        assert_eq!(img.len() % (1 << 20), 0);
        let fs = fatfs::FileSystem::new(Cursor::new(img.clone()), fatfs::FsOptions::new()).unwrap();
        assert_eq!(fs.volume_label(), "CONFIG-2");
        let mut s = String::new();
        fs.root_dir()
            .open_file("openstack/latest/user_data")
            .unwrap()
            .read_to_string(&mut s)
            .unwrap();
        assert_eq!(s, "#cloud-config\nhostname: node-0\n");
        let mut s = String::new();
        fs.root_dir()
            .open_file("openstack/latest/meta_data.json")
            .unwrap()
            .read_to_string(&mut s)
            .unwrap();
        assert_eq!(serde_json::from_str::<Value>(&s).unwrap(), m);
        // blkid, the tool cloud-init finds the drive with, agrees.
        if std::path::Path::new("/usr/sbin/blkid").exists()
            || std::path::Path::new("/sbin/blkid").exists()
        {
            let dir = tempfile::tempdir().unwrap();
            let p = dir.path().join("cd.img");
            std::fs::write(&p, &img).unwrap();
            let o = std::process::Command::new("blkid")
                .args(["-p", "-o", "export"])
                .arg(&p)
                .output()
                .unwrap();
            let out = String::from_utf8_lossy(&o.stdout);
            assert!(
                out.contains("LABEL=CONFIG-2") && out.contains("TYPE=vfat"),
                "{out}"
            );
        } else {
            eprintln!("DID NOT RUN: blkid is not installed; the label was checked by fatfs only");
        }
    }

    #[test]
    fn too_much_is_refused() {
        let big = "x".repeat(MAX_CONTENT_BYTES + 1);
        assert!(build(&json!({}), Some(&big), None).is_err());
    }
}
