//! image2disk: stream an image over HTTP onto a disk, decompressing in the
//! same pass. The write side (decompress, write, fsync, re-read the
//! partition table) is shared with oci2disk. A qcow2 image (image2disk
//! sniffs it, qemuimg2disk expects it) is converted by [`super::qcow2`].

use super::checksum::{self, Checksum};
use super::fetch::{self, Counter, Hashing, mib};
use super::{ActionError, Env, Progress, qcow2};
use bytes::Bytes;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Reads and writes are this big: large sequential writes are what a
/// disk (and the page cache behind it) does best.
const BUF: usize = 4 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Raw,
    Gzip,
    Xz,
    Zstd,
    Bzip2,
}

impl Format {
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Raw => "raw",
            Format::Gzip => "gzip",
            Format::Xz => "xz",
            Format::Zstd => "zstd",
            Format::Bzip2 => "bzip2",
        }
    }
}

/// The compression of a stream, by its first bytes. upstream's image2disk
/// goes by the URL's suffix; the content is what a misnamed file cannot
/// lie about, and every suffix it knows has one of these magics.
pub fn sniff(head: &[u8]) -> Option<Format> {
    if head.starts_with(&[0x1f, 0x8b]) {
        Some(Format::Gzip)
    } else if head.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0x00]) {
        Some(Format::Xz)
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Some(Format::Zstd)
    } else if head.starts_with(b"BZh") {
        Some(Format::Bzip2)
    } else {
        None
    }
}

/// What a write did.
#[derive(Debug)]
pub struct Written {
    pub format: Format,
    pub bytes: u64,
    pub seconds: f64,
}

impl Written {
    pub fn mb_per_s(&self) -> f64 {
        self.bytes as f64 / 1e6 / self.seconds.max(1e-9)
    }
}

/// How much of a disk is zeroed when its image fails its checksum: the
/// partition tables (MBR, GPT) and boot code are in it, so a corrupt image
/// never boots.
pub const WIPE: u64 = 1 << 20;

/// The size of `f`, a disk or a file: seeking to its end works for both
/// (a block device's metadata says 0).
pub fn device_size(f: &File) -> std::io::Result<u64> {
    let mut f = f;
    let n = f.seek(SeekFrom::End(0))?;
    f.seek(SeekFrom::Start(0))?;
    Ok(n)
}

/// Zeroes the first [`WIPE`] bytes of `out` and syncs them.
pub fn wipe_head(out: &File) -> std::io::Result<()> {
    let n = device_size(out)?.min(WIPE);
    out.write_all_at(&vec![0u8; n as usize], 0)?;
    out.sync_all()
}

/// Checks `got`, the digest of the bytes as fetched, against `sum`; on a
/// mismatch `out`'s head is wiped and the action fails saying both.
pub fn verify(
    sum: Option<&Checksum>,
    got: Option<String>,
    out: &File,
    dest: &Path,
    written: u64,
) -> Result<(), ActionError> {
    let (Some(sum), Some(got)) = (sum, got) else {
        return Ok(());
    };
    if got.eq_ignore_ascii_case(&sum.hex) {
        return Ok(());
    }
    let wiped = match wipe_head(out) {
        Ok(()) => format!("its first {} zeroed", mib(WIPE)),
        Err(e) => format!("zeroing its first {} failed: {e}", mib(WIPE)),
    };
    Err(ActionError::Failed(format!(
        "{} mismatch: the image is {got}, {} says {} ({} were written to {}, {wiped})",
        sum.alg.as_str(),
        sum.from,
        sum.hex,
        mib(written),
        dest.display()
    )))
}

/// fsync, then ask the kernel to re-read the partition table.
pub fn finish(out: &File, dest: &Path) -> Result<(), ActionError> {
    out.sync_all()
        .map_err(ActionError::io(format!("fsync of {}", dest.display())))?;
    if let Err(e) = crate::sys::reread_partitions(out) {
        // A partition or a plain file has no table to re-read.
        tracing::debug!(dest = %dest.display(), error = %e, "BLKRRPART");
    }
    Ok(())
}

/// Opens DEST_DISK for writing: it must exist (as upstream: no file is
/// created).
pub fn open_dest(dest: &Path) -> Result<File, ActionError> {
    OpenOptions::new()
        .write(true)
        .open(dest)
        .map_err(ActionError::io(format!(
            "opening DEST_DISK {}",
            dest.display()
        )))
}

