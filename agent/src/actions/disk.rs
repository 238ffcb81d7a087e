//! image2disk: stream an image over HTTP onto a disk, decompressing in the
//! same pass. The write side (decompress, write, fsync, re-read the
//! partition table) is shared with oci2disk.

use super::fetch::{self, Alg, Counter, Hashing, mib};
use super::{ActionError, Env, Progress};
use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Read, Write};
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

/// Writes `src` to `dest` (which must exist: a disk, or a file standing
/// for one), decompressed when `compressed`, then fsyncs and asks the
/// kernel to re-read the partition table. `sha256`, when given, is
/// checked over the bytes as fetched (what `sha256sum` of the file says).
pub fn write_image(
    src: impl Read,
    dest: &Path,
    compressed: bool,
    sha256: Option<&str>,
    written: &Counter,
) -> Result<Written, ActionError> {
    let t0 = Instant::now();
    let mut out = OpenOptions::new()
        .write(true)
        .open(dest)
        .map_err(ActionError::io(format!(
            "opening DEST_DISK {}",
            dest.display()
        )))?;
    let mut src = BufReader::with_capacity(BUF, Hashing::new(src, sha256.map(|_| Alg::Sha256)));
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
    if let (Some(want), Some(got)) = (sha256, src.into_inner().finish())
        && !got.eq_ignore_ascii_case(want.trim())
    {
        return Err(ActionError::Failed(format!(
            "sha256 mismatch: the image is {got}, SHA256 says {want} ({} were written to {})",
            mib(total),
            dest.display()
        )));
    }
    out.sync_all()
        .map_err(ActionError::io(format!("fsync of {}", dest.display())))?;
    if let Err(e) = crate::sys::reread_partitions(&out) {
        // A partition or a plain file has no table to re-read.
        tracing::debug!(dest = %dest.display(), error = %e, "BLKRRPART");
    }
    Ok(Written {
        format,
        bytes: total,
        seconds: t0.elapsed().as_secs_f64(),
    })
}

/// Fetches `resp` and writes it with [`write_image`], reporting progress.
pub async fn stream_to_disk(
    source: &str,
    resp: reqwest::Response,
    dest: &str,
    compressed: bool,
    sha256: Option<String>,
    progress: &Progress,
) -> Result<String, ActionError> {
    let total = resp.content_length();
    let read = Arc::new(Counter::default());
    let written = Arc::new(Counter::default());
    let (pump, body) = fetch::stream(resp, read.clone());
    let dest_path = dest.to_string();
    let w = written.clone();
    let writer = tokio::task::spawn_blocking(move || {
        write_image(
            body,
            Path::new(&dest_path),
            compressed,
            sha256.as_deref(),
            &w,
        )
    });
    let t0 = Instant::now();
    // The writer's progress every second until it is done.
    let watch = async {
        tokio::pin!(writer);
        loop {
            tokio::select! {
                r = &mut writer => break r,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {
                    let secs = t0.elapsed().as_secs_f64();
                    let of = total.map(|t| format!(" of {}", mib(t))).unwrap_or_default();
                    progress.set(format!(
                        "{source} -> {dest}: read {}{of}, wrote {} ({:.1} MB/s)",
                        mib(read.get()),
                        mib(written.get()),
                        written.get() as f64 / 1e6 / secs
                    ));
                }
            }
        }
    };
    let (_, done) = tokio::join!(pump, watch);
    let w = done.map_err(|e| ActionError::Failed(format!("the writer stopped: {e}")))??;
    Ok(format!(
        "wrote {} to {dest} from {} {} in {:.1}s ({:.1} MB/s)",
        mib(w.bytes),
        mib(read.get()),
        w.format.as_str(),
        w.seconds,
        w.mb_per_s()
    ))
}

pub async fn image2disk(env: &Env<'_>, progress: &Progress) -> Result<String, ActionError> {
    let url = env.required("IMG_URL")?;
    let dest = env.required("DEST_DISK")?;
    let compressed = env.flag("COMPRESSED", false)?;
    let sha256 = checksum(env)?;
    let resp = fetch::get(url).await?;
    stream_to_disk(url, resp, dest, compressed, sha256, progress).await
}

/// `SHA256` (tinkerbox's addition): the hex sha256 of the image as served.
pub fn checksum(env: &Env<'_>) -> Result<Option<String>, ActionError> {
    match env.get("SHA256") {
        None => Ok(None),
        Some(s) if s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()) => {
            Ok(Some(s.to_ascii_lowercase()))
        }
        Some(s) => Err(ActionError::Env(format!(
            "SHA256={s:?} is not 64 hex digits"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
        let sum = hex::encode(Sha256::digest(&packed));
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

        // A wrong checksum fails the action.
        let e = write_image(
            Cursor::new(raw.clone()),
            d.path(),
            false,
            Some(&"0".repeat(64)),
            &n,
        )
        .unwrap_err();
        assert!(e.to_string().contains("sha256 mismatch"), "{e}");

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

    #[test]
    fn checksum_env() {
        let mut m = std::collections::BTreeMap::new();
        assert_eq!(checksum(&Env(&m)).unwrap(), None);
        m.insert("SHA256".into(), "AB".repeat(32));
        assert_eq!(checksum(&Env(&m)).unwrap(), Some("ab".repeat(32)));
        m.insert("SHA256".into(), "xyz".into());
        assert!(checksum(&Env(&m)).is_err());
    }
}
