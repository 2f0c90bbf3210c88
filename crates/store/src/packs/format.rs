//! The bytes of a pack entry, in one place: the packs write and read them
//! here, and `skillfs verify` reads the packs through the same functions.
//!
//! ```text
//! entry   = magic (4) | sha256 of the content (32) | body length (u64 LE) | body
//! "SKB1"  body = the content                                     (plain)
//! "SKZ1"  body = content length (u64 LE) | LZ4 block of it        (compressed)
//! "SKC1"  body = content length (u64 LE) | CRC-32 (u32 LE) | chunk* (chunked)
//! chunk   = sha256 of the chunk (32) | chunk length (u32 LE)
//! (the CRC-32 covers the content length and the chunks)
//! ```
//!
//! A chunked entry names a large content by the chunks it is made of, in
//! order; each chunk is an entry of its own (plain or compressed), shared
//! by every content that has it (see `blobs::chunked`).
//!
//! Invariants: a body never exceeds its kind's bound (`max_body`), so a
//! damaged length is found before anything is read; a compressed entry is
//! written only when it is smaller than the plain one; every content is
//! checked against its sha256 after it is decoded (a chunked one, chunk
//! by chunk, and whole by a reader that reads it whole).

use std::io;

use sha2::{Digest, Sha256};

/// Largest content of a plain or compressed entry (and of a chunk).
pub const PACK_MAX: u64 = 128 * 1024;
/// Largest body of a chunked entry: 12 + 36 bytes per chunk, ~932,000
/// chunks, contents up to ~14 GiB at the average chunk size.
pub const CHUNKED_MAX: u64 = 32 << 20;
/// magic, sha256, body length.
pub const HEADER: u64 = 4 + 32 + 8;
/// What a scan reads of each entry: the header and, for the kinds that
/// have one, the content length that opens the body.
pub const PROBE: usize = HEADER as usize + 8;

pub const PLAIN: &[u8; 4] = b"SKB1";
pub const LZ4: &[u8; 4] = b"SKZ1";
pub const CHUNKED: &[u8; 4] = b"SKC1";
const CHUNK_REF: usize = 32 + 4;

pub type RawId = [u8; 32];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Codec {
    Plain,
    Lz4,
    Chunked,
}

impl Codec {
    fn of(magic: &[u8]) -> Option<Codec> {
        match magic {
            m if m == PLAIN => Some(Codec::Plain),
            m if m == LZ4 => Some(Codec::Lz4),
            m if m == CHUNKED => Some(Codec::Chunked),
            _ => None,
        }
    }

    /// The largest body an entry of this kind has.
    pub fn max_body(self) -> u64 {
        match self {
            Codec::Plain => PACK_MAX,
            // Written only when smaller than the content.
            Codec::Lz4 => 8 + PACK_MAX,
            Codec::Chunked => CHUNKED_MAX,
        }
    }
}

/// An entry's header, as read.
#[derive(Clone, Copy, Debug)]
pub struct Header {
    pub codec: Codec,
    pub id: RawId,
    /// The body's length in the pack.
    pub len: u64,
    /// The content's length (the body's, for a plain entry).
    pub size: u64,
}

impl Header {
    /// The header at the start of `probe` (at least [`HEADER`] bytes, and
    /// [`PROBE`] where the file has them), if it is well formed: a known
    /// magic, a body within its kind's bound, a content length that fits.
    pub fn parse(probe: &[u8]) -> Option<Header> {
        if probe.len() < HEADER as usize {
            return None;
        }
        let codec = Codec::of(&probe[..4])?;
        let mut id = [0u8; 32];
        id.copy_from_slice(&probe[4..36]);
        let len = u64::from_le_bytes(probe[36..44].try_into().expect("8 bytes"));
        if len > codec.max_body() {
            return None;
        }
        let size = match codec {
            Codec::Plain => len,
            Codec::Lz4 | Codec::Chunked => {
                if len < 8 || probe.len() < PROBE {
                    return None;
                }
                let size = u64::from_le_bytes(probe[44..52].try_into().expect("8 bytes"));
                let ok = match codec {
                    Codec::Lz4 => size <= PACK_MAX && size > len - 8,
                    // Each chunk holds 1 to PACK_MAX bytes: a size its
                    // chunks cannot hold is refused before anything is
                    // read (or allocated) for it.
                    _ => {
                        let body = len.saturating_sub(12);
                        let count = body / CHUNK_REF as u64;
                        len >= 12 + CHUNK_REF as u64
                            && body % CHUNK_REF as u64 == 0
                            && size > PACK_MAX
                            && size >= count
                            && size <= count * PACK_MAX
                    }
                };
                if !ok {
                    return None;
                }
                size
            }
        };
        Some(Header {
            codec,
            id,
            len,
            size,
        })
    }
}

