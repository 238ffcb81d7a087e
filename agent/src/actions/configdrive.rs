//! configdrive (tinkerbox's own image): a Metal3 host's cloud-init user
//! data, meta data and network data reach the installed OS as Ironic leaves
//! them, on a config drive partition (ironic-python-agent's
//! create_config_drive_partition). tinkerbox builds the drive, a small
//! filesystem labelled `config-2` holding `openstack/latest/...`, and serves
//! it at `CONFIG_DRIVE_URL` (at most [`MAX_IMAGE`]); this action writes it
//! onto `DEST_DISK`, the disk the OS image was just written to:
//!
//! - over the partition already holding a filesystem labelled config-2
//!   (VFAT or ISO9660), when there is one (a second run finds its own);
//! - else into a new partition at the end of the disk. GPT: the backup
//!   header and entries are first moved to the disk's real end, as
//!   `sgdisk -e` does (the image was usually smaller than the disk), then a
//!   [`PART_MIN`] partition (IPA's size) of type Linux filesystem data, named
//!   config-2, 1 MiB-aligned, ends at the last aligned sector before the
//!   backup entries. MBR: a primary partition of type 0x83, likewise at the
//!   end (below 2^32 sectors), when one of the 4 slots is free; a logical
//!   partition is not made (IPA does not either).
//!
//! The on-disk structures are read and written with the `gpt` and `mbrman`
//! crates (headers, entries, CRCs); where a partition goes is decided here,
//! after checking every field that comes from the disk: a disk's table is
//! outside data, and both crates trust theirs in places (gpt asserts on an
//! entry size other than 128, mbrman's free-space search subtracts without
//! checking). gpt's `GptDisk::write` is not used: it rewrites the entries
//! packed to the front of the array, which renumbers a table with gaps (an
//! Ubuntu cloud image's partitions 1, 14 and 15 would become 1, 2 and 3);
//! the new entry is written into its own slot instead.

use super::fetch::{self, chain, mib};
use super::{ActionError, Env, Progress, Runner, inspect};
use crate::hardware;
use gpt::disk::LogicalBlockSize;
use gpt::header::Header;
use gpt::partition::Partition;
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Duration;

/// The largest config drive taken (Ironic's limit is the partition's).
pub const MAX_IMAGE: u64 = 64 << 20;
/// A new partition's size: IPA's MAX_CONFIG_DRIVE_SIZE_MB, or the image
/// rounded up to [`ALIGN`] if bigger.
pub const PART_MIN: u64 = 64 << 20;
/// New partitions start and end on 1 MiB, as parted's "optimal" does.
pub const ALIGN: u64 = 1 << 20;
/// What cloud-init looks for (in any case).
pub const LABEL: &str = "config-2";
/// The whole download, body included.
const FETCH_TIMEOUT: Duration = Duration::from_secs(300);
/// Bytes of a partition probed for a label: ISO9660's primary volume
/// descriptor is at 32 KiB; VFAT's label is in the first sector.
pub const PROBE: usize = 32768 + 2048;
/// GPT entries read at most (the usual table has 128).
const MAX_GPT_ENTRIES: u32 = 4096;
/// The only GPT entry size in use.
const GPT_ENTRY: u32 = 128;
/// An MBR entry's start and size are 32-bit sector counts.
const MBR_LIMIT: u64 = 1 << 32;
/// Linux filesystem: what parted's "mkpart primary fat32" writes too.
const MBR_LINUX: u8 = 0x83;
/// A GPT's protective MBR entry.
const MBR_PROTECTIVE: u8 = 0xEE;
/// The refusal for a disk without a table (an image of one filesystem).
pub const NO_TABLE: &str =
    "DEST_DISK has no partition table: a whole-disk image cannot take a config drive partition";

/// A filesystem a config drive is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fs {
    Vfat,
    Iso9660,
}

impl Fs {
    pub fn as_str(self) -> &'static str {
        match self {
            Fs::Vfat => "vfat",
            Fs::Iso9660 => "iso9660",
        }
    }
}

/// A label field: up to the first NUL, trailing spaces off.
fn label_text(b: &[u8]) -> String {
    let end = b.iter().position(|c| *c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).trim_end().to_string()
}

/// The label in a FAT boot sector's extended BPB (mkfs.vfat -n writes it
/// there and in the root directory; cloud-init's blkid reads either).
/// Some("") for a FAT filesystem without one.
fn vfat_label(b: &[u8]) -> Option<String> {
    let s = b.get(..512)?;
    if s[510..] != [0x55, 0xAA] || !matches!(s[0], 0xEB | 0xE9) {
        return None;
    }
    let per_sector = u16::from_le_bytes([s[11], s[12]]);
    let reserved = u16::from_le_bytes([s[14], s[15]]);
    if !per_sector.is_power_of_two()
        || !(512..=4096).contains(&per_sector)
        || !s[13].is_power_of_two()
        || reserved == 0
        || s[16] == 0
    {
        return None;
    }
    // FAT32 has no 16-bit FAT size, and its extended BPB is further on.
    let fat32 = u16::from_le_bytes([s[22], s[23]]) == 0;
    let (sig, label, kind) = if fat32 {
        (0x42, 0x47..0x52, 0x52..0x5A)
    } else {
        (0x26, 0x2B..0x36, 0x36..0x3E)
    };
    if s[sig] != 0x29 || !s[kind].starts_with(b"FAT") {
        return None;
    }
    let l = label_text(&s[label]);
    Some(if l == "NO NAME" { String::new() } else { l })
}

/// The volume identifier of an ISO9660 primary volume descriptor.
fn iso_label(b: &[u8]) -> Option<String> {
    let pvd = b.get(32768..32768 + 72)?;
    (pvd[0] == 1 && &pvd[1..6] == b"CD001").then(|| label_text(&pvd[40..72]))
}

/// The filesystem that `head` (a partition's first bytes, [`PROBE`] of
/// them for ISO9660) begins, and its label ("" when it has none).
pub fn fs_label(head: &[u8]) -> Option<(Fs, String)> {
    vfat_label(head)
        .map(|l| (Fs::Vfat, l))
        .or_else(|| iso_label(head).map(|l| (Fs::Iso9660, l)))
}

/// Whether `head` begins a filesystem labelled config-2.
pub fn is_config_drive(head: &[u8]) -> bool {
    fs_label(head).is_some_and(|(_, l)| l.eq_ignore_ascii_case(LABEL))
}

/// A new partition's size for an image of `image` bytes.
pub fn part_bytes(image: u64) -> u64 {
    image.div_ceil(ALIGN).saturating_mul(ALIGN).max(PART_MIN)
}

/// The logical sector size of DEST_DISK: sysfs's (under `root`) for a
/// device under /dev, a link such as /dev/disk/by-id/... followed; 512
/// for anything else (a file standing for a disk) or when sysfs says
/// nothing.
pub fn sector_size(root: &Path, dest: &str) -> u64 {
    let Some(rest) = dest.strip_prefix("/dev/") else {
        return 512;
    };
    let name = if rest.contains('/') {
        std::fs::read_link(root.join(dest.trim_start_matches('/')))
            .ok()
            .and_then(|t| t.file_name().and_then(|f| f.to_str()).map(str::to_string))
    } else {
        Some(rest.to_string())
    };
    name.and_then(|n| {
        hardware::number::<u64>(root, &format!("/sys/block/{n}/queue/logical_block_size"))
    })
    .unwrap_or(512)
}

/// A partition, in sectors; `number` is the kernel's (the GPT slot + 1,
/// or the MBR slot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub number: u32,
    pub start: u64,
    pub sectors: u64,
}

