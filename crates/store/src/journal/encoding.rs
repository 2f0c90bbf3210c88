//! One record as one line: a JSON object whose last member is
//! `"crc":"xxxxxxxx"`, the CRC-32 of the line with that member removed,
//! then a newline.
//!
//! Invariants: `decode` takes exactly what `encode` writes (the checksum
//! last, in lowercase hex: any other byte is a changed byte); the CRC is
//! `crc32fast`'s CRC-32 (IEEE), the value of the bitwise form the journal
//! was first written with, so every journal ever written still verifies.
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
    let got = crc32_extend(crc32(head), b"}");
    if got != want {
        return Err(format!(
            "checksum mismatch (stored {want:08x}, computed {got:08x})"
        ));
    }
    // The whole line is the record: a record has no `crc` member of its
    // own, so the checksum's is skipped as an unknown one.
    serde_json::from_slice(line).map_err(|e| format!("not a valid record: {e}"))
}

/// CRC-32 (IEEE 802.3: zlib, PNG, gzip) of `data`, by `crc32fast`
/// (SIMD where the CPU has it); the same value the bitwise form the
/// journal was first written with gives, so every journal ever written
/// still verifies (tested below against that form).
pub fn crc32(data: &[u8]) -> u32 {
    crc32fast::hash(data)
}

/// The CRC-32 of `a` followed by `data`, from `crc32(a)`.
pub fn crc32_extend(crc: u32, data: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new_with_initial(crc);
    h.update(data);
    h.finalize()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::fixtures::rec;

    /// The reflected CRC-32 polynomial of IEEE 802.3.
    const CRC32_POLY: u32 = 0xEDB8_8320;

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
        // Extending the CRC of a prefix gives the CRC of the whole.
        let data: Vec<u8> = (0..300u32).map(|i| (i * 13 + 1) as u8).collect();
        for cut in [0, 1, 7, 8, 9, 64, 299, 300] {
            assert_eq!(
                crc32_extend(crc32(&data[..cut]), &data[cut..]),
                crc32(&data),
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn crc32_agrees_with_the_bitwise_form() {
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