/// The header bytes of `h`.
pub fn encode_header(h: &Header) -> Vec<u8> {
    let mut buf = Vec::with_capacity(HEADER as usize + h.len as usize);
    buf.extend_from_slice(match h.codec {
        Codec::Plain => PLAIN,
        Codec::Lz4 => LZ4,
        Codec::Chunked => CHUNKED,
    });
    buf.extend_from_slice(&h.id);
    buf.extend_from_slice(&h.len.to_le_bytes());
    buf
}

/// The entry (header and body) for `data`, whose sha256 is `id`:
/// compressed when that is smaller.
pub fn encode(id: &RawId, data: &[u8]) -> Vec<u8> {
    debug_assert!(data.len() as u64 <= PACK_MAX);
    let packed = lz4_flex::block::compress(data);
    let mut buf = Vec::with_capacity(HEADER as usize + 8 + data.len().min(packed.len()));
    if packed.len() + 8 < data.len() {
        buf.extend_from_slice(LZ4);
        buf.extend_from_slice(id);
        buf.extend_from_slice(&(8 + packed.len() as u64).to_le_bytes());
        buf.extend_from_slice(&(data.len() as u64).to_le_bytes());
        buf.extend_from_slice(&packed);
    } else {
        buf.extend_from_slice(PLAIN);
        buf.extend_from_slice(id);
        buf.extend_from_slice(&(data.len() as u64).to_le_bytes());
        buf.extend_from_slice(data);
    }
    buf
}

/// The entry naming the content `id` of `size` bytes by its `chunks`.
pub fn encode_chunked(id: &RawId, size: u64, chunks: &[(RawId, u32)]) -> Vec<u8> {
    let len = 12 + (CHUNK_REF * chunks.len()) as u64;
    let mut refs = Vec::with_capacity(CHUNK_REF * chunks.len());
    for (c, n) in chunks {
        refs.extend_from_slice(c);
        refs.extend_from_slice(&n.to_le_bytes());
    }
    let mut buf = Vec::with_capacity(HEADER as usize + len as usize);
    buf.extend_from_slice(CHUNKED);
    buf.extend_from_slice(id);
    buf.extend_from_slice(&len.to_le_bytes());
    buf.extend_from_slice(&size.to_le_bytes());
    buf.extend_from_slice(&list_crc(size, &refs).to_le_bytes());
    buf.extend_from_slice(&refs);
    buf
}

fn list_crc(size: u64, refs: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&size.to_le_bytes());
    h.update(refs);
    h.finalize()
}

