//! qcow2 → raw in one pass over the network. The image's header, L1 and
//! L2 tables are read first with HTTP range requests and made into a map
//! (host offset → guest offset); then the file is fetched once, whole and
//! in order, and each data cluster is written where the guest sees it.
//! Guest ranges with no data are zeroed. Of the image only its tables (at
//! most [`MAX_TABLES`]) and the map are held.
//!
//! Hand-written because no crate reads this way: qcow, qcow2, qcow2-core,
//! qcow2-rs and imago all read by guest offset, seeking in the image (over
//! HTTP, a request per cluster), and qcow2 0.1 and qcow2-core read no
//! compressed clusters. The format is qemu's docs/interop/qcow2.txt.
//!
//! Parsing ([`parse_header`], [`parse_l1`], [`map`]) is pure; reading is
//! behind [`Ranges`] (HTTP, or a file) and a sequential `Read`.

use super::checksum::Checksum;
use super::disk;
use super::fetch::{self, Counter, Hashing, mib};
use super::{ActionError, Progress};
use futures_util::{StreamExt, TryStreamExt};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::fs::File;
use std::future::Future;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const MAGIC: &[u8] = b"QFI\xfb";
/// The header and the L1 and L2 tables read ahead are at most this big.
pub const MAX_TABLES: u64 = 32 << 20;
/// The first range read: the fixed header is 72 (v2) or 104 to 112 (v3)
/// bytes; its extensions are not needed.
pub const HEAD: usize = 512;
/// A range request, a data run written at once, and a stretch of zeros
/// written at once are at most this big.
const CHUNK: u64 = 4 << 20;
/// Range requests in flight.
const PARALLEL: usize = 4;
/// One range request, connect to last byte.
pub const RANGE_TIMEOUT: Duration = Duration::from_secs(120);
pub const NEEDS_RANGES: &str = "qcow2 needs a server that answers HTTP range requests";

const OFFSET_MASK: u64 = 0x00ff_ffff_ffff_fe00;
const COPIED: u64 = 1 << 63;
const COMPRESSED: u64 = 1 << 62;
const ZERO: u64 = 1;

const INCOMPAT_CORRUPT: u64 = 1 << 1;
const INCOMPAT_DATA_FILE: u64 = 1 << 2;
const INCOMPAT_EXTENDED_L2: u64 = 1 << 4;
/// Dirty (bit 0: the refcounts need repair, the mapping is sound) and
/// compression type (bit 3) are read; the others are refused.
const INCOMPAT_KNOWN: u64 = 0x1f;

fn bad(msg: impl std::fmt::Display) -> ActionError {
    ActionError::Failed(format!("qcow2: {msg}"))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub version: u32,
    pub cluster_bits: u32,
    pub virtual_size: u64,
    pub l1_offset: u64,
    /// L1 entries the virtual size needs (the table may have more).
    pub l1_entries: u64,
    pub file_size: u64,
}

impl Header {
    pub fn cluster_size(&self) -> u64 {
        1 << self.cluster_bits
    }
    /// Guest bytes one L2 table maps.
    fn l2_span(&self) -> u64 {
        self.cluster_size() / 8 * self.cluster_size()
    }
    /// `len` bytes at `off` are a cluster-aligned piece of the file.
    fn check_cluster(
        &self,
        off: u64,
        len: u64,
        what: &dyn Fn() -> String,
    ) -> Result<(), ActionError> {
        if off == 0 || !off.is_multiple_of(self.cluster_size()) {
            return Err(bad(format!(
                "{} at {off:#x} is not cluster-aligned",
                what()
            )));
        }
        match off.checked_add(len) {
            Some(end) if end <= self.file_size => Ok(()),
            _ => Err(bad(format!(
                "{} at {off:#x} is past the end of the file ({} bytes)",
                what(),
                self.file_size
            ))),
        }
    }
}

fn be32(b: &[u8], at: usize) -> Result<u32, ActionError> {
    b.get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .map(u32::from_be_bytes)
        .ok_or_else(|| bad("the header is cut short"))
}

fn be64(b: &[u8], at: usize) -> Result<u64, ActionError> {
    b.get(at..at + 8)
        .and_then(|s| s.try_into().ok())
        .map(u64::from_be_bytes)
        .ok_or_else(|| bad("the header is cut short"))
}

/// The header at the start of the image (`b`, its first bytes), checked
/// against the file's size; what this writer cannot convert is refused.
pub fn parse_header(b: &[u8], file_size: u64) -> Result<Header, ActionError> {
    if !b.starts_with(MAGIC) {
        return Err(bad("not a qcow2 image (no QFI\\xfb magic)"));
    }
    let version = be32(b, 4)?;
    match version {
        2 | 3 => {}
        1 => return Err(bad("qcow version 1 is not supported: convert it to qcow2")),
        v => return Err(bad(format!("version {v} is not supported (2 and 3 are)"))),
    }
    if be64(b, 8)? != 0 {
        return Err(bad(
            "the image has a backing file: flatten it (qemu-img convert) to write it alone",
        ));
    }
    let cluster_bits = be32(b, 20)?;
    if !(9..=21).contains(&cluster_bits) {
        return Err(bad(format!("cluster_bits {cluster_bits} is not in 9..=21")));
    }
    let virtual_size = be64(b, 24)?;
    match be32(b, 32)? {
        0 => {}
        m => {
            let name = match m {
                1 => "AES",
                2 => "LUKS",
                _ => "unknown",
            };
            return Err(bad(format!(
                "the image is encrypted ({name}): not supported"
            )));
        }
    }
    let l1_size = u64::from(be32(b, 36)?);
    let l1_offset = be64(b, 40)?;
    if version == 3 {
        let incompat = be64(b, 72)?;
        let header_len = be32(b, 100)?;
        if header_len < 104 {
            return Err(bad(format!("header_length {header_len} is under 104")));
        }
        if incompat & !INCOMPAT_KNOWN != 0 {
            return Err(bad(format!(
                "unknown incompatible features {:#x}",
                incompat & !INCOMPAT_KNOWN
            )));
        }
        if incompat & INCOMPAT_CORRUPT != 0 {
            return Err(bad("qemu marked the image corrupt"));
        }
        if incompat & INCOMPAT_DATA_FILE != 0 {
            return Err(bad(
                "the image keeps its data in an external data file: not supported",
            ));
        }
        if incompat & INCOMPAT_EXTENDED_L2 != 0 {
            return Err(bad(
                "the image has extended L2 entries (subclusters): not supported",
            ));
        }
        let ctype = if header_len > 104 {
            *b.get(104).ok_or_else(|| bad("the header is cut short"))?
        } else {
            0
        };
        if ctype != 0 {
            let name = if ctype == 1 { "zstd" } else { "unknown" };
            return Err(bad(format!(
                "compression type {ctype} ({name}) is not supported, only zlib (deflate)"
            )));
        }
    }
    let cs = 1u64 << cluster_bits;
    let l1_entries = virtual_size.div_ceil(cs / 8 * cs);
    if l1_entries > l1_size {
        return Err(bad(format!(
            "the L1 table ({l1_size} entries) is too small for the virtual size ({virtual_size} bytes)"
        )));
    }
    if l1_entries * 8 > MAX_TABLES {
        return Err(bad(format!(
            "the L1 table is {}, over the {} of tables this writer reads ahead",
            mib(l1_entries * 8),
            mib(MAX_TABLES)
        )));
    }
    let h = Header {
        version,
        cluster_bits,
        virtual_size,
        l1_offset,
        l1_entries,
        file_size,
    };
    if l1_entries > 0 {
        h.check_cluster(l1_offset, l1_entries * 8, &|| "the L1 table".into())?;
    }
    Ok(h)
}