/// Writes `src` to `dest` (which must exist: a disk, or a file standing
/// for one), decompressed when `compressed`, then fsyncs and asks the
/// kernel to re-read the partition table. `sum`, when given, is checked
/// over the bytes as fetched (what `sha256sum` of the file says).
pub fn write_image(
    src: impl Read,
    dest: &Path,
    compressed: bool,
    sum: Option<&Checksum>,
    written: &Counter,
) -> Result<Written, ActionError> {
    let t0 = Instant::now();
    let mut out = open_dest(dest)?;
    let mut src = BufReader::with_capacity(BUF, Hashing::new(src, sum.map(|s| s.alg)));
    let head = src
        .fill_buf()
        .map_err(ActionError::io("reading the image"))?;
    let format = if compressed {
        sniff(head).ok_or_else(|| {
            ActionError::Failed(format!(
                "COMPRESSED=true but the image is none of gzip, xz, zstd or bzip2 (it begins {})",
                hex::encode(&head[..head.len().min(8)])
            ))
        })?
    } else {
        Format::Raw
    };
    let mut reader: Box<dyn Read> = match format {
        Format::Raw => Box::new(&mut src),
        Format::Gzip => Box::new(flate2::bufread::MultiGzDecoder::new(&mut src)),
        Format::Xz => Box::new(liblzma::bufread::XzDecoder::new_multi_decoder(&mut src)),
        Format::Zstd => Box::new(
            zstd::stream::read::Decoder::with_buffer(&mut src)
                .map_err(ActionError::io("starting zstd"))?,
        ),
        Format::Bzip2 => Box::new(bzip2::bufread::MultiBzDecoder::new(&mut src)),
    };
    let mut buf = vec![0u8; BUF];
    let mut total = 0u64;
    loop {
        // Fill the whole buffer before writing: decoders return little at
        // a time, the disk wants big writes.
        let mut filled = 0;
        while filled < buf.len() {
            match reader.read(&mut buf[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    return Err(ActionError::Failed(format!(
                        "reading the {} image after writing {}: {e}",
                        format.as_str(),
                        mib(total)
                    )));
                }
            }
        }
        if filled == 0 {
            break;
        }
        out.write_all(&buf[..filled]).map_err(|e| {
            ActionError::Failed(format!(
                "writing to {} after {}: {e}",
                dest.display(),
                mib(total)
            ))
        })?;
        total += filled as u64;
        written.add(filled as u64);
    }
    drop(reader);
    // The rest of the stream (a trailer the decoder did not need) must be
    // read for the hash and the length check to see all of it.
    std::io::copy(&mut src, &mut std::io::sink())
        .map_err(ActionError::io("reading the end of the image"))?;
    verify(sum, src.into_inner().finish(), &out, dest, total)?;
    finish(&out, dest)?;
    Ok(Written {
        format,
        bytes: total,
        seconds: t0.elapsed().as_secs_f64(),
    })
}

/// Awaits `pump` (the download) and `job` (its blocking writer) together,
/// calling `tick` with the seconds elapsed every second until the writer
/// is done.
pub async fn drive<T: Send + 'static>(
    pump: impl std::future::Future<Output = ()>,
    job: tokio::task::JoinHandle<Result<T, ActionError>>,
    mut tick: impl FnMut(f64),
) -> Result<T, ActionError> {
    let t0 = Instant::now();
    let watch = async {
        tokio::pin!(job);
        loop {
            tokio::select! {
                r = &mut job => break r,
                _ = tokio::time::sleep(Duration::from_secs(1)) => tick(t0.elapsed().as_secs_f64()),
            }
        }
    };
    let (_, done) = tokio::join!(pump, watch);
    done.map_err(|e| ActionError::Failed(format!("the writer stopped: {e}")))?
}

