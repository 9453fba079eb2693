//! TensorBoard event files read in Rust: the record framing, its CRCs, and the few protobuf fields that hold scalars
//! (writing them is `write`, for `flightdeck export`).
//!
//! A file is a sequence of records: a u64 little-endian length, the masked CRC-32C of those 8
//! bytes, the data, and the masked CRC-32C of the data. Each record's data is an `Event`
//! protobuf (`wall_time` = 1, `step` = 2, `summary` = 5); a `Summary` holds `Value`s (`tag` = 1,
//! `simple_value` = 2, `tensor` = 8, read from its `float_val`, `double_val`, `int_val`,
//! `int64_val` or `tensor_content`, the form newer writers use). Pure: `read_events` takes bytes.
//! A half-written last record (a writer still running, or killed) ends the file quietly and is
//! reported; a record whose CRC is wrong is counted and reading stops there, since what follows
//! cannot be trusted to be framed.
use std::path::Path;

pub mod write;

/// One scalar of one step.
#[derive(Clone, Debug, PartialEq)]
pub struct Scalar {
    pub tag: String,
    pub step: i64,
    pub wall_time_s: f64,
    pub value: f64,
}

/// What one event file held.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EventFile {
    pub scalars: Vec<Scalar>,
    /// Whole records read.
    pub records: u64,
    /// The file ended inside a record.
    pub truncated_tail: bool,
    /// A record failed its CRC (reading stopped there); `bad_at` is its offset.
    pub bad_crc: u64,
    pub bad_at: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum TbError {
    #[error("cannot read {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error(
        "{path}: byte {offset}: the record's data is not an Event protobuf ({why}); a TensorBoard event file \
         holds Event records (tfevents)"
    )]
    BadEvent { path: String, offset: u64, why: String },
}

/// A record longer than this is not a scalar summary's: the file is not an event file, or is damaged.
const MAX_RECORD_BYTES: u64 = 64 << 20;

pub fn read_file(path: &Path) -> Result<EventFile, TbError> {
    let shown = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|source| TbError::Io { path: shown.clone(), source })?;
    read_events(&bytes).map_err(|(offset, why)| TbError::BadEvent { path: shown, offset, why })
}

/// Reads every record; `Err((offset, why))` for a record whose CRC holds but whose data is not
/// an Event.
pub fn read_events(bytes: &[u8]) -> Result<EventFile, (u64, String)> {
    let mut out = EventFile::default();
    let mut at = 0usize;
    while at < bytes.len() {
        let Some(header) = bytes.get(at..at + 12) else {
            out.truncated_tail = true;
            break;
        };
        let len_bytes: [u8; 8] = header[..8].try_into().unwrap_or_default();
        let len = u64::from_le_bytes(len_bytes);
        if masked_crc(&header[..8]) != u32::from_le_bytes(header[8..12].try_into().unwrap_or_default()) {
            (out.bad_crc, out.bad_at) = (out.bad_crc + 1, Some(at as u64));
            break;
        }
        if len > MAX_RECORD_BYTES {
            (out.bad_crc, out.bad_at) = (out.bad_crc + 1, Some(at as u64));
            break;
        }
        let start = at + 12;
        let end = start + len as usize;
        let Some(data) = bytes.get(start..end) else {
            out.truncated_tail = true;
            break;
        };
        let Some(crc) = bytes.get(end..end + 4) else {
            out.truncated_tail = true;
            break;
        };
        if masked_crc(data) != u32::from_le_bytes(crc.try_into().unwrap_or_default()) {
            (out.bad_crc, out.bad_at) = (out.bad_crc + 1, Some(at as u64));
            break;
        }
        event(data, &mut out.scalars).map_err(|why| (at as u64, why))?;
        out.records += 1;
        at = end + 4;
    }
    Ok(out)
}

/// TensorFlow's masked CRC-32C.
pub fn masked_crc(data: &[u8]) -> u32 {
    let crc = crc32c(data);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// CRC-32C (Castagnoli), table-driven.
pub fn crc32c(data: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut t = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 != 0 { 0x82f6_3b78 ^ (c >> 1) } else { c >> 1 };
                k += 1;
            }
            t[i] = c;
            i += 1;
        }
        t
    };
    let mut crc = !0u32;
    for &b in data {
        crc = TABLE[((crc ^ b as u32) & 0xff) as usize] ^ (crc >> 8);
    }
    !crc
}