/// The L2 table's offset for each L1 entry the virtual size needs (0:
/// none, the guest range reads as zeros).
pub fn parse_l1(h: &Header, b: &[u8]) -> Result<Vec<u64>, ActionError> {
    if b.len() as u64 != h.l1_entries * 8 {
        return Err(bad("the L1 table was read short"));
    }
    b.chunks_exact(8)
        .enumerate()
        .map(|(i, c)| {
            let e = c
                .try_into()
                .map(u64::from_be_bytes)
                .map_err(|_| bad("the L1 table was read short"))?;
            if e & !(OFFSET_MASK | COPIED) != 0 {
                return Err(bad(format!("L1 entry {i} has reserved bits set ({e:#x})")));
            }
            let off = e & OFFSET_MASK;
            if off != 0 {
                h.check_cluster(off, h.cluster_size(), &|| {
                    format!("the L2 table of L1 entry {i}")
                })?;
            }
            Ok(off)
        })
        .collect()
}

/// What a piece of the image's file is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// Data, written at this guest offset.
    Data(u64),
    /// A deflated cluster, inflated and written at this guest offset.
    Deflated(u64),
    /// Read ahead by range; the stream must hold the same bytes (the index
    /// of their digest in [`Plan::checks`]).
    Check(usize),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub host: u64,
    pub len: u64,
    pub to: Use,
}

#[derive(Debug, Default, PartialEq, Eq)]
pub struct Map {
    /// In guest order from [`map`]; [`plan`] sorts them by host offset.
    pub extents: Vec<Extent>,
    /// Guest ranges (offset, length) with no data, in order, coalesced.
    pub zeros: Vec<(u64, u64)>,
    /// Guest bytes that have data.
    pub data: u64,
}

impl Map {
    fn zero(&mut self, at: u64, len: u64) {
        match self.zeros.last_mut() {
            Some(z) if z.0 + z.1 == at => z.1 += len,
            _ => self.zeros.push((at, len)),
        }
    }

    /// The L2 entry `e` for the `len` guest bytes at `g`.
    fn entry(&mut self, h: &Header, e: u64, g: u64, len: u64) -> Result<(), ActionError> {
        if e & COMPRESSED != 0 {
            // Bits 0..x: the byte offset; x..62: extra 512-byte sectors.
            let x = 62 - (h.cluster_bits - 8);
            let off = e & ((1 << x) - 1);
            let sectors = ((e >> x) & ((1 << (h.cluster_bits - 8)) - 1)) + 1;
            if off >> 56 != 0 || off >= h.file_size {
                return Err(bad(format!(
                    "the compressed cluster of guest {g:#x} at {off:#x} is past the end of the file"
                )));
            }
            // The last sector may be cut by the end of the file.
            let end = ((off & !511) + sectors * 512).min(h.file_size);
            self.extents.push(Extent {
                host: off,
                len: end - off,
                to: Use::Deflated(g),
            });
            self.data += len;
            return Ok(());
        }
        if e & !(OFFSET_MASK | COPIED | ZERO) != 0 {
            return Err(bad(format!(
                "the L2 entry of guest {g:#x} has reserved bits set ({e:#x})"
            )));
        }
        let off = e & OFFSET_MASK;
        // The zero flag (v3; qemu reads it in v2 too) wins over an offset;
        // no offset is unallocated, zeros without a backing file.
        if e & ZERO != 0 || off == 0 {
            self.zero(g, len);
            return Ok(());
        }
        h.check_cluster(off, len, &|| format!("the data cluster of guest {g:#x}"))?;
        self.data += len;
        if let Some(last) = self.extents.last_mut()
            && let Use::Data(lg) = last.to
            && last.host + last.len == off
            && lg + last.len == g
            && last.len + len <= CHUNK
        {
            last.len += len;
            return Ok(());
        }
        self.extents.push(Extent {
            host: off,
            len,
            to: Use::Data(g),
        });
        Ok(())
    }
}

/// The map of the image from its L1 table and its L2 `tables` (by offset).
pub fn map(h: &Header, l1: &[u64], tables: &HashMap<u64, &[u8]>) -> Result<Map, ActionError> {
    let cs = h.cluster_size();
    let span = h.l2_span();
    let mut m = Map::default();
    for (i, &l2) in l1.iter().enumerate() {
        let base = (i as u64)
            .checked_mul(span)
            .filter(|b| *b < h.virtual_size)
            .ok_or_else(|| bad("more L1 entries than the virtual size needs"))?;
        let end = base.saturating_add(span).min(h.virtual_size);
        if l2 == 0 {
            m.zero(base, end - base);
            continue;
        }
        let t = tables
            .get(&l2)
            .filter(|t| t.len() as u64 == cs)
            .ok_or_else(|| bad(format!("the L2 table at {l2:#x} was not read")))?;
        for (j, c) in t.chunks_exact(8).enumerate() {
            let Some(g) = base.checked_add(j as u64 * cs).filter(|g| *g < end) else {
                break;
            };
            let e = c
                .try_into()
                .map(u64::from_be_bytes)
                .map_err(|_| bad("an L2 table was read short"))?;
            m.entry(h, e, g, cs.min(end - g))?;
        }
    }
    Ok(m)
}

/// Range requests for the L2 tables at `offsets` (sorted, distinct):
/// tables at most a cluster apart share a request of at most [`CHUNK`]
/// bytes, so what is read beyond the tables is at most as much again.
pub fn requests(offsets: &[u64], cs: u64) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &o in offsets {
        if let Some((start, len)) = out.last_mut() {
            let end = *start + *len;
            if o >= end && o - end <= cs && o + cs - *start <= CHUNK {
                *len = o + cs - *start;
                continue;
            }
        }
        out.push((o, cs));
    }
    out
}