/// Fetches `resp` (of which `head` was already read) and writes it with
/// [`write_image`], reporting progress.
pub async fn stream_to_disk(
    source: &str,
    head: Bytes,
    resp: reqwest::Response,
    dest: &str,
    compressed: bool,
    sum: Option<Checksum>,
    progress: &Progress,
) -> Result<String, ActionError> {
    let total = resp.content_length().map(|n| n + head.len() as u64);
    let read = Arc::new(Counter::default());
    let written = Arc::new(Counter::default());
    let (pump, body) = fetch::stream_after(head, resp, read.clone());
    let dest_path = dest.to_string();
    let w = written.clone();
    let writer = tokio::task::spawn_blocking(move || {
        write_image(body, Path::new(&dest_path), compressed, sum.as_ref(), &w)
    });
    let w = drive(pump, writer, |secs| {
        let of = total.map(|t| format!(" of {}", mib(t))).unwrap_or_default();
        progress.set(format!(
            "{source} -> {dest}: read {}{of}, wrote {} ({:.1} MB/s)",
            mib(read.get()),
            mib(written.get()),
            written.get() as f64 / 1e6 / secs
        ));
    })
    .await?;
    Ok(format!(
        "wrote {} to {dest} from {} {} in {:.1}s ({:.1} MB/s)",
        mib(w.bytes),
        mib(read.get()),
        w.format.as_str(),
        w.seconds,
        w.mb_per_s()
    ))
}

/// Bytes looked at to tell an image's format.
const SNIFF: usize = 512;

/// An image format of qemu-img's that this agent does not convert.
fn foreign(head: &[u8]) -> Option<&'static str> {
    if head.starts_with(b"KDMV") {
        Some("vmdk")
    } else if head.starts_with(b"vhdxfile") {
        Some("vhdx")
    } else if head.starts_with(b"conectix") {
        Some("vpc (VHD)")
    } else if head.get(64..68) == Some(&[0x7f, 0x10, 0xda, 0xbe]) {
        Some("vdi")
    } else {
        None
    }
}

/// image2disk: IMG_URL onto DEST_DISK, decompressed when COMPRESSED; a
/// qcow2 image is converted whatever COMPRESSED says.
pub async fn image2disk(env: &Env<'_>, progress: &Progress) -> Result<String, ActionError> {
    let compressed = env.flag("COMPRESSED", false)?;
    url_to_disk(env, progress, compressed, false).await
}

/// qemuimg2disk (upstream runs `qemu-img convert -O raw IMG_URL
/// DEST_DISK`): qcow2 is converted, an image in no known format is
/// written as raw (as qemu-img probes), another format is refused.
pub async fn qemuimg2disk(env: &Env<'_>, progress: &Progress) -> Result<String, ActionError> {
    url_to_disk(env, progress, false, true).await
}

