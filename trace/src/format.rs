//! The trace file: a JSON header, chunks (one message of one stream each,
//! zstd-compressed), an end record. Layout in trace/include/bunkai_trace.h.
//!
//! The writer writes to a temporary file beside the target and renames it
//! at the end, so a trace file either is complete or does not exist. The
//! reader indexes the chunks without decompressing them and checks every
//! header; damage is reported with the byte offset where it starts.

use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

pub const VERSION: u32 = 4;
/// The oldest version this reader still reads (no CUT chunks, a BYE of
/// four fields).
pub const OLDEST_VERSION: u32 = 1;
pub const FILE_MAGIC: &[u8; 8] = b"BKTRACE\0";
pub const CHUNK_MAGIC: &[u8; 4] = b"BKCH";
pub const END_MAGIC: &[u8; 4] = b"BKEN";
pub const CHUNK_HEADER: u64 = 24;
pub const END_LEN: u64 = 20;

pub const CHUNK_HELLO: u8 = 1;
pub const CHUNK_DEFS: u8 = 2;
pub const CHUNK_EVENTS: u8 = 3;
pub const CHUNK_BYE: u8 = 4;
/// Written by the recorder only: a stream that ended without BYE.
pub const CHUNK_CUT: u8 = 5;

pub const CODEC_RAW: u8 = 0;
pub const CODEC_ZSTD: u8 = 1;

/// A damaged or foreign file. Every variant names what to do.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("{path}: not a bunkai trace (no BKTRACE header; record one with `bunkai trace record`)")]
    NotATrace { path: String },
    #[error("{path}: trace format version {found}, this bunkai reads versions {OLDEST_VERSION} to {VERSION} (record it again with this bunkai)")]
    Version { path: String, found: u32 },
    #[error("{path}: truncated at byte {offset}: {what} (the recording was cut short; record again)")]
    Truncated { path: String, offset: u64, what: String },
    #[error("{path}: corrupted at byte {offset}: {what} (the file was damaged; record again)")]
    Corrupt { path: String, offset: u64, what: String },
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
}

/// Where one chunk lies in the file.
#[derive(Debug, Clone, Copy)]
pub struct ChunkRef {
    pub kind: u8,
    pub codec: u8,
    pub stream: u32,
    /// Offset of the chunk header.
    pub offset: u64,
    pub raw_len: u32,
    pub stored_len: u32,
    pub crc: u32,
}

/// An opened trace: its metadata and the index of its chunks.
pub struct TraceFile {
    pub path: PathBuf,
    pub meta: serde_json::Value,
    pub chunks: Vec<ChunkRef>,
    pub file_len: u64,
    /// Total decompressed bytes, from the end record.
    pub raw_bytes: u64,
}

