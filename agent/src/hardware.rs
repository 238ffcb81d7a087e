//! The machine's hardware in Metal3's shape: baremetal-operator's
//! `HardwareDetails`, what a BareMetalHost's `status.hardware` holds, for
//! the `inspect` action. Read from /proc, /sys and /dev/disk under a root
//! (a fixture tree in tests, so that odd kernel answers are tested); the
//! IP addresses and uname's machine come from the caller. As BMO does,
//! what is not known is left out (or ""), never "unknown". Every list and
//! string is bounded: a hostile or broken sysfs cannot make the document
//! huge.

use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::net::IpAddr;
use std::path::Path;

pub const MAX_NICS: usize = 64;
pub const MAX_DISKS: usize = 256;
pub const MAX_FLAGS: usize = 1024;
/// Longer strings are cut: no field of a real machine comes close.
const MAX_STRING: usize = 256;
const MAX_ALT_NAMES: usize = 16;
/// sysfs attributes are at most a page; more is not an attribute.
const MAX_ATTR: u64 = 64 << 10;
/// /proc/cpuinfo of a very large machine is a few MiB.
const MAX_CPUINFO: u64 = 16 << 20;
/// Directory entries looked at in any one directory.
const MAX_ENTRIES: usize = 1 << 16;
/// Memory blocks counted (a 24 TiB machine with 128 MiB blocks has 196608).
const MAX_MEMORY_BLOCKS: usize = 1 << 21;

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HardwareDetails {
    pub system_vendor: SystemVendor,
    pub firmware: Firmware,
    pub ram_mebibytes: u64,
    pub nics: Vec<Nic>,
    pub storage: Vec<Storage>,
    pub cpu: Cpu,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub hostname: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SystemVendor {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub manufacturer: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub product_name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub serial_number: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Firmware {
    pub bios: Bios,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Bios {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub date: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub vendor: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub version: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Cpu {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub arch: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub model: String,
    pub clock_megahertz: f64,
    pub flags: Vec<String>,
    pub count: u32,
}

/// One address of one interface: BMO lists an interface once per
/// address (an IPv4 and an IPv6 one at most), or once with no IP.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Nic {
    pub name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub model: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub mac: String,
    pub ip: String,
    pub speed_gbps: u64,
    pub pxe: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum DiskType {
    #[serde(rename = "HDD")]
    Hdd,
    #[serde(rename = "SSD")]
    Ssd,
    #[serde(rename = "NVME")]
    Nvme,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Storage {
    pub name: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub alternate_names: Vec<String>,
    pub rotational: bool,
    #[serde(rename = "type")]
    pub kind: DiskType,
    /// 0 when the kernel's size is unreadable or beyond int64.
    pub size_bytes: u64,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub vendor: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub model: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub serial_number: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub wwn: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub wwn_vendor_extension: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub wwn_with_extension: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub hctl: String,
}

/// What is not under the root: the running kernel's answers.
#[derive(Debug, Clone, Default)]
pub struct Live {
    /// uname's machine (x86_64, aarch64).
    pub machine: String,
    /// The MAC the machine booted from (`BOOT_MAC`), if known.
    pub boot_mac: Option<String>,
    /// Every interface's addresses, by interface name.
    pub addrs: Vec<(String, IpAddr)>,
}

/// Up to `limit` bytes of a file under `root`.
fn read_bytes(root: &Path, p: &str, limit: u64) -> Option<Vec<u8>> {
    let f = std::fs::File::open(root.join(p.trim_start_matches('/'))).ok()?;
    let mut v = Vec::new();
    f.take(limit).read_to_end(&mut v).ok()?;
    Some(v)
}

/// Bytes as a field: lossy UTF-8, no control characters, trimmed, cut.
fn clean(b: &[u8]) -> String {
    let s: String = String::from_utf8_lossy(b)
        .chars()
        .filter(|c| !c.is_control())
        .collect();
    s.trim().chars().take(MAX_STRING).collect()
}

/// A sysfs or procfs attribute as a field; "" when absent.
fn text(root: &Path, p: &str) -> String {
    read_bytes(root, p, MAX_ATTR)
        .map(|b| clean(&b))
        .unwrap_or_default()
}

pub(crate) fn number<T: std::str::FromStr>(root: &Path, p: &str) -> Option<T> {
    text(root, p).parse().ok()
}

/// A directory's entry names (UTF-8 only: the kernel's names are ASCII),
/// sorted, at most [`MAX_ENTRIES`] looked at.
pub(crate) fn entries(root: &Path, p: &str) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir(root.join(p.trim_start_matches('/'))) else {
        return Vec::new();
    };
    let mut names: Vec<String> = dir
        .take(MAX_ENTRIES)
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    names.sort();
    names
}

pub fn collect(root: &Path, live: &Live) -> HardwareDetails {
    let dmi = |f: &str| text(root, &format!("/sys/class/dmi/id/{f}"));
    let hostname = text(root, "/proc/sys/kernel/hostname");
    HardwareDetails {
        system_vendor: SystemVendor {
            manufacturer: dmi("sys_vendor"),
            product_name: dmi("product_name"),
            serial_number: dmi("product_serial"),
        },
        firmware: Firmware {
            bios: Bios {
                date: dmi("bios_date"),
                vendor: dmi("bios_vendor"),
                version: dmi("bios_version"),
            },
        },
        ram_mebibytes: ram_mebibytes(root),
        nics: nics(root, live),
        storage: {
            let (by_path, by_id) = (links(root, "by-path"), links(root, "by-id"));
            disks(root)
                .iter()
                .map(|d| storage(root, d, &by_path, &by_id))
                .collect()
        },
        cpu: cpu(root, live),
        // The kernel's default when nobody set one.
        hostname: if hostname == "(none)" {
            String::new()
        } else {
            hostname
        },
    }
}

/// Physical memory: the online memory blocks, or else MemTotal (which
/// leaves out what the kernel reserved, so reads a little low).
fn ram_mebibytes(root: &Path) -> u64 {
    let block = u64::from_str_radix(
        &text(root, "/sys/devices/system/memory/block_size_bytes"),
        16,
    )
    .ok()
    .filter(|b| *b > 0);
    let blocks = block.and_then(|b| {
        let dir = std::fs::read_dir(root.join("sys/devices/system/memory")).ok()?;
        let online = dir
            .take(MAX_MEMORY_BLOCKS)
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("memory"))
            .filter(|e| read_bytes(&e.path(), "state", 64).is_some_and(|s| clean(&s) == "online"))
            .count() as u64;
        (online > 0).then(|| online.saturating_mul(b) >> 20)
    });
    blocks
        .or_else(|| {
            let m = read_bytes(root, "/proc/meminfo", MAX_ATTR)?;
            String::from_utf8_lossy(&m).lines().find_map(|l| {
                let kb = l.strip_prefix("MemTotal:")?.trim().strip_suffix("kB")?;
                kb.trim().parse::<u64>().ok().map(|k| k >> 10)
            })
        })
        .unwrap_or(0)
}

fn cpu(root: &Path, live: &Live) -> Cpu {
    let info = read_bytes(root, "/proc/cpuinfo", MAX_CPUINFO).unwrap_or_default();
    let info = String::from_utf8_lossy(&info);
    let field = |k: &str| {
        info.lines().find_map(|l| {
            let (key, v) = l.split_once(':')?;
            (key.trim() == k).then_some(v)
        })
    };
    let processors = info
        .lines()
        .filter(|l| {
            l.split_once(':')
                .is_some_and(|(k, _)| k.trim() == "processor")
        })
        .count();
    let count = u32::try_from(processors)
        .ok()
        .filter(|n| *n > 0)
        .or_else(|| online_cpus(&text(root, "/sys/devices/system/cpu/online")))
        .unwrap_or(0);
    // The rated maximum, as lscpu's "CPU max MHz"; the current speed when
    // there is no cpufreq driver (virtual machines).
    let clock = number::<u64>(
        root,
        "/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq",
    )
    .filter(|k| *k > 0)
    .map(|khz| khz as f64 / 1000.0)
    .or_else(|| field("cpu MHz").and_then(|v| v.trim().parse::<f64>().ok()))
    .filter(|m| m.is_finite() && *m >= 0.0)
    .unwrap_or(0.0);
    let flags: BTreeSet<String> = field("flags")
        .or_else(|| field("Features")) // arm64
        .map(|f| {
            f.split_whitespace()
                .map(|w| clean(w.as_bytes()))
                .filter(|w| !w.is_empty())
                .collect()
        })
        .unwrap_or_default();
    Cpu {
        arch: clean(live.machine.as_bytes()),
        model: field("model name")
            .map(|m| clean(m.as_bytes()))
            .unwrap_or_default(),
        clock_megahertz: clock,
        flags: flags.into_iter().take(MAX_FLAGS).collect(),
        count,
    }
}

/// The number of CPUs in a kernel CPU list (`0-3,6`).
fn online_cpus(list: &str) -> Option<u32> {
    let mut n = 0u32;
    for part in list.split(',').take(4096) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (a, b): (u32, u32) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
        n = n.checked_add(b.checked_sub(a)?.checked_add(1)?)?;
    }
    (n > 0).then_some(n)
}

/// A MAC as `aa:bb:cc:dd:ee:ff`, also from PXE's `01-aa-bb-...` form;
/// None when it is not one.
pub fn normalize_mac(s: &str) -> Option<String> {
    let s = s.trim().to_ascii_lowercase().replace('-', ":");
    let s = match s.strip_prefix("01:") {
        Some(rest) if rest.len() == 17 => rest.to_string(),
        _ => s,
    };
    let ok = s.len() == 17
        && s.split(':')
            .all(|p| p.len() == 2 && p.bytes().all(|b| b.is_ascii_hexdigit()));
    ok.then_some(s)
}

/// The physical interfaces (those with a `device`: not lo, bridges,
/// bonds, VLANs, veths or tunnels), one entry per address.
fn nics(root: &Path, live: &Live) -> Vec<Nic> {
    let boot = live.boot_mac.as_deref().and_then(normalize_mac);
    entries(root, "/sys/class/net")
        .into_iter()
        .filter(|n| n != "lo")
        .filter(|n| {
            std::fs::symlink_metadata(root.join("sys/class/net").join(n).join("device")).is_ok()
        })
        .take(MAX_NICS)
        .flat_map(|name| {
            let at = |f: &str| text(root, &format!("/sys/class/net/{name}/{f}"));
            let mac = normalize_mac(&at("address")).unwrap_or_default();
            let model = [at("device/vendor"), at("device/device")]
                .into_iter()
                .filter(|s| !s.is_empty())
                .collect::<Vec<_>>()
                .join(" ");
            let speed_gbps = at("speed")
                .parse::<i64>()
                .ok()
                .filter(|s| *s > 0)
                .map_or(0, |mbps| mbps as u64 / 1000);
            let pxe = !mac.is_empty() && boot.as_deref() == Some(mac.as_str());
            let base = Nic {
                name: name.clone(),
                model,
                mac,
                ip: String::new(),
                speed_gbps,
                pxe,
            };
            let mine = || {
                live.addrs
                    .iter()
                    .filter(|(n, _)| *n == name)
                    .map(|(_, a)| a)
            };
            let v4 = mine().find(|a| a.is_ipv4() && !a.is_loopback());
            let v6 = mine().find(|a| match a {
                IpAddr::V6(v6) => !v6.is_loopback() && !v6.is_unicast_link_local(),
                IpAddr::V4(_) => false,
            });
            let ips: Vec<String> = v4.into_iter().chain(v6).map(|a| a.to_string()).collect();
            if ips.is_empty() {
                vec![base]
            } else {
                ips.into_iter()
                    .map(|ip| Nic { ip, ..base.clone() })
                    .collect()
            }
        })
        .collect()
}

/// Names in /sys/block that are never real disks.
const NOT_DISKS: [&str; 8] = ["loop", "ram", "zram", "sr", "fd", "dm-", "md", "nbd"];

/// The machine's disks, by kernel name: /sys/block less virtual devices,
/// read-only ones, empty ones (a card reader with no card) and NVMe
/// multipath's hidden per-controller paths. `inspect` lists them and
/// `wipe-disks` wipes them: the same set.
pub fn disks(root: &Path) -> Vec<String> {
    entries(root, "/sys/block")
        .into_iter()
        .filter(|n| !NOT_DISKS.iter().any(|p| n.starts_with(p)))
        .filter(|n| {
            let at = |f: &str| text(root, &format!("/sys/block/{n}/{f}"));
            at("ro") != "1" && at("hidden") != "1" && at("size") != "0"
        })
        .take(MAX_DISKS)
        .collect()
}

/// `/dev/disk/<kind>` links by the kernel name they point at.
fn links(root: &Path, kind: &str) -> Links {
    let dir = format!("/dev/disk/{kind}");
    let mut by: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for link in entries(root, &dir) {
        let Ok(target) = std::fs::read_link(root.join(dir.trim_start_matches('/')).join(&link))
        else {
            continue;
        };
        if let Some(k) = target.file_name().and_then(|f| f.to_str()) {
            by.entry(k.to_string())
                .or_default()
                .push(format!("{dir}/{link}"));
        }
    }
    by
}

/// The disk's size in bytes, when the kernel's count of 512-byte sectors
/// is readable and the bytes fit BMO's int64.
pub fn disk_bytes(root: &Path, name: &str) -> Option<u64> {
    number::<u64>(root, &format!("/sys/block/{name}/size"))?
        .checked_mul(512)
        .filter(|b| i64::try_from(*b).is_ok())
}

/// udev's ID_WWN, ID_WWN_VENDOR_EXTENSION and ID_WWN_WITH_EXTENSION from
/// the kernel's wwid: an NAA name becomes `0x` hex (what Ironic's root
/// device hints compare); other kinds (eui., nvme., t10.) stay as given.
fn wwn(wwid: &str) -> (String, String, String) {
    let hex = wwid
        .strip_prefix("naa.")
        .map(str::to_ascii_lowercase)
        .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()));
    match hex {
        Some(h) if h.len() == 32 => (
            format!("0x{}", &h[..16]),
            format!("0x{}", &h[16..]),
            format!("0x{h}"),
        ),
        Some(h) if !h.is_empty() => (format!("0x{h}"), String::new(), format!("0x{h}")),
        _ => (wwid.to_string(), String::new(), String::new()),
    }
}