fn invalid(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// The content of a plain or compressed entry's `body` (unchecked: the
/// caller hashes it).
pub fn decode(h: &Header, body: &[u8]) -> io::Result<Vec<u8>> {
    match h.codec {
        Codec::Plain => Ok(body.to_vec()),
        Codec::Lz4 => {
            let mut out = vec![0u8; h.size as usize];
            match lz4_flex::block::decompress_into(&body[8..], &mut out) {
                Ok(n) if n as u64 == h.size => Ok(out),
                Ok(n) => Err(invalid(format!(
                    "a compressed entry holds {n} bytes, not the {} its header says",
                    h.size
                ))),
                Err(e) => Err(invalid(format!("a compressed entry does not decode: {e}"))),
            }
        }
        Codec::Chunked => Err(invalid("a chunked entry has no content of its own".into())),
    }
}

/// The chunks a chunked entry's `body` names, with the offset each starts
/// at; their lengths must add up to the content's.
pub fn chunks(h: &Header, body: &[u8]) -> io::Result<Vec<(RawId, u64, u32)>> {
    if body.len() < 12 {
        return Err(invalid("a list of chunks cut short".into()));
    }
    let crc = u32::from_le_bytes(body[8..12].try_into().expect("4 bytes"));
    if crc != list_crc(h.size, &body[12..]) {
        return Err(invalid("a list of chunks that fails its check".into()));
    }
    let mut out = Vec::with_capacity((body.len() - 12) / CHUNK_REF);
    let mut at = 0u64;
    for r in body[12..].chunks_exact(CHUNK_REF) {
        let mut c = [0u8; 32];
        c.copy_from_slice(&r[..32]);
        let n = u32::from_le_bytes(r[32..].try_into().expect("4 bytes"));
        if n == 0 || n as u64 > PACK_MAX {
            return Err(invalid(format!("a chunk of {n} bytes")));
        }
        out.push((c, at, n));
        at += n as u64;
    }
    if at != h.size {
        return Err(invalid(format!(
            "chunks of {at} bytes for a content of {}",
            h.size
        )));
    }
    Ok(out)
}

/// Whether `body` is the entry `h` whole: a content that matches its hash,
/// or (chunked) a list of chunks that passes its CRC-32 and adds up to the
/// content's length (each chunk is checked where it is stored).
pub fn body_matches(h: &Header, body: &[u8]) -> bool {
    match h.codec {
        Codec::Chunked => chunks(h, body).is_ok(),
        _ => decode(h, body).is_ok_and(|d| Sha256::digest(&d).as_slice() == h.id),
    }
}

/// Whether `w` (4 bytes) starts an entry.
pub fn is_magic(w: &[u8]) -> bool {
    Codec::of(w).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(d: &[u8]) -> RawId {
        Sha256::digest(d).into()
    }

    fn header_of(buf: &[u8]) -> Header {
        Header::parse(&buf[..PROBE.min(buf.len())]).expect("well formed")
    }

    #[test]
    fn compressible_content_is_compressed_and_random_content_is_not() {
        let text = b"name: a skill\n".repeat(500);
        let e = encode(&id(&text), &text);
        let h = header_of(&e);
        assert_eq!((h.codec, h.size), (Codec::Lz4, text.len() as u64));
        assert!(e.len() < text.len() / 4, "{} bytes", e.len());
        assert_eq!(decode(&h, &e[HEADER as usize..]).unwrap(), text);
        assert!(body_matches(&h, &e[HEADER as usize..]));

        let mut noise = vec![0u8; 4096];
        let mut x = 0x9e3779b97f4a7c15u64;
        for b in &mut noise {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        let e = encode(&id(&noise), &noise);
        let h = header_of(&e);
        assert_eq!((h.codec, h.len), (Codec::Plain, 4096));
        assert_eq!(decode(&h, &e[HEADER as usize..]).unwrap(), noise);

        let empty = encode(&id(b""), b"");
        assert_eq!(header_of(&empty).codec, Codec::Plain);
    }

    #[test]
    fn damaged_headers_and_bodies_are_refused() {
        let text = b"abc".repeat(1000);
        let e = encode(&id(&text), &text);
        // A content length past the bound, or not larger than the body.
        for size in [PACK_MAX + 1, 3] {
            let mut bad = e.clone();
            bad[44..52].copy_from_slice(&size.to_le_bytes());
            assert!(Header::parse(&bad[..PROBE]).is_none(), "size {size}");
        }
        // A flipped byte in the compressed body.
        let mut bad = e.clone();
        let last = bad.len() - 1;
        bad[last] ^= 0x55;
        let h = header_of(&bad);
        assert!(!body_matches(&h, &bad[HEADER as usize..]));
        // An unknown magic.
        let mut bad = e.clone();
        bad[3] = b'9';
        assert!(Header::parse(&bad[..PROBE]).is_none());
    }

    #[test]
    fn a_chunked_entry_lists_its_chunks_in_order() {
        let a = vec![1u8; 100_000];
        let b = vec![2u8; 60_000];
        let whole = [a.clone(), b.clone()].concat();
        let list = [(id(&a), a.len() as u32), (id(&b), b.len() as u32)];
        let e = encode_chunked(&id(&whole), whole.len() as u64, &list);
        let h = header_of(&e);
        assert_eq!((h.codec, h.size), (Codec::Chunked, 160_000));
        let got = chunks(&h, &e[HEADER as usize..]).unwrap();
        assert_eq!(got, vec![(id(&a), 0, 100_000), (id(&b), 100_000, 60_000)]);
        // Lengths that do not add up to the content's.
        let short = encode_chunked(&id(&whole), 170_000, &list);
        let h = header_of(&short);
        assert!(!body_matches(&h, &short[HEADER as usize..]));
        // A chunk's id damaged: the list fails its check.
        let mut bad = e.clone();
        bad[HEADER as usize + 12 + 5] ^= 1;
        let h = header_of(&bad);
        assert!(!body_matches(&h, &bad[HEADER as usize..]));
        // A size no list of this length can hold is refused as a header.
        let mut bad = e.clone();
        bad[44..52].copy_from_slice(&(3 * PACK_MAX).to_le_bytes());
        assert!(Header::parse(&bad[..PROBE]).is_none());
        bad[44..52].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(Header::parse(&bad[..PROBE]).is_none());
    }
}