/// A protobuf field: its number and its value by wire type.
enum Field<'a> {
    Varint(u64),
    Fixed64(u64),
    Bytes(&'a [u8]),
    Fixed32(u32),
}

/// Iterates over a message's fields; an error says what is malformed.
fn fields(mut b: &[u8]) -> impl Iterator<Item = Result<(u64, Field<'_>), String>> {
    std::iter::from_fn(move || {
        if b.is_empty() {
            return None;
        }
        Some((|| {
            let key = varint(&mut b)?;
            let value = match key & 7 {
                0 => Field::Varint(varint(&mut b)?),
                1 => Field::Fixed64(u64::from_le_bytes(take(&mut b, 8)?.try_into().map_err(|_| "short fixed64")?)),
                2 => {
                    let n = varint(&mut b)?;
                    let n = usize::try_from(n).map_err(|_| "length too large")?;
                    Field::Bytes(take(&mut b, n)?)
                }
                5 => Field::Fixed32(u32::from_le_bytes(take(&mut b, 4)?.try_into().map_err(|_| "short fixed32")?)),
                w => return Err(format!("wire type {w} is not one protobuf uses here")),
            };
            Ok((key >> 3, value))
        })())
        // After a malformed field nothing further can be framed: stop.
        .inspect(|r| {
            if r.is_err() {
                b = &[];
            }
        })
    })
}

fn take<'a>(b: &mut &'a [u8], n: usize) -> Result<&'a [u8], String> {
    if b.len() < n {
        return Err(format!("a field runs past the message's end ({n} bytes wanted, {} left)", b.len()));
    }
    let (head, rest) = b.split_at(n);
    *b = rest;
    Ok(head)
}