/// The unit serial number VPD page (0x80): a 4-byte header, then ASCII.
fn vpd_serial(page: &[u8]) -> String {
    match page {
        [_, 0x80, hi, lo, rest @ ..] => {
            let n = usize::from(u16::from_be_bytes([*hi, *lo]));
            clean(&rest[..n.min(rest.len())])
        }
        _ => String::new(),
    }
}

type Links = BTreeMap<String, Vec<String>>;

fn storage(root: &Path, name: &str, by_path: &Links, by_id: &Links) -> Storage {
    let at = |f: &str| text(root, &format!("/sys/block/{name}/{f}"));
    let dev = format!("/dev/{name}");
    let none = Vec::new();
    let by_path = by_path.get(name).unwrap_or(&none);
    let (main, other_paths) = match by_path.split_first() {
        Some((first, rest)) => (first.clone(), rest.to_vec()),
        None => (dev.clone(), Vec::new()),
    };
    let mut alternate: Vec<String> = Vec::new();
    if main != dev {
        alternate.push(dev);
    }
    alternate.extend(other_paths);
    alternate.extend(by_id.get(name).into_iter().flatten().cloned());
    alternate.truncate(MAX_ALT_NAMES);
    let rotational = at("queue/rotational") == "1";
    let kind = if name.starts_with("nvme") {
        DiskType::Nvme
    } else if rotational {
        DiskType::Hdd
    } else {
        DiskType::Ssd
    };
    let serial = [at("device/serial"), at("serial")]
        .into_iter()
        .find(|s| !s.is_empty())
        .unwrap_or_else(|| {
            read_bytes(
                root,
                &format!("/sys/block/{name}/device/vpd_pg80"),
                MAX_ATTR,
            )
            .map(|p| vpd_serial(&p))
            .unwrap_or_default()
        });
    let wwid = [at("device/wwid"), at("wwid")]
        .into_iter()
        .find(|s| !s.is_empty())
        .unwrap_or_default();
    let (wwn, wwn_vendor_extension, wwn_with_extension) = wwn(&wwid);
    let hctl = entries(root, &format!("/sys/block/{name}/device/scsi_device"))
        .into_iter()
        .find(|h| h.split(':').count() == 4 && h.split(':').all(|p| p.parse::<u32>().is_ok()))
        .unwrap_or_default();
    Storage {
        name: main,
        alternate_names: alternate,
        rotational,
        kind,
        size_bytes: disk_bytes(root, name).unwrap_or(0),
        vendor: at("device/vendor"),
        model: at("device/model"),
        serial_number: serial,
        wwn,
        wwn_vendor_extension,
        wwn_with_extension,
        hctl,
    }
}

