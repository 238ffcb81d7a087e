//! The machine's hardware as tink-agent reports it with GetAction (its
//! `agent_attributes`, which the server keeps on the Hardware): CPU,
//! memory, disks, NICs and DMI, read from /proc and /sys under a root
//! (a directory of fixtures in tests). Values and their formats follow
//! tink-agent's (ghw's): sizes like `16GB`, "unknown" for what the
//! kernel does not say. PCI and GPU names need the pci.ids database,
//! which tink-agent's image lacks too: they are left out.

use crate::pb;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

fn read(root: &Path, p: &str) -> Option<String> {
    std::fs::read_to_string(root.join(p.trim_start_matches('/')))
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

fn or_unknown(v: Option<String>) -> Option<String> {
    Some(v.unwrap_or_else(|| "unknown".into()))
}

/// tink-agent's humanReadable: the largest 1024-based unit, rounded up.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 7] = ["B", "KB", "MB", "GB", "TB", "PB", "EB"];
    if bytes == 0 {
        return String::new();
    }
    let mut unit = 0;
    while unit + 1 < UNITS.len() && bytes >= 1u64 << (10 * (unit + 1)) {
        unit += 1;
    }
    let div = 1u64 << (10 * unit);
    format!("{}{}", bytes.div_ceil(div), UNITS[unit])
}

/// A DMI field, "unknown" when the firmware does not say.
fn dmi(root: &Path, field: &str) -> Option<String> {
    or_unknown(read(root, &format!("/sys/class/dmi/id/{field}")))
}

pub fn collect(root: &Path) -> pb::AgentAttributes {
    pb::AgentAttributes {
        cpu: cpu(root),
        memory: memory(root),
        block: block(root),
        network: network(root),
        pci: Vec::new(),
        gpu: Vec::new(),
        chassis: Some(pb::Chassis {
            serial: dmi(root, "chassis_serial"),
            vendor: dmi(root, "chassis_vendor"),
        }),
        bios: Some(pb::Bios {
            vendor: dmi(root, "bios_vendor"),
            version: dmi(root, "bios_version"),
            release_date: dmi(root, "bios_date"),
        }),
        baseboard: Some(pb::Baseboard {
            vendor: dmi(root, "board_vendor"),
            product: dmi(root, "board_name"),
            version: dmi(root, "board_version"),
            serial_number: dmi(root, "board_serial"),
        }),
        product: Some(pb::Product {
            name: dmi(root, "product_name"),
            vendor: dmi(root, "sys_vendor"),
            serial_number: dmi(root, "product_serial"),
        }),
    }
}

fn cpu(root: &Path) -> Option<pb::Cpu> {
    let text = read(root, "/proc/cpuinfo")?;
    #[derive(Default)]
    struct Package {
        cores: BTreeSet<String>,
        threads: u32,
        vendor: Option<String>,
        model: Option<String>,
        flags: Vec<String>,
    }
    let mut packages: BTreeMap<u32, Package> = BTreeMap::new();
    let mut threads = 0u32;
    for block in text.split("\n\n").filter(|b| b.contains("processor")) {
        let field = |k: &str| {
            block.lines().find_map(|l| {
                let (key, v) = l.split_once(':')?;
                (key.trim() == k).then(|| v.trim().to_string())
            })
        };
        threads += 1;
        let id = field("physical id")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let p = packages.entry(id).or_default();
        p.threads += 1;
        p.cores
            .insert(field("core id").unwrap_or_else(|| threads.to_string()));
        p.vendor = p.vendor.take().or_else(|| field("vendor_id"));
        p.model = p.model.take().or_else(|| field("model name"));
        if p.flags.is_empty() {
            p.flags = field("flags")
                .map(|f| f.split_whitespace().map(String::from).collect())
                .unwrap_or_default();
        }
    }
    if threads == 0 {
        return None;
    }
    let total_cores = packages.values().map(|p| p.cores.len() as u32).sum();
    Some(pb::Cpu {
        total_cores: Some(total_cores),
        total_threads: Some(threads),
        processors: packages
            .into_iter()
            .map(|(id, p)| pb::Processor {
                id: Some(id),
                cores: Some(p.cores.len() as u32),
                threads: Some(p.threads),
                vendor: p.vendor,
                model: p.model,
                capabilities: p.flags,
            })
            .collect(),
    })
}