fn varint(b: &mut &[u8]) -> Result<u64, String> {
    let mut v = 0u64;
    for i in 0..10 {
        let Some((&byte, rest)) = b.split_first() else { return Err("a varint runs past the end".into()) };
        *b = rest;
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err("a varint longer than 10 bytes".into())
}

/// One Event: its step and wall time, and the scalars of its summary.
fn event(data: &[u8], out: &mut Vec<Scalar>) -> Result<(), String> {
    let (mut step, mut wall_time_s, mut summary) = (0i64, 0f64, None);
    for f in fields(data) {
        match f? {
            (1, Field::Fixed64(v)) => wall_time_s = f64::from_bits(v),
            (2, Field::Varint(v)) => step = v as i64,
            (5, Field::Bytes(b)) => summary = Some(b),
            _ => {}
        }
    }
    let Some(summary) = summary else { return Ok(()) };
    for f in fields(summary) {
        if let (1, Field::Bytes(value)) = f? {
            if let Some((tag, v)) = summary_value(value)? {
                out.push(Scalar { tag, step, wall_time_s, value: v });
            }
        }
    }
    Ok(())
}

/// A Summary.Value: its tag and scalar, if it holds one (images and histograms do not).
fn summary_value(b: &[u8]) -> Result<Option<(String, f64)>, String> {
    let (mut tag, mut value) = (None, None);
    for f in fields(b) {
        match f? {
            (1, Field::Bytes(t)) => tag = Some(String::from_utf8_lossy(t).into_owned()),
            (2, Field::Fixed32(v)) => value = Some(f64::from(f32::from_bits(v))),
            (8, Field::Bytes(t)) => value = value.or(tensor_scalar(t)?),
            _ => {}
        }
    }
    Ok(tag.zip(value))
}

/// A rank-0 TensorProto's one number.
fn tensor_scalar(b: &[u8]) -> Result<Option<f64>, String> {
    const DT_FLOAT: u64 = 1;
    const DT_DOUBLE: u64 = 2;
    const DT_INT32: u64 = 3;
    const DT_INT64: u64 = 9;
    let (mut dtype, mut content, mut value) = (0, None, None);
    for f in fields(b) {
        match f? {
            (1, Field::Varint(d)) => dtype = d,
            (4, Field::Bytes(c)) => content = Some(c),
            (5, Field::Fixed32(v)) => value = Some(f64::from(f32::from_bits(v))),
            (5, Field::Bytes(p)) if p.len() >= 4 => {
                value = Some(f64::from(f32::from_le_bytes([p[0], p[1], p[2], p[3]])))
            }
            (6, Field::Fixed64(v)) => value = Some(f64::from_bits(v)),
            (6, Field::Bytes(p)) if p.len() >= 8 => value = p[..8].try_into().ok().map(f64::from_le_bytes),
            (7 | 10, Field::Varint(v)) => value = Some(v as i64 as f64),
            (7 | 10, Field::Bytes(mut p)) if !p.is_empty() => value = Some(varint(&mut p)? as i64 as f64),
            _ => {}
        }
    }
    if value.is_some() {
        return Ok(value);
    }
    let Some(c) = content else { return Ok(None) };
    Ok(match dtype {
        DT_FLOAT if c.len() >= 4 => Some(f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]]))),
        DT_DOUBLE if c.len() >= 8 => c[..8].try_into().ok().map(f64::from_le_bytes),
        DT_INT32 if c.len() >= 4 => Some(f64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]]))),
        DT_INT64 if c.len() >= 8 => c[..8].try_into().ok().map(|a| i64::from_le_bytes(a) as f64),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::write::{bytes as bytes_field, key, record, varint as enc_varint};
    use super::*;

    fn scalar_event(tag: &str, step: i64, value: f32) -> Vec<u8> {
        let v = [bytes_field(1, tag.as_bytes()), key(2, 5), value.to_le_bytes().to_vec(), key(7, 0), enc_varint(3)]
            .concat();
        let summary = bytes_field(1, &v);
        [key(1, 1), 1.5f64.to_le_bytes().to_vec(), key(2, 0), enc_varint(step as u64), bytes_field(5, &summary)]
            .concat()
    }

    #[test]
    fn crc32c_matches_the_standard_check_value() {
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
    }

    #[test]
    fn records_give_their_scalars_and_unknown_fields_are_skipped() {
        let file = [record(b"\x1a\x0dbrain.Event:2"), record(&scalar_event("train/loss", 7, 0.25))].concat();
        let got = read_events(&file).expect("reads");
        assert_eq!(got.records, 2);
        assert_eq!(got.scalars, vec![Scalar { tag: "train/loss".into(), step: 7, wall_time_s: 1.5, value: 0.25 }]);
        assert!(!got.truncated_tail);
    }

    #[test]
    fn a_half_written_tail_is_tolerated_and_a_bad_crc_stops_the_reading() {
        let whole = record(&scalar_event("a", 1, 1.0));
        let file = [whole.clone(), whole[..whole.len() - 3].to_vec()].concat();
        let got = read_events(&file).expect("reads");
        assert_eq!((got.records, got.truncated_tail, got.scalars.len()), (1, true, 1));
        let mut bad = whole.clone();
        let n = bad.len();
        bad[n - 6] ^= 0xff;
        let got = read_events(&[whole.clone(), bad].concat()).expect("reads");
        assert_eq!((got.records, got.bad_crc, got.bad_at), (1, 1, Some(whole.len() as u64)));
    }

    #[test]
    fn a_tensor_scalar_of_the_new_style_is_read() {
        // TensorProto { dtype: DT_FLOAT, tensor_shape: {}, float_val: [2.5] }
        let tensor = [key(1, 0), enc_varint(1), bytes_field(2, &[]), key(5, 5), 2.5f32.to_le_bytes().to_vec()].concat();
        let v = [bytes_field(1, b"x"), bytes_field(8, &tensor)].concat();
        let e = [key(2, 0), enc_varint(4), bytes_field(5, &bytes_field(1, &v))].concat();
        let got = read_events(&record(&e)).expect("reads");
        assert_eq!(got.scalars[0].value, 2.5);
        let content = [key(1, 0), enc_varint(2), bytes_field(4, &7.25f64.to_le_bytes())].concat();
        assert_eq!(tensor_scalar(&content), Ok(Some(7.25)));
    }

    proptest::proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..2048)) {
            let _ = read_events(&bytes);
            // And random bytes framed as a record whose CRCs hold.
            let _ = read_events(&record(&bytes));
        }
    }
}