/// `len` bytes at `at` in pieces of at most [`CHUNK`].
fn split(at: u64, len: u64) -> Vec<(u64, u64)> {
    (0..len.div_ceil(CHUNK))
        .map(|k| (at + k * CHUNK, CHUNK.min(len - k * CHUNK)))
        .collect()
}

/// Reads of byte ranges of the image: HTTP range requests, or a file.
pub trait Ranges: Sync {
    /// The whole file's size.
    fn size(&self) -> u64;
    /// Exactly `len` bytes at `at`.
    fn read_at(
        &self,
        at: u64,
        len: usize,
    ) -> impl Future<Output = Result<Vec<u8>, ActionError>> + Send;
}

async fn read_all<R: Ranges>(
    src: &R,
    ranges: &[(u64, u64)],
) -> Result<Vec<(u64, Vec<u8>)>, ActionError> {
    futures_util::stream::iter(ranges.iter().copied().map(|(at, len)| async move {
        let b = src.read_at(at, len as usize).await?;
        if b.len() as u64 != len {
            return Err(bad(format!(
                "a read of {len} bytes at {at:#x} gave {}",
                b.len()
            )));
        }
        Ok((at, b))
    }))
    .buffered(PARALLEL)
    .try_collect()
    .await
}

/// What the stream is for: the header, the map, and the digests of what
/// was read ahead.
#[derive(Debug)]
pub struct Plan {
    pub header: Header,
    pub map: Map,
    pub checks: Vec<[u8; 32]>,
}

impl Plan {
    fn check(&mut self, at: u64, bytes: &[u8]) {
        for (k, piece) in bytes.chunks(CHUNK as usize).enumerate() {
            self.checks.push(Sha256::digest(piece).into());
            self.map.extents.push(Extent {
                host: at + k as u64 * CHUNK,
                len: piece.len() as u64,
                to: Use::Check(self.checks.len() - 1),
            });
        }
    }
}

/// Reads the tables of the image in `src` (whose first bytes are `head`)
/// and makes the plan of the stream, for a destination of `dest_size`
/// bytes.
pub async fn plan<R: Ranges>(src: &R, head: &[u8], dest_size: u64) -> Result<Plan, ActionError> {
    let h = parse_header(head, src.size())?;
    if h.virtual_size > dest_size {
        return Err(ActionError::Failed(format!(
            "the image's virtual size, {} bytes, is larger than DEST_DISK ({dest_size} bytes)",
            h.virtual_size
        )));
    }
    let cs = h.cluster_size();
    let mut plan = Plan {
        header: h,
        map: Map::default(),
        checks: Vec::new(),
    };
    plan.check(0, head);
    let l1_pieces = read_all(src, &split(h.l1_offset, h.l1_entries * 8)).await?;
    for (at, b) in &l1_pieces {
        plan.check(*at, b);
    }
    let l1_bytes: Vec<u8> = l1_pieces.into_iter().flat_map(|(_, b)| b).collect();
    let l1 = parse_l1(&h, &l1_bytes)?;
    drop(l1_bytes);
    let mut offsets: Vec<u64> = l1.iter().copied().filter(|o| *o != 0).collect();
    offsets.sort_unstable();
    offsets.dedup();
    let tables_size = h.l1_entries * 8 + offsets.len() as u64 * cs;
    if tables_size > MAX_TABLES {
        return Err(bad(format!(
            "its L1 and {} L2 tables are {}, over the {} this writer reads ahead",
            offsets.len(),
            mib(tables_size),
            mib(MAX_TABLES)
        )));
    }
    let got = read_all(src, &requests(&offsets, cs)).await?;
    let mut tables = HashMap::new();
    let mut next = offsets.iter().peekable();
    for (at, b) in &got {
        while let Some(&&o) = next.peek() {
            let Some(t) = (o.checked_sub(*at)).and_then(|d| b.get(d as usize..(d + cs) as usize))
            else {
                break;
            };
            tables.insert(o, t);
            next.next();
        }
    }
    let m = map(&h, &l1, &tables)?;
    plan.map.extents.extend(m.extents);
    plan.map.zeros = m.zeros;
    plan.map.data = m.data;
    for (at, b) in &got {
        plan.check(*at, b);
    }
    plan.map.extents.sort_by_key(|e| e.host);
    Ok(plan)
}

/// The stream, read forward only, keeping the bytes of the extent at
/// hand (extents may overlap: compressed clusters share sectors).
struct Window<R> {
    src: R,
    /// The stream offset of `buf[0]`.
    pos: u64,
    buf: Vec<u8>,
}

impl<R: Read> Window<R> {
    fn failed(&self, e: std::io::Error) -> ActionError {
        ActionError::Failed(format!(
            "reading the qcow2 image at byte {}: {e}",
            self.pos + self.buf.len() as u64
        ))
    }

    fn get(&mut self, at: u64, len: usize) -> Result<&[u8], ActionError> {
        let end = self.pos + self.buf.len() as u64;
        if at < self.pos {
            return Err(bad("the extents are out of order"));
        }
        if at >= end {
            let skip = at - end;
            let n = std::io::copy(&mut (&mut self.src).take(skip), &mut std::io::sink())
                .map_err(|e| self.failed(e))?;
            self.buf.clear();
            self.pos = end + n;
            if n < skip {
                return Err(self.short(at, len));
            }
        } else {
            self.buf.drain(..(at - self.pos) as usize);
            self.pos = at;
        }
        while self.buf.len() < len {
            let old = self.buf.len();
            self.buf.resize(len, 0);
            match self.src.read(&mut self.buf[old..]) {
                Ok(0) => {
                    self.buf.truncate(old);
                    return Err(self.short(at, len));
                }
                Ok(n) => self.buf.truncate(old + n),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => self.buf.truncate(old),
                Err(e) => {
                    self.buf.truncate(old);
                    return Err(self.failed(e));
                }
            }
        }
        Ok(&self.buf[..len])
    }

    fn short(&self, at: u64, len: usize) -> ActionError {
        bad(format!(
            "the download ended at byte {}, before the {len} bytes at {at:#x} that the tables point to",
            self.pos + self.buf.len() as u64
        ))
    }

    /// Reads the rest; the stream's length.
    fn finish(mut self) -> Result<u64, ActionError> {
        let end = self.pos + self.buf.len() as u64;
        let n = std::io::copy(&mut self.src, &mut std::io::sink()).map_err(|e| self.failed(e))?;
        Ok(end + n)
    }
}