fn memory(root: &Path) -> Option<pb::Memory> {
    let usable = read(root, "/proc/meminfo").and_then(|m| {
        m.lines().find_map(|l| {
            let kb = l.strip_prefix("MemTotal:")?.trim().strip_suffix("kB")?;
            kb.trim().parse::<u64>().ok().map(|k| k * 1024)
        })
    });
    // Physical memory: online blocks of block_size_bytes (hex).
    let block = read(root, "/sys/devices/system/memory/block_size_bytes")
        .and_then(|h| u64::from_str_radix(&h, 16).ok());
    let total = block.and_then(|b| {
        let dir = std::fs::read_dir(root.join("sys/devices/system/memory")).ok()?;
        let online = dir
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("memory"))
            .filter(|e| {
                std::fs::read_to_string(e.path().join("state")).is_ok_and(|s| s.trim() == "online")
            })
            .count() as u64;
        (online > 0).then_some(online * b)
    });
    if usable.is_none() && total.is_none() {
        return None;
    }
    Some(pb::Memory {
        total: Some(human(total.or(usable).unwrap_or(0))),
        usable: Some(human(usable.unwrap_or(0))),
    })
}

/// ghw's controller and drive type, by the device's name.
fn disk_kind(name: &str) -> Option<(&'static str, &'static str)> {
    let kinds = [
        ("nvme", "NVMe", "SSD"),
        ("sd", "SCSI", "HDD"),
        ("hd", "IDE", "HDD"),
        ("vd", "virtio", "HDD"),
        ("xvd", "SCSI", "HDD"),
        ("sr", "SCSI", "ODD"),
        ("mmc", "MMC", "SSD"),
    ];
    kinds
        .iter()
        .find(|(p, _, _)| name.starts_with(p))
        .map(|(_, c, d)| (*c, *d))
}

fn block(root: &Path) -> Vec<pb::Block> {
    let Ok(dir) = std::fs::read_dir(root.join("sys/block")) else {
        return Vec::new();
    };
    let mut names: Vec<String> = dir
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
        .into_iter()
        .filter_map(|name| {
            let (controller, mut drive) = disk_kind(&name)?;
            let at = |f: &str| read(root, &format!("/sys/block/{name}/{f}"));
            if drive == "HDD" && at("queue/rotational").as_deref() == Some("0") {
                drive = "SSD";
            }
            let sectors: u64 = at("size").and_then(|s| s.parse().ok()).unwrap_or(0);
            let pbs: u64 = at("queue/physical_block_size")
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            Some(pb::Block {
                name: Some(name.clone()),
                controller_type: Some(controller.into()),
                drive_type: Some(drive.into()),
                size: Some(human(sectors * 512)),
                physical_block_size: Some(human(pbs)),
                vendor: or_unknown(at("device/vendor")),
                model: or_unknown(at("device/model")),
                wwn: or_unknown(at("device/wwid")),
                serial_number: or_unknown(at("device/serial").or_else(|| at("serial"))),
            })
        })
        .collect()
}