impl Span {
    fn end(&self) -> u64 {
        self.start.saturating_add(self.sectors)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Table {
    Gpt,
    Mbr,
}

/// Where the config drive went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    pub table: Table,
    pub part: Span,
    pub sector: u64,
    /// A new partition (else an existing config-2 one was overwritten).
    pub created: bool,
    /// GPT: the backup header and entries were moved to the disk's end.
    pub backup_moved: bool,
}

impl Placed {
    pub fn describe(&self, dest: &str, image: u64) -> String {
        let table = match self.table {
            Table::Gpt => "GPT",
            Table::Mbr => "MBR",
        };
        let how = if self.created {
            format!("to new {table} partition {} of {dest}", self.part.number)
        } else {
            format!(
                "over {table} partition {} of {dest}, which held a config-2 filesystem",
                self.part.number
            )
        };
        let moved = if self.backup_moved {
            "; the backup GPT was moved to the disk's end"
        } else {
            ""
        };
        format!(
            "wrote the config drive ({}) {how}: start {} (sector {}), size {} ({} sectors of {} bytes){moved}",
            mib(image),
            mib(self.part.start.saturating_mul(self.sector)),
            self.part.start,
            mib(self.part.sectors.saturating_mul(self.sector)),
            self.part.sectors,
            self.sector
        )
    }
}

fn failed(m: impl Into<String>) -> ActionError {
    ActionError::Failed(m.into())
}

fn read_at(disk: &File, at: u64, len: usize, what: &str) -> Result<Vec<u8>, ActionError> {
    let mut buf = vec![0u8; len];
    disk.read_exact_at(&mut buf, at)
        .map_err(|e| failed(format!("reading {what} of DEST_DISK: {e}")))?;
    Ok(buf)
}

fn write_at(disk: &File, buf: &[u8], at: u64, what: &str) -> Result<(), ActionError> {
    disk.write_all_at(buf, at)
        .map_err(|e| failed(format!("writing {what} to DEST_DISK: {e}")))
}

/// Sectors of a GPT entry array of `n` entries.
fn array_sectors(n: u32, sector: u64) -> u64 {
    (u64::from(n) * u64::from(GPT_ENTRY)).div_ceil(sector)
}

/// The primary GPT header's fields, checked against each other and the
/// disk's `disk_sectors` before anything is read or placed by them.
pub fn check_header(h: &Header, sector: u64, disk_sectors: u64) -> Result<(), String> {
    let bad = |m: String| Err(format!("DEST_DISK's GPT header is not sound: {m}"));
    if h.current_lba != 1 {
        return bad(format!("it says it is at LBA {}, not 1", h.current_lba));
    }
    if h.header_size_le != 92 {
        return bad(format!("it is {} bytes long, not 92", h.header_size_le));
    }
    if h.part_size != GPT_ENTRY {
        return bad(format!(
            "its entries are {} bytes (only {GPT_ENTRY} are supported)",
            h.part_size
        ));
    }
    if h.num_parts == 0 || h.num_parts > MAX_GPT_ENTRIES {
        return bad(format!(
            "it has {} entries (1 to {MAX_GPT_ENTRIES} are supported)",
            h.num_parts
        ));
    }
    let array_end = h.part_start.checked_add(array_sectors(h.num_parts, sector));
    if h.part_start < 2 || array_end.is_none_or(|e| e > h.first_usable) {
        return bad(format!(
            "its entries at LBA {} overlap LBA 0-1 or the usable area from LBA {}",
            h.part_start, h.first_usable
        ));
    }
    if h.first_usable > h.last_usable || h.last_usable >= h.backup_lba {
        return bad(format!(
            "its usable area (LBA {}..={}) is empty or reaches its backup header (LBA {})",
            h.first_usable, h.last_usable, h.backup_lba
        ));
    }
    if h.backup_lba >= disk_sectors {
        return bad(format!(
            "its backup header is at LBA {} but the disk has {disk_sectors} sectors: the image was bigger than the disk",
            h.backup_lba
        ));
    }
    Ok(())
}

/// The used entries of a checked GPT, each within the usable area.
fn gpt_spans(h: &Header, parts: &BTreeMap<u32, Partition>) -> Result<Vec<Span>, String> {
    let mut spans = Vec::new();
    for (n, p) in parts.iter().filter(|(_, p)| p.is_used()) {
        if p.first_lba > p.last_lba || p.first_lba < h.first_usable || p.last_lba > h.last_usable {
            return Err(format!(
                "DEST_DISK's GPT partition {n} (LBA {}..={}) is not within the usable area (LBA {}..={})",
                p.first_lba, p.last_lba, h.first_usable, h.last_usable
            ));
        }
        spans.push(Span {
            number: *n,
            start: p.first_lba,
            sectors: p.last_lba - p.first_lba + 1,
        });
    }
    Ok(spans)
}

/// Where a new partition goes on a GPT disk, and the backup's new place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GptPlan {
    pub backup_lba: u64,
    pub backup_entries: u64,
    pub last_usable: u64,
    pub part: Span,
}

/// The aligned `bytes` just below `end` (exclusive), not below `floor`.
fn at_end(end: u64, floor: u64, bytes: u64, sector: u64) -> Result<(u64, u64), String> {
    let align = ALIGN / sector;
    let sectors = bytes / sector;
    let aligned_end = end / align * align;
    aligned_end
        .checked_sub(sectors)
        .filter(|s| *s >= floor)
        .map(|s| (s, sectors))
        .ok_or_else(|| {
            format!(
                "no room for a {} config drive partition at the end of DEST_DISK: its partitions end at {} and the space for them at {}",
                mib(bytes),
                mib(floor.saturating_mul(sector)),
                mib(end.saturating_mul(sector))
            )
        })
}

/// The layout once the backup GPT is at the last sector of a disk of
/// `disk_sectors`, with a new partition of `bytes` at its end, in `slot`
/// (an unused entry).
pub fn plan_gpt(
    h: &Header,
    spans: &[Span],
    slot: Option<u32>,
    sector: u64,
    disk_sectors: u64,
    bytes: u64,
) -> Result<GptPlan, String> {
    let backup_lba = disk_sectors.saturating_sub(1);
    let backup_entries = backup_lba.saturating_sub(array_sectors(h.num_parts, sector));
    let last_usable = backup_entries.saturating_sub(1);
    let floor = spans
        .iter()
        .map(Span::end)
        .max()
        .unwrap_or(0)
        .max(h.first_usable);
    let (start, sectors) = at_end(last_usable.saturating_add(1), floor, bytes, sector)?;
    let slot = slot.ok_or_else(|| {
        format!(
            "DEST_DISK's GPT has no free entry: all {} are used",
            h.num_parts
        )
    })?;
    Ok(GptPlan {
        backup_lba,
        backup_entries,
        last_usable,
        part: Span {
            number: slot + 1,
            start,
            sectors,
        },
    })
}

/// A new primary partition of `bytes` at the end of an MBR disk, in
/// `slot` (1-4): below 2^32 sectors, the most an entry can address.
pub fn plan_mbr(
    spans: &[Span],
    slot: Option<usize>,
    sector: u64,
    disk_sectors: u64,
    bytes: u64,
) -> Result<Span, String> {
    let Some(slot) = slot else {
        return Err(
            "DEST_DISK's MBR already has 4 primary partitions: a config drive would need a logical \
             partition, which tinkerbox-agent does not make (neither does Ironic's agent)"
                .into(),
        );
    };
    let floor = spans
        .iter()
        .map(Span::end)
        .max()
        .unwrap_or(0)
        .max(ALIGN / sector);
    let (start, sectors) = at_end(disk_sectors.min(MBR_LIMIT), floor, bytes, sector)?;
    Ok(Span {
        number: slot as u32,
        start,
        sectors,
    })
}

/// A GPT as read and checked.
struct Gpt {
    lb: LogicalBlockSize,
    header: Header,
    spans: Vec<Span>,
    free_slot: Option<u32>,
}

fn read_gpt(disk: &File, lb: LogicalBlockSize, disk_sectors: u64) -> Result<Gpt, ActionError> {
    let sector = lb.as_u64();
    let mut d = disk;
    let header = gpt::header::read_header_from_arbitrary_device(&mut d, lb).map_err(|e| {
        failed(format!(
            "DEST_DISK's primary GPT header is unreadable: {e}; refusing to change the disk"
        ))
    })?;
    check_header(&header, sector, disk_sectors).map_err(failed)?;
    let parts = gpt::partition::file_read_partitions(&mut d, &header, lb)
        .map_err(|e| failed(format!("DEST_DISK's GPT entries are unreadable: {e}")))?;
    let spans = gpt_spans(&header, &parts).map_err(failed)?;
    // The crate leaves all-zero entries out of its map.
    let free_slot =
        (0..header.num_parts).find(|i| parts.get(&(i + 1)).is_none_or(|p| !p.is_used()));
    Ok(Gpt {
        lb,
        header,
        spans,
        free_slot,
    })
}

/// Writes `plan`'s partition into its slot, the backup entries and header
/// at the disk's end, the primary header, and the protective MBR's size.
fn write_gpt(disk: &File, g: &Gpt, plan: &GptPlan, disk_sectors: u64) -> Result<(), ActionError> {
    let sector = g.lb.as_u64();
    let mut d = disk;
    let io = |what: &'static str| move |e: std::io::Error| failed(format!("{what}: {e}"));
    let entry = Partition {
        part_type_guid: gpt::partition_types::LINUX_FS,
        part_guid: uuid::Uuid::new_v4(),
        first_lba: plan.part.start,
        last_lba: plan.part.start + plan.part.sectors - 1,
        flags: 0,
        name: LABEL.to_string(),
    };
    entry
        .write_to_device(
            &mut d,
            u64::from(plan.part.number - 1),
            g.header.part_start,
            g.lb,
            GPT_ENTRY,
        )
        .map_err(io("writing the new GPT entry"))?;
    // The backup entries are a copy of the primary's (a few KiB).
    let len = u64::from(g.header.num_parts) * u64::from(GPT_ENTRY);
    let entries = read_at(
        disk,
        g.header.part_start * sector,
        len as usize,
        "the GPT entries",
    )?;
    write_at(
        disk,
        &entries,
        plan.backup_entries * sector,
        "the backup GPT entries",
    )?;
    let mut primary = Header {
        backup_lba: plan.backup_lba,
        last_usable: plan.last_usable,
        ..g.header.clone()
    };
    let mut backup = Header {
        current_lba: plan.backup_lba,
        backup_lba: 1,
        part_start: plan.backup_entries,
        ..primary.clone()
    };
    backup
        .write_backup(&mut d, g.lb)
        .map_err(|e| failed(format!("writing the backup GPT header: {e}")))?;
    primary
        .write_primary(&mut d, g.lb)
        .map_err(|e| failed(format!("writing the primary GPT header: {e}")))?;
    // The protective entry covers the disk (fdisk warns of a mismatch).
    match gpt::mbr::ProtectiveMBR::from_disk(&mut d, g.lb) {
        Ok(mut pmbr) => {
            let covers = u32::try_from(disk_sectors - 1).unwrap_or(u32::MAX);
            let slot = (0..4).find_map(|i| {
                pmbr.partition(i)
                    .filter(|r| r.os_type == MBR_PROTECTIVE && r.lb_start == 1)
                    .map(|r| (i, r))
            });
            if let Some((i, mut r)) = slot
                && r.lb_size != covers
            {
                r.lb_size = covers;
                pmbr.set_partition(i, r);
                pmbr.update_conservative(&mut d)
                    .map_err(|e| failed(format!("writing the protective MBR: {e}")))?;
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "DEST_DISK's protective MBR is unreadable: left as it is")
        }
    }
    Ok(())
}