/// Streams the image `src` (the whole file, in order) and writes the
/// guest's data to `out` by `plan`; the stream's length.
pub fn write_stream(
    src: impl Read,
    plan: &Plan,
    out: &File,
    written: &Counter,
) -> Result<u64, ActionError> {
    let cs = plan.header.cluster_size();
    let vs = plan.header.virtual_size;
    let mut win = Window {
        src,
        pos: 0,
        buf: Vec::new(),
    };
    let mut inflate = flate2::Decompress::new(false);
    let mut cluster = vec![0u8; cs as usize];
    let write = |b: &[u8], g: u64| {
        out.write_all_at(b, g)
            .map_err(|e| ActionError::Failed(format!("writing at {g:#x} of DEST_DISK: {e}")))
    };
    for e in &plan.map.extents {
        let bytes = win.get(e.host, e.len as usize)?;
        match e.to {
            Use::Data(g) => {
                write(bytes, g)?;
                written.add(e.len);
            }
            Use::Deflated(g) => {
                inflate.reset(false);
                let r = inflate.decompress(bytes, &mut cluster, flate2::FlushDecompress::Finish);
                if r.is_err() || inflate.total_out() != cs {
                    return Err(bad(format!(
                        "the compressed cluster at {:#x} (guest {g:#x}) does not inflate to a cluster",
                        e.host
                    )));
                }
                let n = cs.min(vs.saturating_sub(g));
                write(&cluster[..n as usize], g)?;
                written.add(n);
            }
            Use::Check(i) => {
                if plan.checks.get(i).map(|d| &d[..]) != Some(&Sha256::digest(bytes)[..]) {
                    return Err(bad(format!(
                        "the {} bytes at {:#x} differ between the range reads and the download: did the image change?",
                        e.len, e.host
                    )));
                }
            }
        }
    }
    let total = win.finish()?;
    if total != plan.header.file_size {
        return Err(bad(format!(
            "the download is {total} bytes, the range reads said {}",
            plan.header.file_size
        )));
    }
    Ok(total)
}

/// Zeroes the guest ranges `zeros` of `out`: FALLOC_FL_ZERO_RANGE where
/// the disk or filesystem has it (no data written), else writes of zeros.
/// Nothing tells that a disk already reads as zeros, so each range is.
pub fn zero_ranges(out: &File, zeros: &[(u64, u64)], done: &Counter) -> Result<(), ActionError> {
    use rustix::fs::{FallocateFlags, fallocate};
    use rustix::io::Errno;
    let mut fast = true;
    let mut buf = Vec::new();
    for &(at, len) in zeros {
        if fast {
            match fallocate(
                out,
                FallocateFlags::ZERO_RANGE | FallocateFlags::KEEP_SIZE,
                at,
                len,
            ) {
                Ok(()) => {
                    done.add(len);
                    continue;
                }
                // Not there at all: stop asking.
                Err(Errno::OPNOTSUPP | Errno::NODEV | Errno::NOSYS) => fast = false,
                // EINVAL: a range finer than the disk's blocks.
                Err(e) => tracing::debug!(at, len, error = %e, "FALLOC_FL_ZERO_RANGE"),
            }
        }
        if buf.is_empty() {
            buf = vec![0u8; CHUNK as usize];
        }
        let end = at + len;
        let mut off = at;
        while off < end {
            let n = (end - off).min(CHUNK);
            out.write_all_at(&buf[..n as usize], off).map_err(|e| {
                ActionError::Failed(format!("zeroing at {off:#x} of DEST_DISK: {e}"))
            })?;
            done.add(n);
            off += n;
        }
    }
    Ok(())
}

/// An image file read by ranges (tests, or an image on a local disk).
pub struct FileRanges {
    file: File,
    size: u64,
}

impl FileRanges {
    pub fn open(path: &Path) -> std::io::Result<FileRanges> {
        let file = File::open(path)?;
        let size = file.metadata()?.len();
        Ok(FileRanges { file, size })
    }
}

impl Ranges for FileRanges {
    fn size(&self) -> u64 {
        self.size
    }
    fn read_at(
        &self,
        at: u64,
        len: usize,
    ) -> impl Future<Output = Result<Vec<u8>, ActionError>> + Send {
        let mut b = vec![0u8; len];
        let r = self
            .file
            .read_exact_at(&mut b, at)
            .map(|()| b)
            .map_err(|e| bad(format!("reading {len} bytes at {at:#x}: {e}")));
        std::future::ready(r)
    }
}

/// The image at a URL, read by HTTP range requests.
pub struct HttpRanges {
    client: reqwest::Client,
    url: reqwest::Url,
    size: u64,
}

impl HttpRanges {
    /// Reads the first [`HEAD`] bytes, which also tells the file's size.
    pub async fn open(url: &str) -> Result<(HttpRanges, Vec<u8>), ActionError> {
        let parsed = reqwest::Url::parse(url)
            .map_err(|e| ActionError::Env(format!("{url:?} is not a URL: {e}")))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(ActionError::Env(format!(
                "{url:?}: only http and https URLs can be fetched"
            )));
        }
        let client = fetch::client()?;
        let (size, head) = range(&client, &parsed, 0, HEAD as u64).await?;
        Ok((
            HttpRanges {
                client,
                url: parsed,
                size,
            },
            head,
        ))
    }
}

impl Ranges for HttpRanges {
    fn size(&self) -> u64 {
        self.size
    }
    async fn read_at(&self, at: u64, len: usize) -> Result<Vec<u8>, ActionError> {
        if len == 0 {
            return Ok(Vec::new());
        }
        let (size, b) = range(&self.client, &self.url, at, len as u64).await?;
        if size != self.size {
            return Err(bad(format!(
                "the image was {} bytes and is now {size}",
                self.size
            )));
        }
        if b.len() != len {
            return Err(bad(format!(
                "asked {len} bytes at {at:#x}, got {}",
                b.len()
            )));
        }
        Ok(b)
    }
}

/// `bytes a-b/size` of a Content-Range header.
pub fn content_range(v: &str) -> Option<(u64, u64, u64)> {
    let (span, size) = v.trim().strip_prefix("bytes ")?.split_once('/')?;
    let (a, b) = span.split_once('-')?;
    let (a, b, size) = (a.parse().ok()?, b.parse().ok()?, size.parse().ok()?);
    (a <= b && b < size).then_some((a, b, size))
}