fn network(root: &Path) -> Vec<pb::Network> {
    let Ok(dir) = std::fs::read_dir(root.join("sys/class/net")) else {
        return Vec::new();
    };
    let mut names: Vec<String> = dir
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "lo" && n != "bonding_masters")
        .collect();
    names.sort();
    names
        .into_iter()
        .map(|name| {
            let at = |f: &str| read(root, &format!("/sys/class/net/{name}/{f}"));
            // A random or stolen address is not the NIC's own.
            let mac = if at("addr_assign_type").as_deref() == Some("0") {
                at("address").unwrap_or_default()
            } else {
                String::new()
            };
            pb::Network {
                name: Some(name.clone()),
                mac: Some(mac),
                speed: Some(at("speed").unwrap_or_default()),
                enabled_capabilities: Vec::new(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(root: &Path, p: &str, v: &str) {
        let f = root.join(p.trim_start_matches('/'));
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(f, v).unwrap();
    }

    #[test]
    fn sizes_as_tink_agent_prints_them() {
        assert_eq!(human(0), "");
        assert_eq!(human(512), "512B");
        assert_eq!(human(4096), "4KB");
        assert_eq!(human(16 << 30), "16GB");
        assert_eq!(human((16 << 30) + 1), "17GB");
        assert_eq!(human(8 * 1024 * 1024 * 512), "4GB");
    }

    #[test]
    fn a_small_virtual_machine() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        put(
            r,
            "/proc/cpuinfo",
            "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: QEMU Virtual CPU\nphysical id\t: 0\ncore id\t: 0\nflags\t: fpu sse2\n\n\
             processor\t: 1\nvendor_id\t: GenuineIntel\nmodel name\t: QEMU Virtual CPU\nphysical id\t: 0\ncore id\t: 1\nflags\t: fpu sse2\n\n",
        );
        put(
            r,
            "/proc/meminfo",
            "MemTotal:         500000 kB\nMemFree: 1 kB\n",
        );
        put(
            r,
            "/sys/devices/system/memory/block_size_bytes",
            "8000000\n",
        );
        for i in 0..4 {
            put(
                r,
                &format!("/sys/devices/system/memory/memory{i}/state"),
                "online\n",
            );
        }
        put(r, "/sys/block/vda/size", "8388608\n");
        put(r, "/sys/block/vda/queue/rotational", "1\n");
        put(r, "/sys/block/vda/queue/physical_block_size", "512\n");
        put(r, "/sys/block/loop0/size", "0\n");
        put(r, "/sys/block/dm-0/size", "10\n");
        put(r, "/sys/class/net/eth0/address", "52:54:00:00:00:01\n");
        put(r, "/sys/class/net/eth0/addr_assign_type", "0\n");
        put(r, "/sys/class/net/eth0/speed", "-1\n");
        put(r, "/sys/class/net/lo/address", "00:00:00:00:00:00\n");
        put(r, "/sys/class/dmi/id/sys_vendor", "QEMU\n");
        let a = collect(r);
        let cpu = a.cpu.unwrap();
        assert_eq!((cpu.total_cores, cpu.total_threads), (Some(2), Some(2)));
        assert_eq!(cpu.processors[0].model.as_deref(), Some("QEMU Virtual CPU"));
        assert_eq!(cpu.processors[0].capabilities, vec!["fpu", "sse2"]);
        let mem = a.memory.unwrap();
        assert_eq!(mem.total.as_deref(), Some("512MB"));
        assert_eq!(mem.usable.as_deref(), Some("489MB"));
        assert_eq!(a.block.len(), 1, "loop and dm devices are left out");
        let vda = &a.block[0];
        assert_eq!(vda.controller_type.as_deref(), Some("virtio"));
        assert_eq!(vda.drive_type.as_deref(), Some("HDD"));
        assert_eq!(vda.size.as_deref(), Some("4GB"));
        assert_eq!(vda.vendor.as_deref(), Some("unknown"));
        assert_eq!(a.network.len(), 1);
        assert_eq!(a.network[0].mac.as_deref(), Some("52:54:00:00:00:01"));
        assert_eq!(a.product.unwrap().vendor.as_deref(), Some("QEMU"));
        assert_eq!(a.bios.unwrap().vendor.as_deref(), Some("unknown"));
    }

    #[test]
    fn nothing_readable_is_nothing_claimed() {
        let d = tempfile::tempdir().unwrap();
        let a = collect(d.path());
        assert!(a.cpu.is_none() && a.memory.is_none());
        assert!(a.block.is_empty() && a.network.is_empty());
    }
}