impl HardwareDetails {
    /// What was found, in a few words: "4 CPUs, 2048 MiB, 1 disk, 1 NIC".
    pub fn summary(&self) -> String {
        let plural = |n: usize, one: &str| {
            if n == 1 {
                format!("1 {one}")
            } else {
                format!("{n} {one}s")
            }
        };
        let nics: BTreeSet<&str> = self.nics.iter().map(|n| n.name.as_str()).collect();
        format!(
            "{}, {} MiB, {}, {}",
            plural(self.cpu.count as usize, "CPU"),
            self.ram_mebibytes,
            plural(self.storage.len(), "disk"),
            plural(nics.len(), "NIC")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn put(root: &Path, p: &str, v: impl AsRef<[u8]>) {
        let f = root.join(p.trim_start_matches('/'));
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(f, v).unwrap();
    }

    fn link(root: &Path, p: &str, target: &str) {
        let f = root.join(p.trim_start_matches('/'));
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        symlink(target, f).unwrap();
    }

    /// A server with a SATA disk, an NVMe drive, a virtio disk, the
    /// devices that are not disks, and three interfaces.
    fn server(r: &Path) {
        put(
            r,
            "/proc/cpuinfo",
            "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Gold 6230 CPU @ 2.10GHz\ncpu MHz\t\t: 2095.078\nflags\t\t: sse2 fpu vmx fpu\n\n\
             processor\t: 1\nmodel name\t: Intel(R) Xeon(R) Gold 6230 CPU @ 2.10GHz\ncpu MHz\t\t: 1000.000\nflags\t\t: sse2 fpu vmx\n\n",
        );
        put(
            r,
            "/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq",
            "3900000\n",
        );
        put(r, "/proc/meminfo", "MemTotal:        2000000 kB\n");
        put(
            r,
            "/sys/devices/system/memory/block_size_bytes",
            "8000000\n",
        );
        for i in 0..17 {
            let state = if i == 16 { "offline\n" } else { "online\n" };
            put(
                r,
                &format!("/sys/devices/system/memory/memory{i}/state"),
                state,
            );
        }
        put(r, "/proc/sys/kernel/hostname", "node-1\n");
        put(r, "/sys/class/dmi/id/sys_vendor", "Dell Inc.\n");
        put(r, "/sys/class/dmi/id/product_name", "PowerEdge R640\n");
        put(r, "/sys/class/dmi/id/product_serial", "ABC1234\n");
        put(r, "/sys/class/dmi/id/bios_vendor", "Dell Inc.\n");
        put(r, "/sys/class/dmi/id/bios_version", "2.11.2\n");
        put(r, "/sys/class/dmi/id/bios_date", "08/05/2021\n");

        // eth0: the boot NIC, virtio, 1 Gb/s.
        put(r, "/sys/class/net/eth0/address", "52:54:00:AA:BB:01\n");
        put(r, "/sys/class/net/eth0/speed", "1000\n");
        put(r, "/sys/class/net/eth0/device/vendor", "0x1af4\n");
        put(r, "/sys/class/net/eth0/device/device", "0x1000\n");
        // eno2: link down (speed -1), no address.
        put(r, "/sys/class/net/eno2/address", "3c:fd:fe:00:00:02\n");
        put(r, "/sys/class/net/eno2/speed", "-1\n");
        put(r, "/sys/class/net/eno2/device/vendor", "0x8086\n");
        put(r, "/sys/class/net/eno2/device/device", "0x1572\n");
        // Not physical.
        put(r, "/sys/class/net/lo/address", "00:00:00:00:00:00\n");
        put(r, "/sys/class/net/br0/address", "52:54:00:aa:bb:01\n");

        // sda: SATA SSD with its udev links and a partition.
        put(r, "/sys/block/sda/size", "937703088\n");
        put(r, "/sys/block/sda/ro", "0\n");
        put(r, "/sys/block/sda/queue/rotational", "0\n");
        put(r, "/sys/block/sda/device/vendor", "ATA     \n");
        put(r, "/sys/block/sda/device/model", "SAMSUNG MZ7KH480\n");
        put(
            r,
            "/sys/block/sda/device/wwid",
            "naa.5002538e40a1b2c35002538e40a1b2c3\n",
        );
        let mut pg80 = vec![0, 0x80, 0, 8];
        pg80.extend_from_slice(b"S47PNA0N  ");
        put(r, "/sys/block/sda/device/vpd_pg80", pg80);
        std::fs::create_dir_all(r.join("sys/block/sda/device/scsi_device/0:0:0:0")).unwrap();
        put(r, "/sys/block/sda/sda1/start", "2048\n");
        link(r, "/dev/disk/by-path/pci-0000:00:17.0-ata-1", "../../sda");
        link(
            r,
            "/dev/disk/by-path/pci-0000:00:17.0-ata-1-part1",
            "../../sda1",
        );
        link(r, "/dev/disk/by-id/wwn-0x5002538e40a1b2c3", "../../sda");
        link(
            r,
            "/dev/disk/by-id/ata-SAMSUNG_MZ7KH480_S47PNA0N",
            "../../sda",
        );
        // nvme0n1, with its multipath sibling hidden.
        put(r, "/sys/block/nvme0n1/size", "3750748848\n");
        put(r, "/sys/block/nvme0n1/queue/rotational", "0\n");
        put(r, "/sys/block/nvme0n1/device/model", "Dell Ent NVMe CM6\n");
        put(r, "/sys/block/nvme0n1/device/serial", "Y0R0A01L\n");
        put(r, "/sys/block/nvme0n1/wwid", "eui.8ce38e0400a1b2c3\n");
        put(r, "/sys/block/nvme0c0n1/size", "3750748848\n");
        put(r, "/sys/block/nvme0c0n1/hidden", "1\n");
        // vda: rotational, no links, a non-UTF-8 vendor.
        put(r, "/sys/block/vda/size", "8388608\n");
        put(r, "/sys/block/vda/queue/rotational", "1\n");
        put(r, "/sys/block/vda/device/vendor", b"0x1af4\xff\x01");
        // Not disks.
        for d in [
            "loop0", "ram0", "zram0", "sr0", "fd0", "dm-0", "md127", "nbd0",
        ] {
            put(r, &format!("/sys/block/{d}/size"), "100\n");
        }
        put(r, "/sys/block/mmcblk0boot0/size", "8192\n");
        put(r, "/sys/block/mmcblk0boot0/ro", "1\n");
        put(r, "/sys/block/mmcblk1/size", "0\n");
    }

    fn live() -> Live {
        Live {
            machine: "x86_64".into(),
            boot_mac: Some("52:54:00:aa:bb:01".into()),
            addrs: vec![
                ("eth0".into(), "10.0.0.5".parse().unwrap()),
                ("eth0".into(), "fe80::1".parse().unwrap()),
                ("eth0".into(), "2001:db8::5".parse().unwrap()),
                ("eth0".into(), "10.0.0.6".parse().unwrap()),
                ("br0".into(), "192.168.1.1".parse().unwrap()),
            ],
        }
    }

    #[test]
    fn a_server_in_metal3s_shape() {
        let d = tempfile::tempdir().unwrap();
        server(d.path());
        let hw = collect(d.path(), &live());
        let v = serde_json::to_value(&hw).unwrap();
        assert_eq!(
            v["systemVendor"],
            serde_json::json!({"manufacturer": "Dell Inc.", "productName": "PowerEdge R640", "serialNumber": "ABC1234"})
        );
        assert_eq!(
            v["firmware"],
            serde_json::json!({"bios": {"date": "08/05/2021", "vendor": "Dell Inc.", "version": "2.11.2"}})
        );
        // 16 online blocks of 128 MiB; the offline one is not counted.
        assert_eq!(v["ramMebibytes"], 2048);
        assert_eq!(
            v["cpu"],
            serde_json::json!({
                "arch": "x86_64",
                "model": "Intel(R) Xeon(R) Gold 6230 CPU @ 2.10GHz",
                "clockMegahertz": 3900.0,
                "flags": ["fpu", "sse2", "vmx"],
                "count": 2,
            })
        );
        assert_eq!(v["hostname"], "node-1");
        assert_eq!(
            v["nics"],
            serde_json::json!([
                {"name": "eno2", "model": "0x8086 0x1572", "mac": "3c:fd:fe:00:00:02", "ip": "", "speedGbps": 0, "pxe": false},
                {"name": "eth0", "model": "0x1af4 0x1000", "mac": "52:54:00:aa:bb:01", "ip": "10.0.0.5", "speedGbps": 1, "pxe": true},
                {"name": "eth0", "model": "0x1af4 0x1000", "mac": "52:54:00:aa:bb:01", "ip": "2001:db8::5", "speedGbps": 1, "pxe": true},
            ])
        );
        let names: Vec<&str> = hw.storage.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "/dev/nvme0n1",
                "/dev/disk/by-path/pci-0000:00:17.0-ata-1",
                "/dev/vda"
            ]
        );
        assert_eq!(
            v["storage"][1],
            serde_json::json!({
                "name": "/dev/disk/by-path/pci-0000:00:17.0-ata-1",
                "alternateNames": ["/dev/sda", "/dev/disk/by-id/ata-SAMSUNG_MZ7KH480_S47PNA0N", "/dev/disk/by-id/wwn-0x5002538e40a1b2c3"],
                "rotational": false,
                "type": "SSD",
                "sizeBytes": 480103981056u64,
                "vendor": "ATA",
                "model": "SAMSUNG MZ7KH480",
                "serialNumber": "S47PNA0N",
                "wwn": "0x5002538e40a1b2c3",
                "wwnVendorExtension": "0x5002538e40a1b2c3",
                "wwnWithExtension": "0x5002538e40a1b2c35002538e40a1b2c3",
                "hctl": "0:0:0:0",
            })
        );
        assert_eq!(
            v["storage"][0],
            serde_json::json!({
                "name": "/dev/nvme0n1",
                "rotational": false,
                "type": "NVME",
                "sizeBytes": 1920383410176u64,
                "model": "Dell Ent NVMe CM6",
                "serialNumber": "Y0R0A01L",
                "wwn": "eui.8ce38e0400a1b2c3",
            })
        );
        let vda = &hw.storage[2];
        assert_eq!(vda.kind, DiskType::Hdd);
        assert!(vda.rotational);
        assert_eq!(vda.vendor, "0x1af4\u{fffd}");
        assert_eq!(hw.summary(), "2 CPUs, 2048 MiB, 3 disks, 2 NICs");
        assert_eq!(
            disks(d.path()),
            ["nvme0n1", "sda", "vda"],
            "virtual, read-only, empty and hidden devices are not disks"
        );
    }