impl TraceFile {
    pub fn open(path: &Path) -> Result<TraceFile, TraceError> {
        let p = path.display().to_string();
        let io = |source| TraceError::Io { path: p.clone(), source };
        let mut f = File::open(path).map_err(io)?;
        let file_len = f.metadata().map_err(io)?.len();
        let trunc = |offset, what: &str| TraceError::Truncated { path: p.clone(), offset, what: what.into() };
        let corrupt = |offset, what: String| TraceError::Corrupt { path: p.clone(), offset, what };

        let mut head = [0u8; 16];
        if file_len < 8 {
            return Err(TraceError::NotATrace { path: p });
        }
        let n = read_full(&mut f, &mut head).map_err(io)?;
        if &head[..8] != FILE_MAGIC {
            return Err(TraceError::NotATrace { path: p });
        }
        if n < 16 {
            return Err(trunc(n as u64, "inside the file header"));
        }
        let version = le32(&head[8..]);
        if !(OLDEST_VERSION..=VERSION).contains(&version) {
            return Err(TraceError::Version { path: p, found: version });
        }
        let meta_len = le32(&head[12..]) as u64;
        if 16 + meta_len > file_len {
            return Err(trunc(file_len, "inside the metadata"));
        }
        let mut meta = vec![0u8; meta_len as usize];
        f.read_exact(&mut meta).map_err(io)?;
        let mut crc = [0u8; 4];
        if read_full(&mut f, &mut crc).map_err(io)? < 4 {
            return Err(trunc(16 + meta_len, "inside the file header"));
        }
        if le32(&crc) != crc32fast::hash(&meta) {
            return Err(corrupt(16, "metadata checksum mismatch".into()));
        }
        let meta: serde_json::Value =
            serde_json::from_slice(&meta).map_err(|e| corrupt(16, format!("metadata is not JSON ({e})")))?;

        let mut chunks = Vec::new();
        let mut off = 16 + meta_len + 4;
        let mut raw_total = 0u64;
        loop {
            if off == file_len {
                return Err(trunc(off, "no end record"));
            }
            let mut h = [0u8; CHUNK_HEADER as usize];
            f.seek(SeekFrom::Start(off)).map_err(io)?;
            let got = read_full(&mut f, &mut h).map_err(io)?;
            if got >= 4 && &h[..4] == END_MAGIC {
                if (got as u64) < END_LEN {
                    return Err(trunc(off, "inside the end record"));
                }
                let nchunks = le32(&h[4..]);
                let raw = u64::from_le_bytes(h[8..16].try_into().unwrap());
                let crc = le32(&h[16..]);
                if crc != crc32fast::hash(&h[..16]) {
                    return Err(corrupt(off, "end record checksum mismatch".into()));
                }
                if nchunks as usize != chunks.len() || raw != raw_total {
                    return Err(corrupt(
                        off,
                        format!("end record counts {nchunks} chunks, the file holds {}", chunks.len()),
                    ));
                }
                if off + END_LEN != file_len {
                    return Err(corrupt(off + END_LEN, "bytes after the end record".into()));
                }
                return Ok(TraceFile { path: path.into(), meta, chunks, file_len, raw_bytes: raw_total });
            }
            if got < 4 || &h[..4] != CHUNK_MAGIC {
                if got < 4 {
                    return Err(trunc(off, "no end record"));
                }
                return Err(corrupt(off, "expected a chunk header (BKCH)".into()));
            }
            if (got as u64) < CHUNK_HEADER {
                return Err(trunc(off, "inside a chunk header"));
            }
            let c = ChunkRef {
                kind: h[4],
                codec: h[5],
                stream: le32(&h[8..]),
                offset: off,
                raw_len: le32(&h[12..]),
                stored_len: le32(&h[16..]),
                crc: le32(&h[20..]),
            };
            if !(CHUNK_HELLO..=CHUNK_CUT).contains(&c.kind) || c.codec > CODEC_ZSTD || h[6] != 0 || h[7] != 0 {
                return Err(corrupt(off, format!("chunk header with kind {} codec {}", c.kind, c.codec)));
            }
            let end = off + CHUNK_HEADER + c.stored_len as u64;
            if end > file_len {
                return Err(trunc(off, &format!("chunk of {} bytes runs past the end", c.stored_len)));
            }
            raw_total += c.raw_len as u64;
            chunks.push(c);
            off = end;
        }
    }

    /// The decompressed payload of a chunk, its checksum and length checked.
    pub fn read_chunk(&self, c: &ChunkRef) -> Result<Vec<u8>, TraceError> {
        let p = self.path.display().to_string();
        let io = |source| TraceError::Io { path: p.clone(), source };
        let mut f = File::open(&self.path).map_err(io)?;
        f.seek(SeekFrom::Start(c.offset + CHUNK_HEADER)).map_err(io)?;
        let mut stored = vec![0u8; c.stored_len as usize];
        f.read_exact(&mut stored).map_err(io)?;
        self.decode_chunk(c, stored)
    }

    /// Checks and decompresses the stored bytes of a chunk.
    pub fn decode_chunk(&self, c: &ChunkRef, stored: Vec<u8>) -> Result<Vec<u8>, TraceError> {
        let corrupt = |what: String| TraceError::Corrupt {
            path: self.path.display().to_string(),
            offset: c.offset,
            what,
        };
        if chunk_crc(c.kind, c.codec, c.stream, c.raw_len, &stored) != c.crc {
            return Err(corrupt("chunk checksum mismatch".into()));
        }
        let raw = match c.codec {
            CODEC_RAW => stored,
            _ => zstd::bulk::decompress(&stored, c.raw_len as usize)
                .map_err(|e| corrupt(format!("chunk does not decompress ({e})")))?,
        };
        if raw.len() != c.raw_len as usize {
            return Err(corrupt(format!("chunk holds {} bytes, its header says {}", raw.len(), c.raw_len)));
        }
        Ok(raw)
    }

    /// All chunks of one kind, in file order.
    pub fn chunks_of(&self, kind: u8) -> impl Iterator<Item = &ChunkRef> {
        self.chunks.iter().filter(move |c| c.kind == kind)
    }

    /// The stream ids present, in order of first appearance.
    pub fn streams(&self) -> Vec<u32> {
        let mut v: Vec<u32> = Vec::new();
        for c in &self.chunks {
            if !v.contains(&c.stream) {
                v.push(c.stream);
            }
        }
        v
    }
}

/// The checksum of a chunk covers its header fields and its stored bytes.
fn chunk_crc(kind: u8, codec: u8, stream: u32, raw_len: u32, stored: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&[kind, codec, 0, 0]);
    h.update(&stream.to_le_bytes());
    h.update(&raw_len.to_le_bytes());
    h.update(&(stored.len() as u32).to_le_bytes());
    h.update(stored);
    h.finalize()
}