/// GET `len` bytes at `at` (fewer at the end of the file): the file's
/// size and the bytes.
async fn range(
    client: &reqwest::Client,
    url: &reqwest::Url,
    at: u64,
    len: u64,
) -> Result<(u64, Vec<u8>), ActionError> {
    let last = at + len - 1;
    let failed = |e: &dyn std::error::Error| {
        ActionError::Failed(format!(
            "GET {url} (bytes {at}-{last}): {}",
            fetch::chain(e)
        ))
    };
    let mut resp = client
        .get(url.clone())
        .header(reqwest::header::RANGE, format!("bytes={at}-{last}"))
        .timeout(RANGE_TIMEOUT)
        .send()
        .await
        .map_err(|e| failed(&e))?;
    match resp.status() {
        reqwest::StatusCode::PARTIAL_CONTENT => {}
        reqwest::StatusCode::OK => {
            return Err(ActionError::Failed(format!(
                "{NEEDS_RANGES}: {url} answered a range request with the whole file (200)"
            )));
        }
        s => {
            return Err(ActionError::Failed(format!(
                "GET {url} (bytes {at}-{last}): {s}"
            )));
        }
    }
    let cr = resp
        .headers()
        .get(reqwest::header::CONTENT_RANGE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let (a, b, size) = content_range(&cr).ok_or_else(|| {
        ActionError::Failed(format!(
            "{NEEDS_RANGES}: {url} answered 206 with Content-Range {cr:?}"
        ))
    })?;
    if a != at || b > last {
        return Err(ActionError::Failed(format!(
            "GET {url}: asked for bytes {at}-{last}, got {cr:?}"
        )));
    }
    let want = (b - a + 1) as usize;
    let mut body = Vec::with_capacity(want);
    // Ends: each chunk grows the body toward `want`, and the request has
    // a timeout.
    while let Some(c) = resp.chunk().await.map_err(|e| failed(&e))? {
        if body.len() + c.len() > want {
            return Err(ActionError::Failed(format!(
                "GET {url}: more than the {want} bytes of {cr:?}"
            )));
        }
        body.extend_from_slice(&c);
    }
    if body.len() != want {
        return Err(ActionError::Failed(format!(
            "GET {url}: {} of the {want} bytes of {cr:?}",
            body.len()
        )));
    }
    Ok((size, body))
}

/// qcow2 at `url` onto `dest`: the tables by range reads, the holes
/// zeroed, then one GET of the whole file, checked against `sum`.
pub async fn to_disk(
    url: &str,
    dest: &str,
    sum: Option<Checksum>,
    progress: &Progress,
) -> Result<String, ActionError> {
    let t0 = Instant::now();
    progress.set(format!("{url}: reading the qcow2 tables"));
    let (src, head) = HttpRanges::open(url).await?;
    let out = Arc::new(disk::open_dest(Path::new(dest))?);
    let dest_size =
        disk::device_size(&out).map_err(ActionError::io(format!("sizing DEST_DISK {dest}")))?;
    let plan = Arc::new(plan(&src, &head, dest_size).await?);

    let zeroed = Arc::new(Counter::default());
    let to_zero: u64 = plan.map.zeros.iter().map(|z| z.1).sum();
    let job = {
        let (out, plan, zeroed) = (out.clone(), plan.clone(), zeroed.clone());
        tokio::task::spawn_blocking(move || zero_ranges(&out, &plan.map.zeros, &zeroed))
    };
    disk::drive(std::future::ready(()), job, |_| {
        progress.set(format!(
            "{url} -> {dest}: zeroed {} of the image's {} of holes",
            mib(zeroed.get()),
            mib(to_zero)
        ));
    })
    .await?;

    let resp = fetch::get(url).await?;
    if let Some(n) = resp.content_length()
        && n != src.size()
    {
        return Err(bad(format!(
            "GET {url} is {n} bytes, the range reads said {}",
            src.size()
        )));
    }
    let read = Arc::new(Counter::default());
    let written = Arc::new(Counter::default());
    let (pump, body) = fetch::stream(resp, read.clone());
    let job = {
        let (out, plan, w, dest) = (out.clone(), plan.clone(), written.clone(), dest.to_string());
        tokio::task::spawn_blocking(move || {
            let mut hashing = Hashing::new(body, sum.as_ref().map(|s| s.alg));
            let n = write_stream(&mut hashing, &plan, &out, &w)?;
            disk::verify(
                sum.as_ref(),
                hashing.finish(),
                &out,
                Path::new(&dest),
                w.get(),
            )?;
            disk::finish(&out, Path::new(&dest))?;
            Ok(n)
        })
    };
    let t1 = Instant::now();
    let size = src.size();
    disk::drive(pump, job, |_| {
        progress.set(format!(
            "{url} -> {dest}: read {} of {}, wrote {} ({:.1} MB/s)",
            mib(read.get()),
            mib(size),
            mib(written.get()),
            written.get() as f64 / 1e6 / t1.elapsed().as_secs_f64().max(1e-9)
        ));
    })
    .await?;
    let secs = t0.elapsed().as_secs_f64();
    Ok(format!(
        "wrote {} of data and zeroed {} to {dest} (virtual size {}) from {} of qcow2 v{} in {secs:.1}s ({:.1} MB/s)",
        mib(written.get()),
        mib(to_zero),
        mib(plan.header.virtual_size),
        mib(read.get()),
        plan.header.version,
        written.get() as f64 / 1e6 / secs.max(1e-9)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actions::Env;
    use std::collections::BTreeMap;
    use std::io::{Cursor, Write};
    use std::process::Command;

    const CS: u64 = 4096;

    /// An image in memory, read by ranges.
    struct Mem(Vec<u8>);

    impl Ranges for Mem {
        fn size(&self) -> u64 {
            self.0.len() as u64
        }
        fn read_at(
            &self,
            at: u64,
            len: usize,
        ) -> impl Future<Output = Result<Vec<u8>, ActionError>> + Send {
            let r = (at as usize)
                .checked_add(len)
                .and_then(|end| self.0.get(at as usize..end))
                .map(<[u8]>::to_vec)
                .ok_or_else(|| bad("read past the end"));
            std::future::ready(r)
        }
    }

    fn block_on<F: Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    /// Plans from `src`, zeroes, streams `stream` onto `dest`.
    fn convert<R: Ranges>(src: &R, stream: impl Read, dest: &Path) -> Result<Plan, ActionError> {
        let head = block_on(src.read_at(0, HEAD.min(src.size() as usize)))?;
        let out = disk::open_dest(dest)?;
        let size = disk::device_size(&out).unwrap();
        let plan = block_on(plan(src, &head, size))?;
        zero_ranges(&out, &plan.map.zeros, &Counter::default())?;
        write_stream(stream, &plan, &out, &Counter::default())?;
        Ok(plan)
    }

    /// A file of `len` bytes of 0xAA: a disk with old data on it.
    fn garbage_disk(len: u64) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&vec![0xAA; len as usize]).unwrap();
        f
    }

    fn deflate(b: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(b).unwrap();
        e.finish().unwrap()
    }

    fn put64(v: &mut [u8], at: usize, x: u64) {
        v[at..at + 8].copy_from_slice(&x.to_be_bytes());
    }
    fn put32(v: &mut [u8], at: usize, x: u32) {
        v[at..at + 4].copy_from_slice(&x.to_be_bytes());
    }

    struct Built {
        image: Vec<u8>,
        raw: Vec<u8>,
    }

    /// A qcow2 made by hand, 4 KiB clusters, one L2 table. Guest
    /// clusters: 0 data; 1 and 6 deflated, sharing a sector; 2 zero flag;
    /// 3 zero flag over a host cluster of 0xEE; 4 unallocated; 7..=9 data,
    /// host-contiguous; 20 data; 40 data, cut by the virtual size; the
    /// rest unallocated.
    fn build(version: u32) -> Built {
        let vsize = 40 * CS + 1000;
        let mut rng = fastrand::Rng::with_seed(version.into());
        let mut image = vec![0u8; 12 * CS as usize];
        let mut raw = vec![0u8; vsize as usize];
        image[..4].copy_from_slice(MAGIC);
        put32(&mut image, 4, version);
        put32(&mut image, 20, 12);
        put64(&mut image, 24, vsize);
        put32(&mut image, 36, 1);
        put64(&mut image, 40, CS);
        if version == 3 {
            put32(&mut image, 96, 4);
            put32(&mut image, 100, 112);
        }
        put64(&mut image, CS as usize, (2 * CS) | COPIED);
        let l2 = 2 * CS as usize;
        let mut data = |image: &mut Vec<u8>, raw: &mut Vec<u8>, g: u64, host: u64| {
            let n = CS.min(vsize - g * CS) as usize;
            let h = host as usize;
            rng.fill(&mut image[h..h + CS as usize]);
            raw[(g * CS) as usize..][..n].copy_from_slice(&image[h..h + n]);
            put64(image, l2 + 8 * g as usize, host | COPIED);
        };
        data(&mut image, &mut raw, 0, 3 * CS);
        for (g, host) in [(7, 7), (8, 8), (9, 9), (20, 10), (40, 11)] {
            data(&mut image, &mut raw, g, host * CS);
        }
        // Two deflated clusters in host cluster 4, the second starting in
        // the sector where the first ends.
        let mut at = 4 * CS + 100;
        for (g, fill) in [(1u64, 0x31u8), (6, 0x36)] {
            let plain: Vec<u8> = (0..CS).map(|i| fill ^ (i % 7) as u8).collect();
            let z = deflate(&plain);
            image[at as usize..][..z.len()].copy_from_slice(&z);
            let end = at + z.len() as u64;
            let extra = (end - 1) / 512 - at / 512;
            let x = 62 - (12 - 8);
            put64(
                &mut image,
                l2 + 8 * g as usize,
                COMPRESSED | (extra << x) | at,
            );
            raw[(g * CS) as usize..][..CS as usize].copy_from_slice(&plain);
            at = end;
        }
        assert!(at < 5 * CS);
        image[5 * CS as usize..6 * CS as usize].fill(0xEE);
        put64(&mut image, l2 + 16, ZERO);
        put64(&mut image, l2 + 24, (5 * CS) | ZERO | COPIED);
        Built { image, raw }
    }

    fn check_written(d: &tempfile::NamedTempFile, raw: &[u8]) {
        let got = std::fs::read(d.path()).unwrap();
        assert!(got[..raw.len()] == raw[..], "the guest differs");
        assert!(
            got[raw.len()..].iter().all(|b| *b == 0xAA),
            "written past the virtual size"
        );
    }

    #[test]
    fn handmade_v2_and_v3() {
        for version in [2, 3] {
            let b = build(version);
            let d = garbage_disk(1 << 20);
            let plan = convert(&Mem(b.image.clone()), Cursor::new(&b.image), d.path()).unwrap();
            check_written(&d, &b.raw);
            // 2..=5, 10..=19 and 21..=39 are zeros, coalesced.
            assert_eq!(
                plan.map.zeros,
                vec![(2 * CS, 4 * CS), (10 * CS, 10 * CS), (21 * CS, 19 * CS)]
            );
            // 7..=9 are one run.
            assert!(plan.map.extents.contains(&Extent {
                host: 7 * CS,
                len: 3 * CS,
                to: Use::Data(7 * CS)
            }));
        }
    }

    #[test]
    fn refusals() {
        let b = build(3);
        let dest = garbage_disk(1 << 20);
        let try_with = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut img = b.image.clone();
            f(&mut img);
            convert(&Mem(img.clone()), Cursor::new(img), dest.path())
                .unwrap_err()
                .to_string()
        };
        type Mutation = Box<dyn Fn(&mut Vec<u8>)>;
        let cases: Vec<(&str, Mutation)> = vec![
            ("backing file", Box::new(|i| put64(i, 8, 4000))),
            ("encrypted (AES)", Box::new(|i| put32(i, 32, 1))),
            ("encrypted (LUKS)", Box::new(|i| put32(i, 32, 2))),
            ("qcow version 1", Box::new(|i| put32(i, 4, 1))),
            ("version 4", Box::new(|i| put32(i, 4, 4))),
            ("cluster_bits 8", Box::new(|i| put32(i, 20, 8))),
            ("cluster_bits 22", Box::new(|i| put32(i, 20, 22))),
            ("corrupt", Box::new(|i| put64(i, 72, 2))),
            ("external data file", Box::new(|i| put64(i, 72, 4))),
            ("extended L2", Box::new(|i| put64(i, 72, 16))),
            (
                "unknown incompatible features 0x20",
                Box::new(|i| put64(i, 72, 0x20)),
            ),
            (
                "(zstd) is not supported",
                Box::new(|i| {
                    put64(i, 72, 8);
                    i[104] = 1;
                }),
            ),
            ("larger than DEST_DISK", Box::new(|i| put64(i, 24, 2 << 20))),
            (
                "too small for the virtual size",
                Box::new(|i| put32(i, 36, 0)),
            ),
            ("not cluster-aligned", Box::new(|i| put64(i, 40, CS + 8))),
            (
                "past the end of the file",
                Box::new(|i| put64(i, 40, 100 * CS)),
            ),
            (
                "L1 entry 0 has reserved bits",
                Box::new(|i| put64(i, CS as usize, (2 * CS) | 1)),
            ),
            (
                "reserved bits set",
                Box::new(|i| put64(i, 2 * CS as usize, (3 * CS) | 2)),
            ),
            (
                "data cluster of guest 0x0 at 0x3200 is not cluster-aligned",
                Box::new(|i| put64(i, 2 * CS as usize, 3 * CS + 512)),
            ),
            (
                "past the end",
                Box::new(|i| put64(i, 2 * CS as usize, 99 * CS)),
            ),
            (
                "does not inflate",
                Box::new(|i| i[(4 * CS + 100) as usize] ^= 0xff),
            ),
            ("no QFI", Box::new(|i| i[0] = b'X')),
            ("cut short", Box::new(|i| i.truncate(80))),
        ];
        for (want, f) in &cases {
            let e = try_with(f.as_ref());
            assert!(e.contains(want), "{want}: {e}");
        }
        // The stream ends before the data, or is not what was read ahead.
        let short = &b.image[..b.image.len() - CS as usize];
        let e = convert(&Mem(b.image.clone()), Cursor::new(short), dest.path()).unwrap_err();
        assert!(e.to_string().contains("the download ended at byte"), "{e}");
        let mut changed = b.image.clone();
        changed[2 * CS as usize + 8 * 30] = 1;
        let e = convert(&Mem(b.image.clone()), Cursor::new(changed), dest.path()).unwrap_err();
        assert!(e.to_string().contains("did the image change?"), "{e}");
        let mut longer = b.image.clone();
        longer.push(0);
        let e = convert(&Mem(b.image.clone()), Cursor::new(longer), dest.path()).unwrap_err();
        assert!(e.to_string().contains("the range reads said"), "{e}");
    }

    /// Hostile images: random, truncated and mutated headers and tables
    /// end in an error or a write inside the virtual size, never a panic.
    #[test]
    fn fuzz_no_panics() {
        let dest = garbage_disk(1 << 20);
        let mut rng = fastrand::Rng::with_seed(0x9c0f2);
        let bases = [build(2).image, build(3).image];
        let extremes = [
            0,
            1,
            u64::MAX,
            1 << 63,
            1 << 62,
            0x00ff_ffff_ffff_fe00,
            511,
            512,
            CS,
        ];
        let (mut ok, mut failed) = (0, 0);
        for _ in 0..3000 {
            let mut img = bases[rng.usize(..2)].clone();
            let mut stream = None;
            match rng.u8(..5) {
                0 => {
                    for _ in 0..rng.usize(1..8) {
                        let at = rng.usize(..3 * CS as usize);
                        img[at] = rng.u8(..);
                    }
                }
                1 => img.truncate(rng.usize(..img.len())),
                2 => {
                    let at = if rng.bool() {
                        rng.usize(..14) * 8
                    } else {
                        CS as usize + rng.usize(..(2 * CS as usize / 8)) * 8
                    };
                    let v = if rng.bool() {
                        extremes[rng.usize(..extremes.len())]
                    } else {
                        rng.u64(..)
                    };
                    put64(&mut img, at, v);
                }
                3 => {
                    img.truncate(rng.usize(8..16 << 10));
                    rng.fill(&mut img[8..]);
                }
                _ => {
                    let mut s = img.clone();
                    let at = rng.usize(..s.len());
                    s[at] ^= 1 << rng.u8(..8);
                    stream = Some(s);
                }
            }
            let s = stream.unwrap_or_else(|| img.clone());
            match convert(&Mem(img), Cursor::new(s), dest.path()) {
                Ok(p) => {
                    assert!(p.header.virtual_size <= 1 << 20);
                    ok += 1;
                }
                Err(_) => failed += 1,
            }
        }
        let len = std::fs::metadata(dest.path()).unwrap().len();
        assert_eq!(len, 1 << 20, "the destination grew");
        assert!(ok > 100 && failed > 100, "{ok} converted, {failed} refused");
    }

    #[test]
    fn pure_pieces() {
        assert_eq!(content_range("bytes 0-511/1000"), Some((0, 511, 1000)));
        assert_eq!(content_range("bytes 10-9/1000"), None);
        assert_eq!(content_range("bytes 0-1000/1000"), None);
        assert_eq!(content_range("bytes 0-5/*"), None);
        assert_eq!(content_range(""), None);
        // Neighbours share a request; far ones and big ones do not.
        assert_eq!(
            requests(&[CS, 2 * CS, 4 * CS, 100 * CS], CS),
            vec![(CS, 4 * CS), (100 * CS, CS)]
        );
        let many: Vec<u64> = (1..=2000).map(|i| i * CS).collect();
        let r = requests(&many, CS);
        assert!(r.iter().all(|(_, l)| *l <= CHUNK));
        assert_eq!(r.iter().map(|(_, l)| l).sum::<u64>(), 2000 * CS);
        assert_eq!(split(7, 0), vec![]);
        assert_eq!(split(0, CHUNK + 1), vec![(0, CHUNK), (CHUNK, 1)]);
    }

    fn qemu_img_present() -> bool {
        let ok = Command::new("qemu-img")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        if !ok {
            eprintln!(
                "\n*** qemu-img IS MISSING: the qcow2 round trips against qemu-img DID NOT RUN \
                 (apt-get install qemu-utils) ***\n"
            );
        }
        ok
    }

    fn run(cmd: &str, args: &[&str]) {
        let out = Command::new(cmd).args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{cmd} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `image` converted here onto old data equals qemu-img's own raw.
    fn same_as_qemu(image: &Path, dir: &Path) {
        let reference = dir.join("reference.raw");
        run(
            "qemu-img",
            &[
                "convert",
                "-f",
                "qcow2",
                "-O",
                "raw",
                image.to_str().unwrap(),
                reference.to_str().unwrap(),
            ],
        );
        let raw = std::fs::read(&reference).unwrap();
        let d = garbage_disk(raw.len() as u64 + (1 << 20));
        let src = FileRanges::open(image).unwrap();
        convert(&src, File::open(image).unwrap(), d.path()).unwrap();
        check_written(&d, &raw);
    }

    #[test]
    fn qemu_img_round_trips() {
        if !qemu_img_present() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let len = (12 << 20) + 1536;
        let mut raw = vec![0u8; len];
        let mut rng = fastrand::Rng::with_seed(42);
        // An MBR with one partition, random blocks, a compressible run,
        // holes, and data up to the last byte.
        raw[446..462].copy_from_slice(&[0x80, 0, 2, 0, 0x83, 0, 0, 0, 0, 8, 0, 0, 0, 0x60, 0, 0]);
        raw[510] = 0x55;
        raw[511] = 0xAA;
        for (at, n) in [
            (4096, 60_000),
            (1 << 20, 100_000),
            ((3 << 20) + 512, 4096),
            (5 << 20, 2 << 20),
            (len - 1000, 1000),
        ] {
            rng.fill(&mut raw[at..at + n]);
        }
        raw[8 << 20..(8 << 20) + 300_000].fill(0x5A);
        let src = dir.path().join("src.raw");
        std::fs::write(&src, &raw).unwrap();
        let variants: &[&[&str]] = &[
            &[],
            &["-c"],
            &["-o", "compat=0.10"],
            &["-o", "compat=0.10", "-c"],
            &["-o", "cluster_size=4096"],
            &["-o", "cluster_size=4096", "-c"],
            &["-o", "cluster_size=2M"],
            &["-o", "cluster_size=2M", "-c"],
            &["-o", "cluster_size=512", "-c"],
        ];
        for v in variants {
            let img = dir.path().join("img.qcow2");
            let mut args = vec!["convert", "-f", "raw", "-O", "qcow2"];
            args.extend_from_slice(v);
            args.extend([src.to_str().unwrap(), img.to_str().unwrap()]);
            run("qemu-img", &args);
            eprintln!("qcow2 {v:?}");
            same_as_qemu(&img, dir.path());
            // What qemu-img converts back is what went in.
            let reference = std::fs::read(dir.path().join("reference.raw")).unwrap();
            assert!(reference[..len] == raw[..], "{v:?}");
        }
    }

    /// Zero flags over allocated clusters, unallocated ones, compressed
    /// writes and clusters shared with a snapshot, as qemu-io makes them.
    #[test]
    fn qemu_io_zero_flags_and_snapshots() {
        if !qemu_img_present() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("img.qcow2");
        let p = img.to_str().unwrap();
        run("qemu-img", &["create", "-q", "-f", "qcow2", p, "8M"]);
        let io = |cmds: &[&str]| {
            let mut args = vec!["-f", "qcow2"];
            for c in cmds {
                args.extend(["-c", c]);
            }
            args.push(p);
            run("qemu-io", &args);
        };
        io(&[
            "write -P 0x11 0 2M",
            "write -z 512k 1M",
            "write -P 0x22 6M 64k",
            "write -c -P 0x33 7M 64k",
        ]);
        run("qemu-img", &["snapshot", "-c", "s1", p]);
        io(&[
            "write -P 0x44 1536k 256k",
            "write -z 6M 64k",
            "write -z 4M 1M",
            "write -P 0x55 7M 4k",
        ]);
        same_as_qemu(&img, dir.path());
    }

    /// `files` served (Range answered when `ranges`); the port.
    async fn serve(files: HashMap<String, Vec<u8>>, ranges: bool) -> u16 {
        let files = files
            .into_iter()
            .map(|(p, b)| (p, crate::testing::File::sized(b)))
            .collect();
        let base = crate::testing::serve(files, ranges).await;
        base.rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap()
    }

    async fn action(kind: &str, env: &[(&str, String)]) -> Result<String, ActionError> {
        let m: BTreeMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        let (progress, _rx) = Progress::channel();
        match kind {
            "image2disk" => disk::image2disk(&Env(&m), &progress).await,
            _ => disk::qemuimg2disk(&Env(&m), &progress).await,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn over_http_with_checksums() {
        let b = build(3);
        let md5 = hex::encode(<md5::Md5 as md5::Digest>::digest(&b.image));
        let sha512 = hex::encode(sha2::Sha512::digest(&b.image));
        let sums = format!("{}  other.qcow2\n{sha512} *disk.qcow2\n", "0".repeat(128));
        let mut files = HashMap::new();
        files.insert("/disk.qcow2".to_string(), b.image.clone());
        files.insert("/SHA512SUMS".to_string(), sums.into_bytes());
        files.insert("/x.vmdk".to_string(), b"KDMV\x01\0\0\0".repeat(64));
        let mut big_raw = vec![0u8; 3 << 20];
        fastrand::Rng::with_seed(5).fill(&mut big_raw);
        files.insert("/big.raw".to_string(), big_raw.clone());
        let port = serve(files.clone(), true).await;
        let url = format!("http://127.0.0.1:{port}/disk.qcow2");
        for (kind, sum) in [
            (
                "qemuimg2disk",
                vec![("CHECKSUM", format!("http://127.0.0.1:{port}/SHA512SUMS"))],
            ),
            (
                "image2disk",
                vec![("CHECKSUM", md5.clone()), ("CHECKSUM_TYPE", "md5".into())],
            ),
            ("image2disk", vec![]),
        ] {
            let d = garbage_disk(1 << 20);
            let mut env = vec![
                ("IMG_URL", url.clone()),
                ("DEST_DISK", d.path().display().to_string()),
            ];
            env.extend(sum.clone());
            let msg = action(kind, &env).await.unwrap();
            assert!(msg.contains("qcow2 v3"), "{msg}");
            check_written(&d, &b.raw);
        }

        // A wrong digest fails, saying both, and zeroes the disk's head.
        let d = garbage_disk(2 << 20);
        let env = [
            ("IMG_URL", url.clone()),
            ("DEST_DISK", d.path().display().to_string()),
            ("CHECKSUM", "f".repeat(32)),
        ];
        let e = action("qemuimg2disk", &env).await.unwrap_err().to_string();
        assert!(
            e.contains("md5 mismatch") && e.contains(&md5) && e.contains(&"f".repeat(32)),
            "{e}"
        );
        let got = std::fs::read(d.path()).unwrap();
        assert!(
            got[..1 << 20].iter().all(|b| *b == 0) && got[1 << 20..].iter().all(|b| *b == 0xAA)
        );

        // Another format qemu-img knows is refused; no format is raw.
        let d = garbage_disk(1 << 20);
        let env = [
            ("IMG_URL", format!("http://127.0.0.1:{port}/x.vmdk")),
            ("DEST_DISK", d.path().display().to_string()),
        ];
        let e = action("qemuimg2disk", &env).await.unwrap_err().to_string();
        assert!(e.contains("is vmdk"), "{e}");
        let env = [
            ("IMG_URL", format!("http://127.0.0.1:{port}/SHA512SUMS")),
            ("DEST_DISK", d.path().display().to_string()),
        ];
        action("qemuimg2disk", &env).await.unwrap();
        assert!(std::fs::read(d.path()).unwrap().starts_with(b"0000"));

        // A raw image longer than the look at its head, checked.
        let d = garbage_disk(4 << 20);
        let env = [
            ("IMG_URL", format!("http://127.0.0.1:{port}/big.raw")),
            ("DEST_DISK", d.path().display().to_string()),
            ("SHA256", hex::encode(sha2::Sha256::digest(&big_raw))),
        ];
        action("image2disk", &env).await.unwrap();
        check_written(&d, &big_raw);

        // A server that ignores Range.
        let port = serve(files, false).await;
        let url = format!("http://127.0.0.1:{port}/disk.qcow2");
        let e = HttpRanges::open(&url).await.err().unwrap().to_string();
        assert!(e.contains(NEEDS_RANGES), "{e}");
        let env = [
            ("IMG_URL", url),
            ("DEST_DISK", d.path().display().to_string()),
        ];
        let e = action("qemuimg2disk", &env).await.unwrap_err().to_string();
        assert!(
            e.contains("qcow2 needs a server that answers HTTP range requests"),
            "{e}"
        );
    }
}