async fn url_to_disk(
    env: &Env<'_>,
    progress: &Progress,
    compressed: bool,
    strict: bool,
) -> Result<String, ActionError> {
    let url = env.required("IMG_URL")?;
    let dest = env.required("DEST_DISK")?;
    let sum = checksum::from_env(env, url).await?;
    let resp = fetch::get(url).await?;
    let (head, resp) = fetch::peek(resp, SNIFF).await?;
    if head.starts_with(qcow2::MAGIC) {
        // The tables come first, by range reads; the file is fetched
        // again, whole, after them.
        drop(resp);
        return qcow2::to_disk(url, dest, sum, progress).await;
    }
    if strict {
        let what = foreign(&head).or_else(|| sniff(&head).map(Format::as_str));
        if let Some(what) = what {
            return Err(ActionError::Failed(format!(
                "{url} is {what}: qemuimg2disk here converts qcow2 and writes raw images, nothing else"
            )));
        }
    }
    stream_to_disk(url, head, resp, dest, compressed, sum, progress).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actions::fetch::Alg;
    use sha2::{Digest, Sha256};
    use std::io::Cursor;

    fn image() -> Vec<u8> {
        // 3 MiB that compress but are not all zeros.
        (0..3 << 20)
            .map(|i: u32| (i % 251) as u8 ^ (i >> 12) as u8)
            .collect()
    }

    fn disk(len: u64) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        f.as_file().set_len(len).unwrap();
        f
    }

    fn roundtrip(format: Format, packed: Vec<u8>) {
        let raw = image();
        let d = disk(8 << 20);
        let sum = Checksum::sha256(&hex::encode(Sha256::digest(&packed)), "SHA256");
        let n = Counter::default();
        let w = write_image(Cursor::new(packed), d.path(), true, Some(&sum), &n).unwrap();
        assert_eq!(w.format, format);
        assert_eq!(w.bytes, raw.len() as u64);
        assert_eq!(n.get(), raw.len() as u64);
        let got = std::fs::read(d.path()).unwrap();
        assert_eq!(&got[..raw.len()], &raw[..]);
        // The disk beyond the image is left alone, not truncated.
        assert_eq!(got.len(), 8 << 20);
    }

    #[test]
    fn every_compression_by_content() {
        let raw = image();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&raw).unwrap();
        roundtrip(Format::Gzip, gz.finish().unwrap());

        let mut xz = liblzma::write::XzEncoder::new(Vec::new(), 1);
        xz.write_all(&raw).unwrap();
        roundtrip(Format::Xz, xz.finish().unwrap());

        roundtrip(
            Format::Zstd,
            zstd::encode_all(Cursor::new(&raw), 3).unwrap(),
        );

        let mut bz = bzip2::write::BzEncoder::new(Vec::new(), bzip2::Compression::fast());
        bz.write_all(&raw).unwrap();
        roundtrip(Format::Bzip2, bz.finish().unwrap());
    }

    #[test]
    fn concatenated_gzip_members_are_one_image() {
        let raw = image();
        let (a, b) = raw.split_at(raw.len() / 3);
        let mut packed = Vec::new();
        for part in [a, b] {
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            gz.write_all(part).unwrap();
            packed.extend(gz.finish().unwrap());
        }
        roundtrip(Format::Gzip, packed);
    }

    #[test]
    fn raw_and_its_errors() {
        let raw = image();
        let d = disk(4 << 20);
        let n = Counter::default();
        let w = write_image(Cursor::new(raw.clone()), d.path(), false, None, &n).unwrap();
        assert_eq!(w.format, Format::Raw);
        assert_eq!(std::fs::read(d.path()).unwrap()[..raw.len()], raw[..]);

        // COMPRESSED=true over an image that is not compressed.
        let e = write_image(Cursor::new(raw.clone()), d.path(), true, None, &n).unwrap_err();
        assert!(e.to_string().contains("none of gzip"), "{e}");

        // A wrong checksum fails the action, saying both digests, and
        // the disk's head is zeroed so that it does not boot.
        let want = Checksum::sha256(&"0".repeat(64), "SHA256");
        let e = write_image(Cursor::new(raw.clone()), d.path(), false, Some(&want), &n)
            .unwrap_err()
            .to_string();
        let got = hex::encode(Sha256::digest(&raw));
        assert!(e.contains("sha256 mismatch"), "{e}");
        assert!(e.contains(&got) && e.contains(&want.hex), "{e}");
        let disk = std::fs::read(d.path()).unwrap();
        assert!(disk[..WIPE as usize].iter().all(|b| *b == 0));
        assert_eq!(disk[WIPE as usize..raw.len()], raw[WIPE as usize..]);

        // md5 and sha512, as CHECKSUM gives them.
        for (alg, hex) in [
            (
                Alg::Md5,
                hex::encode(<md5::Md5 as md5::Digest>::digest(&raw)),
            ),
            (Alg::Sha512, hex::encode(sha2::Sha512::digest(&raw))),
        ] {
            let sum = Checksum {
                alg,
                hex,
                from: "CHECKSUM".into(),
            };
            write_image(Cursor::new(raw.clone()), d.path(), false, Some(&sum), &n).unwrap();
            assert_eq!(std::fs::read(d.path()).unwrap()[..raw.len()], raw[..]);
            let bad = Checksum {
                hex: "f".repeat(alg.hex_len()),
                ..sum
            };
            let e = write_image(Cursor::new(raw.clone()), d.path(), false, Some(&bad), &n)
                .unwrap_err()
                .to_string();
            assert!(e.contains(&format!("{} mismatch", alg.as_str())), "{e}");
        }

        // A truncated gzip stream is an error, never a short success.
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&raw).unwrap();
        let mut packed = gz.finish().unwrap();
        packed.truncate(packed.len() / 2);
        let e = write_image(Cursor::new(packed), d.path(), true, None, &n).unwrap_err();
        assert!(e.to_string().contains("reading the gzip image"), "{e}");

        // DEST_DISK must exist (as upstream: no file is created).
        let e = write_image(
            Cursor::new(raw),
            Path::new("/nonexistent/disk"),
            false,
            None,
            &n,
        )
        .unwrap_err();
        assert!(e.to_string().contains("opening DEST_DISK"), "{e}");
    }
}