fn read_full(f: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

fn le32(b: &[u8]) -> u32 {
    u32::from_le_bytes(b[..4].try_into().unwrap())
}

/// Writes a trace file: `create`, any number of `chunk`, then `finish`,
/// which renames the temporary file into place. Dropping a writer without
/// finishing removes the temporary file.
pub struct Writer {
    out: BufWriter<tempfile::NamedTempFile>,
    target: PathBuf,
    nchunks: u32,
    raw_bytes: u64,
    level: i32,
    pub stored_bytes: u64,
}

impl Writer {
    pub fn create(target: &Path, meta: &serde_json::Value, level: i32) -> anyhow::Result<Writer> {
        // refused before any work: the file is put in place at the end
        if target.is_dir() {
            anyhow::bail!("{} is a directory (give a file name, e.g. {})", target.display(), target.join("trace.bkt").display());
        }
        let dir = match target.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        // The recorder's pid in the name: a later recorder removes the file
        // if this one was killed (record.rs, remove_stale).
        let tmp = tempfile::Builder::new()
            .prefix(&format!("{}{}-", crate::record::TEMP_PREFIX, std::process::id()))
            .tempfile_in(dir)
            .map_err(|e| anyhow::anyhow!("cannot create a file in {} ({e})", dir.display()))?;
        let mut out = BufWriter::with_capacity(1 << 20, tmp);
        let meta = serde_json::to_vec(meta)?;
        out.write_all(FILE_MAGIC)?;
        out.write_all(&VERSION.to_le_bytes())?;
        out.write_all(&(meta.len() as u32).to_le_bytes())?;
        out.write_all(&meta)?;
        out.write_all(&crc32fast::hash(&meta).to_le_bytes())?;
        Ok(Writer { out, target: target.into(), nchunks: 0, raw_bytes: 0, level, stored_bytes: 20 + meta.len() as u64 })
    }

    /// Compresses (when it pays) and appends one chunk.
    pub fn chunk(&mut self, kind: u8, stream: u32, raw: &[u8]) -> anyhow::Result<()> {
        let compressed = if raw.len() >= 64 { Some(zstd::bulk::compress(raw, self.level)?) } else { None };
        self.chunk_stored(kind, stream, raw.len(), compressed.as_deref(), raw)
    }

    /// Appends a chunk whose compressed form (if any) is already made.
    pub fn chunk_stored(
        &mut self,
        kind: u8,
        stream: u32,
        raw_len: usize,
        compressed: Option<&[u8]>,
        raw: &[u8],
    ) -> anyhow::Result<()> {
        let (codec, stored) = match compressed {
            Some(c) if c.len() < raw_len => (CODEC_ZSTD, c),
            _ => (CODEC_RAW, raw),
        };
        let mut h = [0u8; CHUNK_HEADER as usize];
        h[..4].copy_from_slice(CHUNK_MAGIC);
        h[4] = kind;
        h[5] = codec;
        h[8..12].copy_from_slice(&stream.to_le_bytes());
        h[12..16].copy_from_slice(&(raw_len as u32).to_le_bytes());
        h[16..20].copy_from_slice(&(stored.len() as u32).to_le_bytes());
        let crc = chunk_crc(kind, codec, stream, raw_len as u32, stored);
        h[20..24].copy_from_slice(&crc.to_le_bytes());
        self.out.write_all(&h)?;
        self.out.write_all(stored)?;
        self.nchunks += 1;
        self.raw_bytes += raw_len as u64;
        self.stored_bytes += CHUNK_HEADER + stored.len() as u64;
        Ok(())
    }

    /// The unfinished file (removed if the writer is dropped unfinished).
    pub fn temp_path(&self) -> &Path {
        self.out.get_ref().path()
    }

    pub fn level(&self) -> i32 {
        self.level
    }

    /// Writes the end record, syncs and renames into place.
    pub fn finish(mut self) -> anyhow::Result<u64> {
        let mut e = [0u8; END_LEN as usize];
        e[..4].copy_from_slice(END_MAGIC);
        e[4..8].copy_from_slice(&self.nchunks.to_le_bytes());
        e[8..16].copy_from_slice(&self.raw_bytes.to_le_bytes());
        let crc = crc32fast::hash(&e[..16]);
        e[16..20].copy_from_slice(&crc.to_le_bytes());
        self.out.write_all(&e)?;
        self.stored_bytes += END_LEN;
        let tmp = self.out.into_inner().map_err(|e| e.into_error())?;
        tmp.as_file().sync_all()?;
        let _ = std::fs::set_permissions(tmp.path(), std::os::unix::fs::PermissionsExt::from_mode(0o644));
        tmp.persist(&self.target)?;
        Ok(self.stored_bytes)
    }
}

/// LEB128 and zigzag reading over one decompressed payload; errors carry
/// the position inside the payload.
pub struct Cursor<'a> {
    pub buf: &'a [u8],
    pub pos: usize,
}