/// An MBR as read and checked.
struct Mbr {
    header: mbrman::MBRHeader,
    spans: Vec<Span>,
    /// Extended partitions: no filesystem of their own.
    extended: Vec<u32>,
    free_slot: Option<usize>,
}

fn read_mbr(disk: &File, disk_sectors: u64) -> Result<Mbr, ActionError> {
    let mut d = disk;
    let header = mbrman::MBRHeader::read_from(&mut d)
        .map_err(|e| failed(format!("DEST_DISK's MBR is unreadable: {}", chain(&e))))?;
    let (mut spans, mut extended, mut free_slot) = (Vec::new(), Vec::new(), None);
    for (i, p) in header.iter() {
        if p.is_unused() {
            free_slot = free_slot.or(Some(i));
            continue;
        }
        if p.sys == MBR_PROTECTIVE {
            return Err(failed(
                "DEST_DISK has a protective MBR but no GPT header at LBA 1: its GPT is damaged",
            ));
        }
        let s = Span {
            number: i as u32,
            start: u64::from(p.starting_lba),
            sectors: u64::from(p.sectors),
        };
        if s.start == 0 || s.sectors == 0 || s.end() > disk_sectors {
            return Err(failed(format!(
                "DEST_DISK's MBR partition {i} (sectors {}+{}) is empty, starts at sector 0 or runs past the disk's {disk_sectors} sectors",
                s.start, s.sectors
            )));
        }
        if p.is_extended() {
            extended.push(s.number);
        }
        spans.push(s);
    }
    Ok(Mbr {
        header,
        spans,
        extended,
        free_slot,
    })
}

fn write_mbr(disk: &File, m: &Mbr, part: &Span) -> Result<(), ActionError> {
    let mut header = m.header.clone();
    let (Ok(start), Ok(sectors)) = (u32::try_from(part.start), u32::try_from(part.sectors)) else {
        return Err(failed("the new MBR partition is beyond 2^32 sectors"));
    };
    let Some(entry) = header.get_mut(part.number as usize) else {
        return Err(failed(format!("no MBR slot {}", part.number)));
    };
    // CHS is left empty, as mbrman advises: nothing since DOS reads it.
    *entry = mbrman::MBRPartitionEntry {
        boot: mbrman::BOOT_INACTIVE,
        first_chs: mbrman::CHS::empty(),
        sys: MBR_LINUX,
        last_chs: mbrman::CHS::empty(),
        starting_lba: start,
        sectors,
    };
    let mut d = disk;
    header
        .write_into(&mut d)
        .map_err(|e| failed(format!("writing the MBR: {}", chain(&e))))
}

enum Found {
    Gpt(Gpt),
    /// Boxed: an MBR holds its 512 bytes.
    Mbr(Box<Mbr>),
}

fn read_table(disk: &File, lb: LogicalBlockSize, size: u64) -> Result<Found, ActionError> {
    let sector = lb.as_u64();
    let disk_sectors = size / sector;
    if disk_sectors < 3 {
        return Err(failed(format!(
            "DEST_DISK is {size} bytes: too small for a partition table"
        )));
    }
    if read_at(disk, sector, 8, "LBA 1")? == b"EFI PART" {
        return read_gpt(disk, lb, disk_sectors).map(Found::Gpt);
    }
    // A GPT of the other sector size: an image made for another disk.
    let other = if sector == 512 { 4096 } else { 512 };
    if size >= other + 8 && read_at(disk, other, 8, "the other LBA 1")? == b"EFI PART" {
        return Err(failed(format!(
            "DEST_DISK's GPT was made for {other}-byte sectors but the disk's are {sector} bytes: the image does not suit this disk"
        )));
    }
    let head = read_at(disk, 0, PROBE.min(size as usize), "the start")?;
    if let Some((fs, _)) = fs_label(&head) {
        return Err(failed(format!(
            "{NO_TABLE} (it begins with a {} filesystem)",
            fs.as_str()
        )));
    }
    if head.get(510..512) != Some(&[0x55, 0xAA]) {
        return Err(failed(NO_TABLE));
    }
    read_mbr(disk, disk_sectors).map(|m| Found::Mbr(Box::new(m)))
}