    #[test]
    fn odd_and_hostile_values() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        // No cpuinfo processors (s390x-like), a cpu list instead.
        put(r, "/proc/cpuinfo", "vendor_id : IBM/S390\ncpu MHz : inf\n");
        put(r, "/sys/devices/system/cpu/online", "0-3,8\n");
        // MemTotal only; a block size that is not hex.
        put(r, "/proc/meminfo", "MemTotal:  1048576 kB\n");
        put(r, "/sys/devices/system/memory/block_size_bytes", "zz\n");
        put(r, "/proc/sys/kernel/hostname", "(none)\n");
        // A size that overflows int64 bytes, one that is not a number,
        // one beyond u64.
        put(r, "/sys/block/sdb/size", "18014398509481984\n");
        put(r, "/sys/block/sdc/size", "lots\n");
        put(r, "/sys/block/sdd/size", "99999999999999999999999\n");
        // A huge model, control characters, a short VPD page.
        put(r, "/sys/block/sdb/device/model", "M".repeat(100_000));
        put(r, "/sys/block/sdb/device/vendor", "\x1b[31mEVIL\x07\n");
        put(
            r,
            "/sys/block/sdb/device/vpd_pg80",
            [0u8, 0x80, 0xff, 0xff, b'X'],
        );
        put(
            r,
            "/sys/block/sdb/device/wwid",
            "t10.ATA     QEMU HARDDISK\n",
        );
        std::fs::create_dir_all(r.join("sys/block/sdb/device/scsi_device/not-hctl")).unwrap();
        // A MAC that is not one, a speed that is not a number.
        put(r, "/sys/class/net/eth0/address", "zz:zz\n");
        put(r, "/sys/class/net/eth0/speed", "fast\n");
        std::fs::create_dir_all(r.join("sys/class/net/eth0/device")).unwrap();
        // A dangling link in by-path.
        link(r, "/dev/disk/by-path/gone", "../../nothing");
        let hw = collect(
            r,
            &Live {
                boot_mac: Some("not a mac".into()),
                ..Live::default()
            },
        );
        assert_eq!(hw.cpu.count, 5);
        assert_eq!(hw.cpu.clock_megahertz, 0.0);
        assert_eq!(hw.ram_mebibytes, 1024);
        assert_eq!(hw.hostname, "");
        assert_eq!(hw.storage.len(), 3);
        let sdb = &hw.storage[0];
        assert_eq!(sdb.size_bytes, 0, "beyond int64 is not a size");
        assert_eq!(sdb.model.len(), MAX_STRING);
        assert_eq!(sdb.vendor, "[31mEVIL");
        assert_eq!(sdb.serial_number, "X");
        assert_eq!(sdb.wwn, "t10.ATA     QEMU HARDDISK");
        assert_eq!(sdb.hctl, "");
        assert_eq!(sdb.name, "/dev/sdb");
        assert!(sdb.alternate_names.is_empty());
        assert_eq!(hw.storage[1].size_bytes, 0);
        assert_eq!(hw.storage[2].size_bytes, 0);
        assert_eq!(hw.nics.len(), 1);
        assert_eq!(
            (
                hw.nics[0].mac.as_str(),
                hw.nics[0].speed_gbps,
                hw.nics[0].pxe
            ),
            ("", 0, false)
        );
        let v = serde_json::to_value(&hw).unwrap();
        assert!(v["nics"][0].get("mac").is_none(), "unknown is left out");
        assert!(v["systemVendor"].as_object().unwrap().is_empty());
    }

    #[test]
    fn bounded() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        let flags: Vec<String> = (0..3000).map(|i| format!("f{i:05}")).collect();
        put(
            r,
            "/proc/cpuinfo",
            format!("processor : 0\nflags : {}\n", flags.join(" ")),
        );
        for i in 0..300 {
            put(r, &format!("/sys/block/sd{i:03}/size"), "8\n");
        }
        for i in 0..100 {
            std::fs::create_dir_all(r.join(format!("sys/class/net/eth{i:03}/device"))).unwrap();
        }
        let hw = collect(r, &Live::default());
        assert_eq!(hw.cpu.flags.len(), MAX_FLAGS);
        assert_eq!(hw.storage.len(), MAX_DISKS);
        assert_eq!(hw.nics.len(), MAX_NICS);
    }

    #[test]
    fn nothing_readable_is_nothing_claimed() {
        let d = tempfile::tempdir().unwrap();
        let hw = collect(d.path(), &Live::default());
        assert_eq!(hw, HardwareDetails::default());
        assert_eq!(hw.summary(), "0 CPUs, 0 MiB, 0 disks, 0 NICs");
    }

    #[test]
    fn macs() {
        assert_eq!(
            normalize_mac("01-52-54-00-AA-BB-01").as_deref(),
            Some("52:54:00:aa:bb:01")
        );
        assert_eq!(
            normalize_mac(" 52:54:00:AA:BB:01\n").as_deref(),
            Some("52:54:00:aa:bb:01")
        );
        assert_eq!(normalize_mac("52:54:00:aa:bb"), None);
        assert_eq!(normalize_mac("52:54:00:aa:bb:0g"), None);
        assert_eq!(online_cpus("0"), Some(1));
        assert_eq!(online_cpus("0-4294967295"), None, "overflow");
        assert_eq!(online_cpus("3-1"), None);
    }
}