#[derive(Debug, thiserror::Error)]
#[error("record ends early or is malformed at payload byte {0}")]
pub struct CursorError(pub usize);

impl<'a> Cursor<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Cursor { buf, pos: 0 }
    }
    pub fn done(&self) -> bool {
        self.pos >= self.buf.len()
    }
    #[inline]
    pub fn v(&mut self) -> Result<u64, CursorError> {
        let mut r = 0u64;
        let mut shift = 0;
        loop {
            let b = *self.buf.get(self.pos).ok_or(CursorError(self.pos))?;
            self.pos += 1;
            if shift == 63 && b > 1 {
                return Err(CursorError(self.pos - 1));
            }
            r |= ((b & 0x7f) as u64) << shift;
            if b & 0x80 == 0 {
                return Ok(r);
            }
            shift += 7;
            if shift > 63 {
                return Err(CursorError(self.pos - 1));
            }
        }
    }
    #[inline]
    pub fn z(&mut self) -> Result<i64, CursorError> {
        Ok(unzigzag(self.v()?))
    }
    pub fn s(&mut self) -> Result<String, CursorError> {
        let n = self.v()? as usize;
        let start = self.pos;
        let end = start.checked_add(n).filter(|&e| e <= self.buf.len()).ok_or(CursorError(start))?;
        self.pos = end;
        Ok(String::from_utf8_lossy(&self.buf[start..end]).into_owned())
    }
}

#[inline]
pub fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

#[inline]
pub fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

/// LEB128 writing (tests and synthetic traces; the tool has its own in C).
pub fn put_v(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub fn put_z(out: &mut Vec<u8>, v: i64) {
    put_v(out, zigzag(v))
}

pub fn put_s(out: &mut Vec<u8>, s: &str) {
    put_v(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(dir: &Path) -> PathBuf {
        let p = dir.join("t.bktrace");
        let mut w = Writer::create(&p, &serde_json::json!({"command": ["x"]}), 3).unwrap();
        w.chunk(CHUNK_HELLO, 1, b"hello").unwrap();
        w.chunk(CHUNK_EVENTS, 1, &vec![7u8; 5000]).unwrap();
        w.finish().unwrap();
        p
    }

    #[test]
    fn round_trip() {
        let d = tempfile::tempdir().unwrap();
        let p = sample(d.path());
        let t = TraceFile::open(&p).unwrap();
        assert_eq!(t.chunks.len(), 2);
        assert_eq!(t.meta["command"][0], "x");
        assert_eq!(t.read_chunk(&t.chunks[0]).unwrap(), b"hello");
        assert_eq!(t.chunks[1].codec, CODEC_ZSTD);
        assert_eq!(t.read_chunk(&t.chunks[1]).unwrap(), vec![7u8; 5000]);
    }

    #[test]
    fn every_truncation_is_reported_with_an_offset() {
        let d = tempfile::tempdir().unwrap();
        let p = sample(d.path());
        let full = std::fs::read(&p).unwrap();
        for cut in 0..full.len() {
            std::fs::write(&p, &full[..cut]).unwrap();
            let e = TraceFile::open(&p).err().expect("a cut file must not open");
            let msg = e.to_string();
            assert!(msg.contains("truncated") || msg.contains("not a bunkai trace"), "cut {cut}: {msg}");
        }
    }

    #[test]
    fn flipped_bytes_are_caught() {
        let d = tempfile::tempdir().unwrap();
        let p = sample(d.path());
        let full = std::fs::read(&p).unwrap();
        for i in 0..full.len() {
            let mut b = full.clone();
            b[i] ^= 0x40;
            std::fs::write(&p, &b).unwrap();
            let bad = match TraceFile::open(&p) {
                Err(_) => true,
                Ok(t) => t.chunks.iter().any(|c| t.read_chunk(c).is_err()),
            };
            assert!(bad, "flip at {i} went unnoticed");
        }
    }

    #[test]
    fn varints() {
        let mut b = Vec::new();
        for v in [0u64, 1, 127, 128, 300, u64::MAX] {
            put_v(&mut b, v);
        }
        for z in [0i64, -1, 1, i64::MIN, i64::MAX] {
            put_z(&mut b, z);
        }
        let mut c = Cursor::new(&b);
        for v in [0u64, 1, 127, 128, 300, u64::MAX] {
            assert_eq!(c.v().unwrap(), v);
        }
        for z in [0i64, -1, 1, i64::MIN, i64::MAX] {
            assert_eq!(c.z().unwrap(), z);
        }
        assert!(c.done());
        assert!(c.v().is_err());
    }
}