/// Puts `image` on `disk` (a disk, or a file standing for one, of
/// `sector`-byte sectors): over its config-2 partition, or into a new one
/// at its end. The image is written before the table that points at it.
pub fn put(disk: &File, sector: u64, image: &[u8]) -> Result<Placed, ActionError> {
    let lb = LogicalBlockSize::try_from(sector).map_err(|_| {
        failed(format!(
            "DEST_DISK's logical sectors are {sector} bytes: only 512 and 4096 are supported"
        ))
    })?;
    let size = super::disk::device_size(disk)
        .map_err(|e| failed(format!("the size of DEST_DISK: {e}")))?;
    let disk_sectors = size / sector;
    let found = read_table(disk, lb, size)?;
    let (table, spans, extended) = match &found {
        Found::Gpt(g) => (Table::Gpt, &g.spans, &[][..]),
        Found::Mbr(m) => (Table::Mbr, &m.spans, &m.extended[..]),
    };
    // Bounded: at most MAX_GPT_ENTRIES or 4 partitions.
    let mut drives = Vec::new();
    for s in spans.iter().filter(|s| !extended.contains(&s.number)) {
        let len = s.sectors.saturating_mul(sector).min(PROBE as u64) as usize;
        let head = read_at(
            disk,
            s.start * sector,
            len,
            &format!("partition {}", s.number),
        )?;
        if is_config_drive(&head) {
            drives.push(*s);
        }
    }
    let image_len = image.len() as u64;
    match drives[..] {
        [part] => {
            if image_len > part.sectors.saturating_mul(sector) {
                return Err(failed(format!(
                    "the config drive ({}) does not fit partition {} ({}), which holds DEST_DISK's config-2 filesystem",
                    mib(image_len),
                    part.number,
                    mib(part.sectors * sector)
                )));
            }
            write_at(disk, image, part.start * sector, "the config drive")?;
            Ok(Placed {
                table,
                part,
                sector,
                created: false,
                backup_moved: false,
            })
        }
        [] => {
            let bytes = part_bytes(image_len);
            match &found {
                Found::Gpt(g) => {
                    let plan = plan_gpt(
                        &g.header,
                        &g.spans,
                        g.free_slot,
                        sector,
                        disk_sectors,
                        bytes,
                    )
                    .map_err(failed)?;
                    write_at(disk, image, plan.part.start * sector, "the config drive")?;
                    write_gpt(disk, g, &plan, disk_sectors)?;
                    Ok(Placed {
                        table,
                        part: plan.part,
                        sector,
                        created: true,
                        backup_moved: plan.backup_lba != g.header.backup_lba,
                    })
                }
                Found::Mbr(m) => {
                    let part = plan_mbr(&m.spans, m.free_slot, sector, disk_sectors, bytes)
                        .map_err(failed)?;
                    write_at(disk, image, part.start * sector, "the config drive")?;
                    write_mbr(disk, m, &part)?;
                    Ok(Placed {
                        table,
                        part,
                        sector,
                        created: true,
                        backup_moved: false,
                    })
                }
            }
        }
        ref many => Err(failed(format!(
            "DEST_DISK has {} partitions labelled config-2 ({}): which one to write is not clear",
            many.len(),
            many.iter()
                .map(|s| s.number.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// `CONFIG_DRIVE_URL`, which must be http or https.
fn drive_url(env: &Env<'_>) -> Result<reqwest::Url, ActionError> {
    let v = env.required("CONFIG_DRIVE_URL")?;
    let url = reqwest::Url::parse(v)
        .map_err(|e| ActionError::Env(format!("CONFIG_DRIVE_URL is not a URL: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(ActionError::Env(format!(
            "CONFIG_DRIVE_URL={} must be an http or https URL",
            inspect::shown(&url)
        )));
    }
    Ok(url)
}

/// The config drive, whole: at most [`MAX_IMAGE`] bytes are taken.
pub async fn fetch_image(url: &reqwest::Url) -> Result<Vec<u8>, ActionError> {
    let shown = inspect::shown(url);
    let too_big = || {
        failed(format!(
            "{shown}: the config drive is bigger than {}",
            mib(MAX_IMAGE)
        ))
    };
    let mut resp = fetch::client()?
        .get(url.clone())
        .timeout(FETCH_TIMEOUT)
        .send()
        .await
        .map_err(|e| failed(format!("GET {shown}: {}", chain(&e))))?;
    if !resp.status().is_success() {
        return Err(failed(format!("GET {shown}: {}", resp.status())));
    }
    if resp.content_length().is_some_and(|n| n > MAX_IMAGE) {
        return Err(too_big());
    }
    let mut body = Vec::new();
    // Bounded: the request's timeout covers the body, and more than
    // MAX_IMAGE bytes end it.
    while let Some(c) = resp
        .chunk()
        .await
        .map_err(|e| failed(format!("GET {shown}: {}", chain(&e))))?
    {
        if body.len() as u64 + c.len() as u64 > MAX_IMAGE {
            return Err(too_big());
        }
        body.extend_from_slice(&c);
    }
    Ok(body)
}

/// Refuses an image cloud-init would not take for a config drive.
pub fn check_image(image: &[u8], shown: &str) -> Result<(), ActionError> {
    match fs_label(image) {
        Some((_, l)) if l.eq_ignore_ascii_case(LABEL) => Ok(()),
        Some((fs, l)) => Err(failed(format!(
            "{shown} is a {} filesystem labelled {l:?}, not {LABEL}: cloud-init would not find it",
            fs.as_str()
        ))),
        None => Err(failed(format!(
            "{shown} ({}) is not a VFAT or ISO9660 filesystem labelled {LABEL}",
            mib(image.len() as u64)
        ))),
    }
}

/// Opens DEST_DISK, puts the drive on it, fsyncs and has the kernel
/// re-read its partition table.
pub fn write(dest: &str, sector: u64, image: &[u8]) -> Result<String, ActionError> {
    let disk = OpenOptions::new()
        .read(true)
        .write(true)
        .open(dest)
        .map_err(ActionError::io(format!("opening DEST_DISK {dest}")))?;
    let placed = put(&disk, sector, image)?;
    disk.sync_all()
        .map_err(ActionError::io(format!("fsync of {dest}")))?;
    let mut msg = placed.describe(dest, image.len() as u64);
    match crate::sys::reread_partitions(&disk) {
        Ok(()) => {}
        // A file standing for a disk has no table to re-read.
        Err(e) if rustix::io::Errno::from_io_error(&e) == Some(rustix::io::Errno::NOTTY) => {}
        Err(e) => {
            tracing::warn!(disk = %dest, error = %e, "BLKRRPART after the config drive");
            msg.push_str(&format!(" (the kernel kept its old partition table: {e})"));
        }
    }
    Ok(msg)
}

pub async fn run(
    runner: &Runner,
    env: &Env<'_>,
    progress: &Progress,
) -> Result<String, ActionError> {
    let url = drive_url(env)?;
    let dest = env.required("DEST_DISK")?.to_string();
    let shown = inspect::shown(&url);
    progress.set(format!("fetching the config drive from {shown}"));
    let image = fetch_image(&url).await?;
    check_image(&image, &shown)?;
    let sector = sector_size(&runner.root, &dest);
    progress.set(format!("writing the config drive to {dest}"));
    tokio::task::spawn_blocking(move || write(&dest, sector, &image))
        .await
        .map_err(|e| failed(format!("configdrive stopped: {e}")))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::io::Write;
    use std::ops::Range;
    use std::process::{Command, Stdio};

    const MIB: u64 = 1 << 20;

    /// Whether every tool is here; says loudly which test did not run.
    fn have(tools: &[&str], test: &str) -> bool {
        let missing: Vec<&str> = tools
            .iter()
            .copied()
            .filter(|t| {
                Command::new(t)
                    .arg("--version")
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_err()
            })
            .collect();
        if !missing.is_empty() {
            eprintln!(
                "!!!!!!!! DID NOT RUN: {test}: {} not installed (Debian: fdisk, dosfstools, mtools, util-linux, gdisk) !!!!!!!!",
                missing.join(", ")
            );
        }
        missing.is_empty()
    }

    fn cloud_init_here(test: &str) -> bool {
        let ok = Command::new("/usr/bin/python3")
            .args(["-c", "import cloudinit.sources.helpers.openstack"])
            .output()
            .is_ok_and(|o| o.status.success());
        if !ok {
            eprintln!(
                "!!!!!!!! DID NOT RUN: {test}: cloud-init's reader (/usr/bin/python3 with the cloudinit package, Debian's cloud-init) is not installed !!!!!!!!"
            );
        }
        ok
    }

    fn sh(cmd: &mut Command) -> String {
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{cmd:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `len` bytes of old disk contents, different in every MiB.
    fn patterned(len: u64, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i % 251) as u8 ^ (i >> 20) as u8 ^ seed)
            .collect()
    }

    fn sfdisk(disk: &Path, script: &str) {
        let mut c = Command::new("sfdisk")
            .args(["--quiet", "--no-reread", "--no-tell-kernel"])
            .arg(disk)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        c.stdin
            .take()
            .unwrap()
            .write_all(script.as_bytes())
            .unwrap();
        assert!(c.wait().unwrap().success(), "sfdisk: {script}");
    }

    /// Partitions by number: (start, size, type, name).
    type Parts = BTreeMap<u32, (u64, u64, String, String)>;

    /// sfdisk --dump, and its partitions.
    fn partitions(disk: &Path) -> (String, Parts) {
        let dump = sh(Command::new("sfdisk").arg("--dump").arg(disk));
        let prefix = format!("{} : ", disk.display());
        let mut parts = BTreeMap::new();
        for line in dump.lines() {
            let Some((dev, fields)) = line.split_once(" : ") else {
                continue;
            };
            let n: u32 = dev
                .strip_prefix(&prefix[..prefix.len() - 3])
                .unwrap()
                .parse()
                .unwrap();
            let f: HashMap<&str, &str> = fields
                .split(',')
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.trim(), v.trim().trim_matches('"')))
                .collect();
            parts.insert(
                n,
                (
                    f["start"].parse().unwrap(),
                    f["size"].parse().unwrap(),
                    f["type"].to_string(),
                    f.get("name").unwrap_or(&"").to_string(),
                ),
            );
        }
        (dump, parts)
    }

    /// A config drive as tinkerbox builds it: VFAT labelled CONFIG-2
    /// holding openstack/latest/{meta_data.json,user_data}.
    fn drive(dir: &Path, uuid: &str, user_data: &str) -> Vec<u8> {
        let tree = dir.join(format!("tree-{uuid}"));
        let latest = tree.join("openstack/latest");
        std::fs::create_dir_all(&latest).unwrap();
        std::fs::write(
            latest.join("meta_data.json"),
            format!(r#"{{"uuid": "{uuid}", "hostname": "m1", "name": "m1"}}"#),
        )
        .unwrap();
        std::fs::write(latest.join("user_data"), user_data).unwrap();
        let img = dir.join(format!("{uuid}.img"));
        sh(Command::new("mkfs.vfat")
            .args(["-n", "CONFIG-2", "-C"])
            .arg(&img)
            .arg("4096"));
        sh(Command::new("mcopy")
            .arg("-s")
            .arg("-i")
            .arg(&img)
            .arg(tree.join("openstack"))
            .arg("::/"));
        std::fs::read(&img).unwrap()
    }

    /// What blkid makes of `bytes` (a partition's).
    fn blkid(dir: &Path, bytes: &[u8]) -> HashMap<String, String> {
        let f = dir.join(format!("blkid-{}", fastrand::u32(..)));
        std::fs::write(&f, bytes).unwrap();
        let out = sh(Command::new("blkid").args(["-p", "-o", "export"]).arg(&f));
        out.lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// cloud-init's own reader of a config drive, over the files of the
    /// partition `bytes`: (uuid, user data).
    fn cloud_init_reads(dir: &Path, bytes: &[u8]) -> (String, String) {
        let n = fastrand::u32(..);
        let img = dir.join(format!("part-{n}"));
        let out = dir.join(format!("mounted-{n}"));
        std::fs::write(&img, bytes).unwrap();
        std::fs::create_dir(&out).unwrap();
        sh(Command::new("mcopy")
            .args(["-s", "-i"])
            .arg(&img)
            .arg("::openstack")
            .arg(&out));
        let got = sh(Command::new("/usr/bin/python3").arg("-c").arg(
            "from cloudinit.sources.helpers.openstack import ConfigDriveReader; import json,sys; \
             r=ConfigDriveReader(sys.argv[1]).read_v2(); \
             print(json.dumps({\"uuid\": r[\"metadata\"][\"uuid\"], \"userdata\": r[\"userdata\"].decode() \
             if isinstance(r[\"userdata\"], bytes) else r[\"userdata\"]}))",
        ).arg(&out));
        let v: serde_json::Value = serde_json::from_str(&got).unwrap();
        (
            v["uuid"].as_str().unwrap().to_string(),
            v["userdata"].as_str().unwrap().to_string(),
        )
    }

    /// Asserts that `after` is `before` outside the sorted `changed`.
    fn same_outside(before: &[u8], after: &[u8], changed: &[Range<u64>]) {
        assert_eq!(before.len(), after.len(), "the disk keeps its size");
        let mut at = 0;
        for r in changed {
            let (s, e) = (r.start as usize, r.end as usize);
            assert!(before[at..s] == after[at..s], "bytes {at}..{s} changed");
            at = e;
        }
        assert!(before[at..] == after[at..], "bytes from {at} changed");
    }

    /// `files` (path, body, whether its length is sent) served.
    async fn serve<const N: usize>(files: [(&str, (Vec<u8>, bool)); N]) -> String {
        use crate::testing::File;
        let files = files
            .into_iter()
            .map(|(p, (body, length))| (p.to_string(), File { body, length }))
            .collect();
        crate::testing::serve(files, false).await
    }

    async fn action(url: &str, dest: &Path, root: &Path) -> Result<String, ActionError> {
        let env: BTreeMap<String, String> = [
            ("CONFIG_DRIVE_URL".to_string(), url.to_string()),
            ("DEST_DISK".to_string(), dest.display().to_string()),
        ]
        .into();
        let runner = Runner {
            root: root.to_path_buf(),
            power: false,
            ..Runner::default()
        };
        let (p, _rx) = Progress::channel();
        run(&runner, &Env(&env), &p).await
    }

    /// A FAT boot sector as mkfs.vfat writes it, labelled `label`.
    fn fat_sector(label: &str, fat32: bool) -> Vec<u8> {
        let mut s = vec![0u8; 512];
        s[..3].copy_from_slice(&[0xEB, 0x3C, 0x90]);
        s[3..11].copy_from_slice(b"mkfs.fat");
        s[11..13].copy_from_slice(&512u16.to_le_bytes());
        s[13] = 4;
        s[14..16].copy_from_slice(&4u16.to_le_bytes());
        s[16] = 2;
        let mut l = [b' '; 11];
        l[..label.len()].copy_from_slice(label.as_bytes());
        if fat32 {
            s[0x42] = 0x29;
            s[0x47..0x52].copy_from_slice(&l);
            s[0x52..0x5A].copy_from_slice(b"FAT32   ");
        } else {
            s[22..24].copy_from_slice(&32u16.to_le_bytes());
            s[0x26] = 0x29;
            s[0x2B..0x36].copy_from_slice(&l);
            s[0x36..0x3E].copy_from_slice(b"FAT16   ");
        }
        s[510] = 0x55;
        s[511] = 0xAA;
        s
    }

    fn iso(label: &str) -> Vec<u8> {
        let mut b = vec![0u8; PROBE];
        b[32768] = 1;
        b[32769..32774].copy_from_slice(b"CD001");
        b[32768 + 40..32768 + 72].fill(b' ');
        b[32768 + 40..32768 + 40 + label.len()].copy_from_slice(label.as_bytes());
        b
    }

    /// A config drive of `len` bytes that only the label probe looks at.
    fn fake_drive(len: usize) -> Vec<u8> {
        let mut b = fat_sector("CONFIG-2", false);
        b.resize(len, 0x77);
        b
    }

    #[test]
    fn labels_of_vfat_and_iso9660() {
        assert_eq!(
            fs_label(&fat_sector("CONFIG-2", false)),
            Some((Fs::Vfat, "CONFIG-2".into()))
        );
        assert_eq!(
            fs_label(&fat_sector("config-2", true)),
            Some((Fs::Vfat, "config-2".into()))
        );
        assert_eq!(
            fs_label(&fat_sector("NO NAME", true)),
            Some((Fs::Vfat, String::new()))
        );
        assert_eq!(
            fs_label(&iso("config-2")),
            Some((Fs::Iso9660, "config-2".into()))
        );
        assert!(is_config_drive(&iso("CONFIG-2")));
        assert!(is_config_drive(&fat_sector("Config-2", true)));
        assert!(!is_config_drive(&fat_sector("CONFIG-22", false)));
        assert!(!is_config_drive(&iso("cidata")));
        // Short, empty, garbage and near misses are nothing, never a panic.
        let good = fat_sector("CONFIG-2", false);
        assert_eq!(fs_label(&good[..511]), None);
        assert_eq!(fs_label(&[]), None);
        assert_eq!(fs_label(&iso("config-2")[..32800]), None);
        let mut rng = fastrand::Rng::with_seed(7);
        for _ in 0..2000 {
            let mut b: Vec<u8> = (0..PROBE).map(|_| rng.u8(..)).collect();
            let _ = fs_label(&b);
            b[..512].copy_from_slice(&good);
            b[11 + rng.usize(..6)] ^= 0xff;
            let _ = fs_label(&b);
        }
        for (at, v) in [
            (0, 0u8),
            (11, 0x03),
            (13, 3),
            (14, 0),
            (16, 0),
            (0x26, 0x28),
            (0x36, b'X'),
        ] {
            let mut b = good.clone();
            b[at] = v;
            if at == 14 {
                b[15] = 0;
            }
            assert_eq!(fs_label(&b), None, "byte {at:#x} = {v:#x}");
        }
        let mut mbr = vec![0u8; 512];
        mbr[510..].copy_from_slice(&[0x55, 0xAA]);
        assert_eq!(fs_label(&mbr), None);
    }

    #[test]
    fn sizes() {
        assert_eq!(part_bytes(1), 64 * MIB);
        assert_eq!(part_bytes(64 * MIB), 64 * MIB);
        assert_eq!(part_bytes(64 * MIB + 1), 65 * MIB);
        assert_eq!(part_bytes(u64::MAX), u64::MAX);
    }

    #[test]
    fn sector_size_from_sysfs() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        let put = |p: &str, v: &str| {
            let f = r.join(p);
            std::fs::create_dir_all(f.parent().unwrap()).unwrap();
            std::fs::write(f, v).unwrap();
        };
        put("sys/block/sdq/queue/logical_block_size", "4096\n");
        put("sys/block/sda/queue/logical_block_size", "512\n");
        std::fs::create_dir_all(r.join("dev/disk/by-id")).unwrap();
        std::os::unix::fs::symlink("../../sdq", r.join("dev/disk/by-id/wwn-0x5")).unwrap();
        assert_eq!(sector_size(r, "/dev/sdq"), 4096);
        assert_eq!(sector_size(r, "/dev/disk/by-id/wwn-0x5"), 4096);
        assert_eq!(sector_size(r, "/dev/sda"), 512);
        // Not said: 512, as for a file standing for a disk.
        assert_eq!(sector_size(r, "/dev/nvme0n1"), 512);
        assert_eq!(sector_size(r, "/dev/disk/by-id/nothing"), 512);
        assert_eq!(sector_size(r, "/tmp/disk.img"), 512);
    }

    fn header() -> Header {
        Header {
            signature: "EFI PART".into(),
            revision: (1, 0),
            header_size_le: 92,
            crc32: 0,
            reserved: 0,
            current_lba: 1,
            backup_lba: 327679,
            first_usable: 34,
            last_usable: 327646,
            disk_guid: uuid::Uuid::nil(),
            part_start: 2,
            num_parts: 128,
            part_size: 128,
            crc32_parts: 0,
        }
    }

    #[test]
    fn gpt_headers_are_checked() {
        assert_eq!(check_header(&header(), 512, 524288), Ok(()));
        assert_eq!(check_header(&header(), 512, 327680), Ok(()));
        type Bad = (fn(&mut Header), &'static str);
        let bad: [Bad; 9] = [
            (|h| h.current_lba = 2, "at LBA 2, not 1"),
            (|h| h.header_size_le = 96, "96 bytes long"),
            (|h| h.part_size = 256, "entries are 256 bytes"),
            (|h| h.num_parts = 0, "0 entries"),
            (|h| h.num_parts = u32::MAX, "4294967295 entries"),
            (|h| h.part_start = u64::MAX, "overlap"),
            (|h| h.first_usable = 20, "overlap"),
            (|h| h.last_usable = 327679, "reaches its backup header"),
            (
                |h| h.backup_lba = u64::MAX,
                "the image was bigger than the disk",
            ),
        ];
        for (f, want) in bad {
            let mut h = header();
            f(&mut h);
            let e = check_header(&h, 512, 524288).unwrap_err();
            assert!(e.contains(want), "{want}: {e}");
        }
        let e = check_header(&header(), 512, 300000).unwrap_err();
        assert!(
            e.contains("backup header is at LBA 327679 but the disk has 300000 sectors"),
            "{e}"
        );
    }

    #[test]
    fn where_a_new_partition_goes() {
        let spans = [
            Span {
                number: 1,
                start: 2048,
                sectors: 65536,
            },
            Span {
                number: 2,
                start: 67584,
                sectors: 131072,
            },
        ];
        // A 160 MiB image on a 256 MiB disk.
        let p = plan_gpt(&header(), &spans, Some(2), 512, 524288, 64 * MIB).unwrap();
        assert_eq!(
            p,
            GptPlan {
                backup_lba: 524287,
                backup_entries: 524255,
                last_usable: 524254,
                part: Span {
                    number: 3,
                    start: 391168,
                    sectors: 131072
                },
            }
        );
        // Exactly enough room, and one MiB less.
        let p = plan_gpt(
            &header(),
            &spans,
            Some(2),
            512,
            198656 + 131072 + 2048,
            64 * MIB,
        )
        .unwrap();
        assert_eq!(p.part.start, 198656);
        let e = plan_gpt(&header(), &spans, Some(2), 512, 198656 + 131072, 64 * MIB).unwrap_err();
        assert!(
            e.starts_with("no room for a 64.0 MiB config drive partition at the end of DEST_DISK: its partitions end at 97.0 MiB and the space for them at 161.0 MiB"),
            "{e}"
        );
        let e = plan_gpt(&header(), &spans, None, 512, 524288, 64 * MIB).unwrap_err();
        assert_eq!(e, "DEST_DISK's GPT has no free entry: all 128 are used");
        assert!(plan_gpt(&header(), &spans, Some(2), 512, 0, 64 * MIB).is_err());
        // 4Kn: 4 sectors of entries, 256-sector MiBs.
        let h4 = Header {
            first_usable: 6,
            ..header()
        };
        let p = plan_gpt(&h4, &[], Some(0), 4096, 49152, 64 * MIB).unwrap();
        assert_eq!(
            (p.backup_entries, p.last_usable, p.part),
            (
                49147,
                49146,
                Span {
                    number: 1,
                    start: 32512,
                    sectors: 16384
                }
            )
        );

        // MBR: at the disk's end, on a MiB.
        assert_eq!(
            plan_mbr(&spans, Some(3), 512, 524288, 64 * MIB),
            Ok(Span {
                number: 3,
                start: 393216,
                sectors: 131072
            })
        );
        assert_eq!(
            plan_mbr(&spans, Some(3), 512, 524288 + 2047, 64 * MIB).map(|s| s.start),
            Ok(393216)
        );
        // Beyond 2 TiB: below 2^32 sectors, the most an entry addresses.
        let p = plan_mbr(&spans, Some(4), 512, 1 << 33, 64 * MIB).unwrap();
        assert_eq!(p.start + p.sectors, 1 << 32);
        // Never over LBA 0's MiB, never without a slot.
        assert!(plan_mbr(&[], Some(1), 512, 131072, 64 * MIB).is_err());
        assert_eq!(
            plan_mbr(&[], Some(1), 512, 133120, 64 * MIB).map(|s| s.start),
            Ok(2048)
        );
        let e = plan_mbr(&spans, None, 512, 524288, 64 * MIB).unwrap_err();
        assert!(e.contains("already has 4 primary partitions"), "{e}");
    }

    /// A GPT disk made with the gpt crate (sfdisk cannot make 4Kn ones).
    fn gpt_disk(path: &Path, size: u64, lb: LogicalBlockSize, parts: &[u64]) {
        let mut f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .unwrap();
        f.set_len(size).unwrap();
        let n = size / lb.as_u64();
        gpt::mbr::ProtectiveMBR::with_lb_size(u32::try_from(n - 1).unwrap_or(u32::MAX))
            .overwrite_lba0(&mut f)
            .unwrap();
        let mut g = gpt::GptConfig::new()
            .writable(true)
            .logical_block_size(lb)
            .create_from_device(f, None)
            .unwrap();
        for (i, b) in parts.iter().enumerate() {
            g.add_partition(
                &format!("p{}", i + 1),
                *b,
                gpt::partition_types::LINUX_FS,
                0,
                Some(ALIGN / lb.as_u64()),
            )
            .unwrap();
        }
        g.write().unwrap();
    }

    fn put_file(path: &Path, sector: u64, image: &[u8]) -> Result<Placed, ActionError> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap();
        put(&f, sector, image)
    }

    fn crc32(b: &[u8]) -> u32 {
        let mut c = flate2::Crc::new();
        c.update(b);
        c.sum()
    }

    /// Changes the primary GPT header (LBA 1 of 512) with `f`, then makes
    /// its CRC right again.
    fn patch_header(disk: &mut [u8], f: impl FnOnce(&mut [u8])) {
        let h = &mut disk[512..604];
        f(h);
        h[16..20].fill(0);
        let c = crc32(h);
        h[16..20].copy_from_slice(&c.to_le_bytes());
    }

    /// Every hostile table fails with a clear error and leaves the disk
    /// as it was: no panic, whatever the crates would have done.
    #[test]
    fn hostile_tables_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let good = d.path().join("good");
        gpt_disk(&good, 8 * MIB, LogicalBlockSize::Lb512, &[MIB, MIB]);
        let good = std::fs::read(&good).unwrap();
        let image = fake_drive(4096);
        type Spoil = Box<dyn Fn(&mut Vec<u8>)>;
        let cases: Vec<(&str, Spoil, &str)> = vec![
            (
                "header CRC",
                Box::new(|b| b[512 + 60] ^= 1),
                "primary GPT header is unreadable",
            ),
            (
                "entries CRC",
                Box::new(|b| b[1024 + 200] ^= 1),
                "GPT entries are unreadable: partition table CRC mismatch",
            ),
            (
                "entry size 256",
                Box::new(|b| patch_header(b, |h| h[84..88].copy_from_slice(&256u32.to_le_bytes()))),
                "its entries are 256 bytes",
            ),
            (
                "4 billion entries",
                Box::new(|b| {
                    patch_header(b, |h| h[80..84].copy_from_slice(&u32::MAX.to_le_bytes()))
                }),
                "it has 4294967295 entries",
            ),
            (
                "entries over the header",
                Box::new(|b| patch_header(b, |h| h[72..80].copy_from_slice(&u64::to_le_bytes(1)))),
                "overlap LBA 0-1",
            ),
            (
                "backup past the disk",
                Box::new(|b| {
                    patch_header(b, |h| h[32..40].copy_from_slice(&u64::to_le_bytes(1 << 40)))
                }),
                "the image was bigger than the disk",
            ),
            (
                "a partition past the usable area",
                Box::new(|b| {
                    b[1024 + 40..1024 + 48].copy_from_slice(&u64::to_le_bytes(u64::MAX));
                    let c = crc32(&b[1024..1024 + 16384]);
                    patch_header(b, |h| h[88..92].copy_from_slice(&c.to_le_bytes()));
                }),
                "GPT partition 1 (LBA 2048..=18446744073709551615) is not within the usable area",
            ),
            (
                "truncated after the header",
                Box::new(|b| b.truncate(1536)),
                "the image was bigger than the disk",
            ),
            (
                "too small for anything",
                Box::new(|b| b.truncate(1000)),
                "DEST_DISK is 1000 bytes: too small for a partition table",
            ),
            (
                "protective MBR, no GPT",
                Box::new(|b| b[512..1024].fill(0)),
                "protective MBR but no GPT header at LBA 1",
            ),
            (
                "garbage",
                Box::new(|b| {
                    let mut rng = fastrand::Rng::with_seed(11);
                    b.iter_mut().for_each(|x| *x = rng.u8(..));
                    b[510] = 0;
                }),
                NO_TABLE,
            ),
            ("zeros", Box::new(|b| b.fill(0)), NO_TABLE),
            (
                "a whole-disk filesystem",
                Box::new(|b| {
                    b.fill(0);
                    b[..512].copy_from_slice(&fat_sector("ROOT", true));
                }),
                "DEST_DISK has no partition table: a whole-disk image cannot take a config drive partition (it begins with a vfat filesystem)",
            ),
            (
                "an MBR entry past the disk",
                Box::new(|b| {
                    b.fill(0);
                    b[446 + 4] = 0x83;
                    b[446 + 8..446 + 12].copy_from_slice(&2048u32.to_le_bytes());
                    b[446 + 12..446 + 16].copy_from_slice(&u32::MAX.to_le_bytes());
                    b[510..512].copy_from_slice(&[0x55, 0xAA]);
                }),
                "MBR partition 1 (sectors 2048+4294967295) is empty, starts at sector 0 or runs past",
            ),
            (
                "an MBR with a bad boot flag",
                Box::new(|b| {
                    b.fill(0);
                    b[446] = 0x12;
                    b[510..512].copy_from_slice(&[0x55, 0xAA]);
                }),
                "DEST_DISK's MBR is unreadable",
            ),
        ];
        for (what, spoil, want) in cases {
            let mut bytes = good.clone();
            spoil(&mut bytes);
            let p = d.path().join("disk");
            std::fs::write(&p, &bytes).unwrap();
            let e = put_file(&p, 512, &image).unwrap_err().to_string();
            assert!(e.contains(want), "{what}: {e}");
            assert!(
                std::fs::read(&p).unwrap() == bytes,
                "{what}: the disk changed"
            );
        }
        // A 512-byte GPT on a 4Kn disk, and sectors of no known size.
        let p = d.path().join("disk");
        std::fs::write(&p, &good).unwrap();
        let e = put_file(&p, 4096, &image).unwrap_err().to_string();
        assert!(
            e.contains("made for 512-byte sectors but the disk's are 4096 bytes"),
            "{e}"
        );
        let e = put_file(&p, 520, &image).unwrap_err().to_string();
        assert!(e.contains("520 bytes: only 512 and 4096"), "{e}");
        assert!(std::fs::read(&p).unwrap() == good);
    }

    /// One config-2 partition is written over (the image must fit it);
    /// two are refused.
    #[test]
    fn an_existing_config_drive_partition() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("disk");
        gpt_disk(&p, 16 * MIB, LogicalBlockSize::Lb512, &[MIB, 2 * MIB]);
        let f = OpenOptions::new().read(true).write(true).open(&p).unwrap();
        // Partition 1 (LBA 2048, 1 MiB) is an old config drive.
        f.write_all_at(&fake_drive(4096), 2048 * 512).unwrap();
        let e = put(&f, 512, &fake_drive(MIB as usize + 1))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "the config drive (1.0 MiB) does not fit partition 1 (1.0 MiB), which holds DEST_DISK's config-2 filesystem"
        );
        let before = std::fs::read(&p).unwrap();
        let image = fake_drive(MIB as usize);
        let placed = put(&f, 512, &image).unwrap();
        assert_eq!(
            placed,
            Placed {
                table: Table::Gpt,
                part: Span {
                    number: 1,
                    start: 2048,
                    sectors: 2048
                },
                sector: 512,
                created: false,
                backup_moved: false,
            }
        );
        let after = std::fs::read(&p).unwrap();
        same_outside(&before, &after, std::slice::from_ref(&(MIB..2 * MIB)));
        assert!(after[MIB as usize..2 * MIB as usize] == image[..]);
        // An ISO9660 config drive in partition 2 too: which one?
        f.write_all_at(&iso("config-2"), 4096 * 512).unwrap();
        let e = put(&f, 512, &image).unwrap_err().to_string();
        assert_eq!(
            e,
            "DEST_DISK has 2 partitions labelled config-2 (1, 2): which one to write is not clear"
        );
    }

    /// A 4Kn disk (made and read back with the gpt crate: sfdisk cannot
    /// make one in a file): 256-sector alignment, 4 sectors of entries.
    #[test]
    fn a_4kn_gpt_disk() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("disk");
        gpt_disk(&p, 64 * MIB, LogicalBlockSize::Lb4096, &[8 * MIB, 8 * MIB]);
        OpenOptions::new()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(192 * MIB)
            .unwrap();
        let image = fake_drive(MIB as usize);
        let e = put_file(&p, 512, &image).unwrap_err().to_string();
        assert!(
            e.contains("made for 4096-byte sectors but the disk's are 512 bytes"),
            "{e}"
        );
        let placed = put_file(&p, 4096, &image).unwrap();
        assert_eq!(
            placed.part,
            Span {
                number: 3,
                start: 32512,
                sectors: 16384
            }
        );
        assert!(placed.created && placed.backup_moved);
        assert_eq!(
            placed.describe("/dev/sdq", MIB),
            "wrote the config drive (1.0 MiB) to new GPT partition 3 of /dev/sdq: start 127.0 MiB (sector 32512), \
             size 64.0 MiB (16384 sectors of 4096 bytes); the backup GPT was moved to the disk's end"
        );
        let g = gpt::GptConfig::new()
            .logical_block_size(LogicalBlockSize::Lb4096)
            .only_valid_headers(true)
            .open_from_device(File::open(&p).unwrap())
            .unwrap();
        let backup = g.backup_header().unwrap();
        assert_eq!((backup.current_lba, backup.part_start), (49151, 49147));
        assert_eq!(g.primary_header().unwrap().last_usable, 49146);
        let parts = g.partitions();
        assert_eq!(parts.len(), 3);
        assert_eq!((parts[&1].first_lba, parts[&2].first_lba), (256, 2304));
        let p3 = &parts[&3];
        assert_eq!((p3.first_lba, p3.last_lba), (32512, 48895));
        assert_eq!(p3.name, "config-2");
        assert_eq!(p3.part_type_guid, gpt::partition_types::LINUX_FS);
        let mut f = File::open(&p).unwrap();
        let pmbr = gpt::mbr::ProtectiveMBR::from_disk(&mut f, LogicalBlockSize::Lb4096).unwrap();
        assert_eq!(pmbr.partition(0).unwrap().lb_size, 49151);
        assert!(std::fs::read(&p).unwrap()[32512 * 4096..][..image.len()] == image[..]);
        // Again: the same partition.
        let again = put_file(&p, 4096, &image).unwrap();
        assert_eq!((again.part, again.created), (placed.part, false));
    }

    /// The OS image (a GPT of 160 MiB, partitions 1 and 2) on a 256 MiB
    /// disk: its backup GPT is in the middle of the disk, as after
    /// image2disk. The config drive lands at the disk's end, found by
    /// blkid and read by cloud-init; a second run writes over it.
    #[tokio::test]
    async fn a_gpt_disk_gets_a_config_drive_partition_at_its_end() {
        let test = "a_gpt_disk_gets_a_config_drive_partition_at_its_end";
        if !have(&["sfdisk", "mkfs.vfat", "mcopy", "blkid"], test) {
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let dir = d.path();
        let img = dir.join("os.img");
        std::fs::write(&img, patterned(160 * MIB, 0x11)).unwrap();
        sfdisk(
            &img,
            "label: gpt\nstart=2048, size=65536, name=boot\nstart=67584, size=131072, name=root\n",
        );
        let disk = dir.join("sda");
        let mut bytes = patterned(256 * MIB, 0x22);
        let os = std::fs::read(&img).unwrap();
        bytes[..os.len()].copy_from_slice(&os);
        std::fs::write(&disk, &bytes).unwrap();
        let before = bytes;

        let one = drive(dir, "0b6ea7ec-0001", "#cloud-config\nhostname: one\n");
        let two = drive(dir, "0b6ea7ec-0002", "#cloud-config\nhostname: two\n");
        let base = serve([
            ("/one", (one.clone(), true)),
            ("/two", (two.clone(), false)),
        ])
        .await;
        let msg = action(&format!("{base}/one?token=secret"), &disk, dir)
            .await
            .unwrap();
        assert_eq!(
            msg,
            format!(
                "wrote the config drive (4.0 MiB) to new GPT partition 3 of {}: start 191.0 MiB (sector 391168), \
                 size 64.0 MiB (131072 sectors of 512 bytes); the backup GPT was moved to the disk's end",
                disk.display()
            )
        );

        let (dump, parts) = partitions(&disk);
        assert!(dump.contains("last-lba: 524254\n"), "{dump}");
        assert_eq!(parts.len(), 3, "{dump}");
        assert_eq!(parts[&1].0..parts[&1].1, 2048..65536);
        assert_eq!(parts[&2].0..parts[&2].1, 67584..131072);
        assert_eq!(
            parts[&3],
            (
                391168,
                131072,
                "0FC63DAF-8483-4772-8E79-3D69D8477DE4".into(),
                "config-2".into()
            )
        );
        let verify = sh(Command::new("sfdisk").arg("--verify").arg(&disk));
        assert!(verify.contains("No errors detected."), "{verify}");
        if have(&["sgdisk"], test) {
            let v = sh(Command::new("sgdisk").arg("-v").arg(&disk));
            assert!(v.contains("No problems found."), "{v}");
        }
        let after = std::fs::read(&disk).unwrap();
        // The backup header is at the disk's last sector, its entries
        // just before.
        let last = &after[after.len() - 512..];
        assert_eq!(&last[..8], b"EFI PART");
        assert_eq!(last[24..32], 524287u64.to_le_bytes());
        assert_eq!(last[72..80], 524255u64.to_le_bytes());
        // Nothing else moved: partitions 1 and 2 and the old backup in the
        // middle are as they were, byte for byte.
        let p3 = 391168 * 512;
        same_outside(
            &before,
            &after,
            &[
                0..34 * 512,
                p3..p3 + one.len() as u64,
                524255 * 512..256 * MIB,
            ],
        );
        let part = &after[p3 as usize..(p3 + 64 * MIB) as usize];
        assert!(part[..one.len()] == one[..]);
        let id = blkid(dir, part);
        assert_eq!(
            (id["TYPE"].as_str(), id["LABEL"].as_str()),
            ("vfat", "CONFIG-2")
        );
        if cloud_init_here(test) {
            assert_eq!(
                cloud_init_reads(dir, part),
                (
                    "0b6ea7ec-0001".to_string(),
                    "#cloud-config\nhostname: one\n".to_string()
                )
            );
        }

        // Again, with other data (served without Content-Length): the
        // same partition is written over, the table is not touched.
        let msg = action(&format!("{base}/two"), &disk, dir).await.unwrap();
        assert_eq!(
            msg,
            format!(
                "wrote the config drive (4.0 MiB) over GPT partition 3 of {}, which held a config-2 filesystem: \
                 start 191.0 MiB (sector 391168), size 64.0 MiB (131072 sectors of 512 bytes)",
                disk.display()
            )
        );
        assert_eq!(partitions(&disk).0, dump);
        let again = std::fs::read(&disk).unwrap();
        same_outside(
            &after,
            &again,
            std::slice::from_ref(&(p3..p3 + two.len() as u64)),
        );
        if cloud_init_here(test) {
            let part = &again[p3 as usize..(p3 + 64 * MIB) as usize];
            assert_eq!(cloud_init_reads(dir, part).0, "0b6ea7ec-0002".to_string());
        }
    }

    /// A GPT numbered as Ubuntu's cloud images are (1, 14, 15): the
    /// numbers stay, the config drive takes the first free entry.
    #[test]
    fn a_gpt_with_gaps_keeps_its_numbers() {
        if !have(&["sfdisk"], "a_gpt_with_gaps_keeps_its_numbers") {
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let disk = d.path().join("vda");
        std::fs::write(&disk, patterned(160 * MIB, 0x33)).unwrap();
        let n = disk.display();
        sfdisk(
            &disk,
            &format!(
                "label: gpt\n{n}14 : start=2048, size=8192, type=21686148-6449-6E6F-744E-656564454649\n\
                 {n}15 : start=10240, size=65536, type=C12A7328-F81F-11D2-BA4B-00A0C93EC93B\n\
                 {n}1 : start=75776, size=65536\n"
            ),
        );
        let (_, before) = partitions(&disk);
        let placed = put_file(&disk, 512, &fake_drive(4096)).unwrap();
        assert_eq!((placed.part.number, placed.backup_moved), (2, false));
        let (dump, after) = partitions(&disk);
        assert_eq!(after.len(), 4, "{dump}");
        for k in [1, 14, 15] {
            assert_eq!(after[&k], before[&k]);
        }
        assert_eq!((after[&2].0, after[&2].1), (194560, 131072));
        let verify = sh(Command::new("sfdisk").arg("--verify").arg(&disk));
        assert!(verify.contains("No errors detected."), "{verify}");
    }

    #[tokio::test]
    async fn an_mbr_disk_gets_a_primary_partition_at_its_end() {
        let test = "an_mbr_disk_gets_a_primary_partition_at_its_end";
        if !have(&["sfdisk", "mkfs.vfat", "mcopy", "blkid"], test) {
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let dir = d.path();
        let disk = dir.join("sdb");
        std::fs::write(&disk, patterned(256 * MIB, 0x44)).unwrap();
        sfdisk(
            &disk,
            "label: dos\nstart=2048, size=65536, type=83, bootable\nstart=67584, size=131072, type=83\n",
        );
        let before = std::fs::read(&disk).unwrap();
        let one = drive(dir, "0b6ea7ec-0003", "#cloud-config\nhostname: mbr\n");
        let base = serve([("/cd", (one.clone(), true))]).await;
        let msg = action(&format!("{base}/cd"), &disk, dir).await.unwrap();
        assert_eq!(
            msg,
            format!(
                "wrote the config drive (4.0 MiB) to new MBR partition 3 of {}: start 192.0 MiB (sector 393216), \
                 size 64.0 MiB (131072 sectors of 512 bytes)",
                disk.display()
            )
        );
        let (dump, parts) = partitions(&disk);
        assert_eq!(parts.len(), 3, "{dump}");
        assert_eq!(parts[&3], (393216, 131072, "83".into(), String::new()));
        let verify = sh(Command::new("sfdisk").arg("--verify").arg(&disk));
        assert!(verify.contains("No errors detected."), "{verify}");
        let after = std::fs::read(&disk).unwrap();
        let p3 = 393216 * 512;
        // The MBR's entry 3 (bytes 478..494) and the partition's head.
        same_outside(&before, &after, &[478..494, p3..p3 + one.len() as u64]);
        let part = &after[p3 as usize..];
        let id = blkid(dir, part);
        assert_eq!(
            (id["TYPE"].as_str(), id["LABEL"].as_str()),
            ("vfat", "CONFIG-2")
        );
        if cloud_init_here(test) {
            assert_eq!(cloud_init_reads(dir, part).0, "0b6ea7ec-0003");
        }
        let msg = action(&format!("{base}/cd"), &disk, dir).await.unwrap();
        assert!(msg.contains("over MBR partition 3 of"), "{msg}");
        assert_eq!(partitions(&disk).0, dump);
    }

    /// Four primaries, or no room at the end: refused, the disk as it was.
    #[test]
    fn full_disks_are_refused() {
        if !have(&["sfdisk"], "full_disks_are_refused") {
            return;
        }
        let d = tempfile::tempdir().unwrap();
        for (script, want) in [
            (
                "label: dos\nstart=2048, size=16384\nstart=18432, size=16384\nstart=34816, size=16384\nstart=51200, size=16384\n",
                "DEST_DISK's MBR already has 4 primary partitions: a config drive would need a logical partition",
            ),
            (
                "label: dos\nstart=2048, size=16384\nstart=18432, type=5\n",
                "no room for a 64.0 MiB config drive partition at the end of DEST_DISK: its partitions end at 128.0 MiB \
                 and the space for them at 128.0 MiB",
            ),
            (
                "label: gpt\nstart=2048, size=16384\nstart=18432\n",
                "no room for a 64.0 MiB config drive partition at the end of DEST_DISK: its partitions end at 127.0 MiB \
                 and the space for them at 128.0 MiB",
            ),
        ] {
            let disk = d.path().join("disk");
            std::fs::write(&disk, patterned(128 * MIB, 0x55)).unwrap();
            sfdisk(&disk, script);
            let before = std::fs::read(&disk).unwrap();
            let e = put_file(&disk, 512, &fake_drive(4096))
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{script}: {e}");
            assert!(std::fs::read(&disk).unwrap() == before, "{script}");
        }
    }

    /// The image is fetched and checked before DEST_DISK is opened: too
    /// big (said or not), not a config drive, not there; a token in the
    /// URL stays out of the messages.
    #[tokio::test]
    async fn the_image_and_the_environment() {
        let d = tempfile::tempdir().unwrap();
        let big = fake_drive(MAX_IMAGE as usize + 1);
        let base = serve([
            ("/big", (big.clone(), true)),
            ("/big-unsaid", (big, false)),
            ("/zeros", (vec![0u8; 4096], true)),
            ("/cidata", (fat_sector("CIDATA", false), true)),
            ("/empty", (Vec::new(), true)),
        ])
        .await;
        let never = d.path().join("never-opened");
        for (path, want) in [
            ("/big", "the config drive is bigger than 64.0 MiB"),
            ("/big-unsaid", "the config drive is bigger than 64.0 MiB"),
            (
                "/zeros",
                "(0.0 MiB) is not a VFAT or ISO9660 filesystem labelled config-2",
            ),
            (
                "/empty",
                "is not a VFAT or ISO9660 filesystem labelled config-2",
            ),
            (
                "/cidata",
                "is a vfat filesystem labelled \"CIDATA\", not config-2: cloud-init would not find it",
            ),
            ("/missing", "404 Not Found"),
        ] {
            let e = action(&format!("{base}{path}?token=secret"), &never, d.path())
                .await
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{path}: {e}");
            assert!(!e.contains("secret"), "{path}: {e}");
        }
        assert!(!never.exists());

        let (p, _rx) = Progress::channel();
        let runner = Runner {
            root: d.path().to_path_buf(),
            ..Runner::default()
        };
        let env = |kv: &[(&str, &str)]| -> BTreeMap<String, String> {
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        for (e, want) in [
            (
                env(&[("DEST_DISK", "/dev/sda")]),
                "CONFIG_DRIVE_URL is required",
            ),
            (
                env(&[
                    ("CONFIG_DRIVE_URL", "ftp://x/cd"),
                    ("DEST_DISK", "/dev/sda"),
                ]),
                "CONFIG_DRIVE_URL=ftp://x/cd must be an http or https URL",
            ),
            (
                env(&[("CONFIG_DRIVE_URL", "not a url"), ("DEST_DISK", "/dev/sda")]),
                "CONFIG_DRIVE_URL is not a URL",
            ),
            (
                env(&[("CONFIG_DRIVE_URL", "http://127.0.0.1:9/cd")]),
                "DEST_DISK is required",
            ),
        ] {
            let got = run(&runner, &Env(&e), &p).await.unwrap_err().to_string();
            assert!(got.contains(want), "{got}");
        }
        // DEST_DISK must exist.
        let served = serve([("/cd", (fake_drive(4096), true))]).await;
        let e = action(&format!("{served}/cd"), &never, d.path())
            .await
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("opening DEST_DISK"), "{e}");
    }
}
