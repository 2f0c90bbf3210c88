//! One record as one line: a JSON object whose last member is
//! `"crc":"xxxxxxxx"`, the CRC-32 of the line with that member removed,
//! then a newline.
//!
//! Invariants: `decode` takes exactly what `encode` writes (the checksum
//! last, in lowercase hex: any other byte is a changed byte); the CRC is
//! table-driven (slicing-by-8) and gives the value of the bitwise form the journal was
//! first written with, so every journal ever written still verifies.
//!
//! Locks: none; pure functions.

use super::record::Record;

const CRC_SUFFIX_LEN: usize = r#","crc":"00000000"}"#.len();

/// Encodes a record as one line, checksum and newline included.
pub fn encode(rec: &Record) -> Vec<u8> {
    let mut body = serde_json::to_vec(rec).expect("records always serialize");
    let crc = crc32(&body);
    body.pop(); // the closing brace
    body.extend_from_slice(format!(r#","crc":"{crc:08x}"}}"#).as_bytes());
    body.push(b'\n');
    body
}

/// Decodes one line (without its newline).
pub fn decode(line: &[u8]) -> Result<Record, String> {
    if line.len() < CRC_SUFFIX_LEN + 2 {
        return Err("too short to be a record".into());
    }
    let (head, suffix) = line.split_at(line.len() - CRC_SUFFIX_LEN);
    if !suffix.starts_with(br#","crc":""#) || !suffix.ends_with(br#""}"#) {
        return Err("no checksum at the end of the line".into());
    }
    // Exactly as `encode` writes it: lowercase (an uppercase digit is a
    // changed byte, whatever it parses to).
    let hex = &suffix[8..16];
    if !hex.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return Err("checksum is not lowercase hex".into());
    }
    let want = std::str::from_utf8(hex)
        .ok()
        .and_then(|h| u32::from_str_radix(h, 16).ok())
        .ok_or("checksum is not hex")?;
    // The checksum covers the line with its own member cut out: the head
    // and the closing brace, summed in place (no copy of the line).
    let got = !crc32_update(crc32_update(!0, head), b"}");
    if got != want {
        return Err(format!(
            "checksum mismatch (stored {want:08x}, computed {got:08x})"
        ));
    }
    // The whole line is the record: a record has no `crc` member of its
    // own, so the checksum's is skipped as an unknown one.
    serde_json::from_slice(line).map_err(|e| format!("not a valid record: {e}"))
}

/// The reflected CRC-32 polynomial of IEEE 802.3 (zlib, PNG, gzip).
const CRC32_POLY: u32 = 0xEDB8_8320;

/// The CRC tables of slicing-by-8, computed at compile time: `T[0]` is
/// the CRC of every byte value, `T[k]` of that byte followed by `k` zero
/// bytes, so eight bytes are folded in with eight lookups and no
/// dependency between them.
const CRC32_TABLES: [[u32; 256]; 8] = crc32_tables();

const fn crc32_tables() -> [[u32; 256]; 8] {
    let mut t = [[0u32; 256]; 8];
    let mut i = 0;
    while i < 256 {
        let mut crc = i as u32;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ CRC32_POLY
            } else {
                crc >> 1
            };
            bit += 1;
        }
        t[0][i] = crc;
        i += 1;
    }
    let mut k = 1;
    while k < 8 {
        let mut i = 0;
        while i < 256 {
            let prev = t[k - 1][i];
            t[k][i] = (prev >> 8) ^ t[0][(prev & 0xff) as usize];
            i += 1;
        }
        k += 1;
    }
    t
}

/// CRC-32 (IEEE 802.3) of `data`; the same value the bitwise form gives,
/// so every journal ever written still verifies.
pub fn crc32(data: &[u8]) -> u32 {
    !crc32_update(!0, data)
}

/// The CRC-32 of `a` followed by `data`, from `crc32(a)`.
pub fn crc32_extend(crc: u32, data: &[u8]) -> u32 {
    !crc32_update(!crc, data)
}

/// Folds `data` into a running CRC register (pre- and post-inverted by
/// the caller): slicing-by-8, then the tail a byte at a time.
fn crc32_update(mut crc: u32, data: &[u8]) -> u32 {
    let t = &CRC32_TABLES;
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        let lo = crc ^ u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        crc = t[7][(lo & 0xff) as usize]
            ^ t[6][((lo >> 8) & 0xff) as usize]
            ^ t[5][((lo >> 16) & 0xff) as usize]
            ^ t[4][(lo >> 24) as usize]
            ^ t[3][c[4] as usize]
            ^ t[2][c[5] as usize]
            ^ t[1][c[6] as usize]
            ^ t[0][c[7] as usize];
    }
    for &b in chunks.remainder() {
        crc = (crc >> 8) ^ t[0][((crc ^ b as u32) & 0xff) as usize];
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::journal::fixtures::rec;

    /// The bitwise CRC-32 the journal was first written with.
    fn crc32_bitwise(data: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &b in data {
            crc ^= b as u32;
            for _ in 0..8 {
                crc = (crc >> 1) ^ (CRC32_POLY & (!(crc & 1)).wrapping_add(1));
            }
        }
        !crc
    }

    #[test]
    fn crc32_matches_reference() {
        // The check value of CRC-32/ISO-HDLC, and of the empty input.
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
        // Table entries known from zlib's table.
        assert_eq!(
            (CRC32_TABLES[0][0], CRC32_TABLES[0][1], CRC32_TABLES[0][255]),
            (0, 0x7707_3096, 0x2D02_EF8D)
        );
    }

    #[test]
    fn crc32_table_agrees_with_the_bitwise_form() {
        // Every single byte, every length up to 300 of a byte pattern, and
        // a whole encoded record (what existing journals carry).
        for b in 0..=255u8 {
            assert_eq!(crc32(&[b]), crc32_bitwise(&[b]), "byte {b}");
        }
        let data: Vec<u8> = (0..300u32).map(|i| (i * 31 + 7) as u8).collect();
        for n in 0..=data.len() {
            assert_eq!(crc32(&data[..n]), crc32_bitwise(&data[..n]), "length {n}");
        }
        let line = encode(&rec(7));
        assert_eq!(crc32(&line), crc32_bitwise(&line));
    }

    #[test]
    fn encode_decode_round_trip() {
        let r = rec(7);
        let line = encode(&r);
        assert_eq!(*line.last().unwrap(), b'\n');
        assert_eq!(decode(&line[..line.len() - 1]).unwrap(), r);
        let mut bad = line.clone();
        bad[10] ^= 1;
        assert!(decode(&bad[..bad.len() - 1]).is_err());
    }
}
