//! A block: consecutive points of one series (run, metric, rank), sorted by step, packed.
//!
//! Layout: a format byte, the point count and the first step as varints, then per point the
//! step's distance from the previous one (varint; 0 for the first) and the value XORed with the
//! previous value's bits (the first against 0), written as one control byte (leading zero bytes
//! in the high nibble, trailing zero bytes in the low one) and the bytes between. A slowly
//! moving metric (lr, a smooth loss) keeps its sign and exponent, so most points take 7-9
//! bytes; a constant takes 2. Every bit of the f64 survives, NaN payloads and -0.0 included.
use super::Point;

const FORMAT: u8 = 1;

/// Why a block could not be read (the store wraps it with the tree and key).
#[derive(Debug, PartialEq)]
pub struct Malformed(pub String);

/// The steps and values of one series' block, sorted by step with no step twice.
pub fn encode(points: &[(u64, f64)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + points.len() * 9);
    out.push(FORMAT);
    put_varint(&mut out, points.len() as u64);
    let first = points.first().map(|p| p.0).unwrap_or(0);
    put_varint(&mut out, first);
    let (mut prev_step, mut prev_bits) = (first, 0u64);
    for &(step, value) in points {
        put_varint(&mut out, step.wrapping_sub(prev_step));
        let bits = value.to_bits();
        put_xor(&mut out, bits ^ prev_bits);
        (prev_step, prev_bits) = (step, bits);
    }
    out
}

/// Appends a block's points, as `Point`s of `rank`, to `out`.
pub fn decode_into(bytes: &[u8], rank: u32, out: &mut Vec<Point>) -> Result<(), Malformed> {
    let mut r = Reader { bytes, at: 0 };
    let format = r.byte()?;
    if format != FORMAT {
        return Err(Malformed(format!("block format {format}, this flightdeck reads format {FORMAT}")));
    }
    let count = r.varint()?;
    // Each point takes at least two bytes: a count beyond that is a corrupt header.
    if count > bytes.len() as u64 {
        return Err(Malformed(format!("block says {count} points in {} bytes", bytes.len())));
    }
    let (mut step, mut bits) = (r.varint()?, 0u64);
    out.reserve(count as usize);
    for _ in 0..count {
        step = step.wrapping_add(r.varint()?);
        bits ^= r.xor()?;
        out.push(Point { step, rank, value: f64::from_bits(bits) });
    }
    if r.at != bytes.len() {
        return Err(Malformed(format!("{} bytes after the block's {count} points", bytes.len() - r.at)));
    }
    Ok(())
}

/// The points of one block, for a caller that works in (step, value) pairs.
pub fn decode(bytes: &[u8]) -> Result<Vec<(u64, f64)>, Malformed> {
    let mut points = Vec::new();
    decode_into(bytes, 0, &mut points)?;
    Ok(points.into_iter().map(|p| (p.step, p.value)).collect())
}

pub(super) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_xor(out: &mut Vec<u8>, x: u64) {
    let lead = (x.leading_zeros() / 8) as u8;
    if lead == 8 {
        out.push(0x80);
        return;
    }
    let trail = (x.trailing_zeros() / 8) as u8;
    out.push(lead << 4 | trail);
    let be = x.to_be_bytes();
    out.extend_from_slice(&be[lead as usize..8 - trail as usize]);
}

/// Reads bytes, varints and XORed values off a buffer, failing with where it ran out.
pub(super) struct Reader<'a> {
    pub bytes: &'a [u8],
    pub at: usize,
}

impl<'a> Reader<'a> {
    pub fn byte(&mut self) -> Result<u8, Malformed> {
        let b = *self.bytes.get(self.at).ok_or_else(|| Malformed(format!("ends at byte {}", self.at)))?;
        self.at += 1;
        Ok(b)
    }

    pub fn take(&mut self, n: usize) -> Result<&'a [u8], Malformed> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or_else(|| Malformed(format!("ends inside a field of {n} bytes at byte {}", self.at)))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    pub fn varint(&mut self) -> Result<u64, Malformed> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(Malformed(format!("a varint longer than 10 bytes ending at byte {}", self.at)))
    }

    pub fn xor(&mut self) -> Result<u64, Malformed> {
        let ctrl = self.byte()?;
        let (lead, trail) = ((ctrl >> 4) as usize, (ctrl & 0x0f) as usize);
        if lead == 8 && trail == 0 {
            return Ok(0);
        }
        if lead + trail >= 8 {
            return Err(Malformed(format!("value control byte {ctrl:#04x} at byte {}", self.at - 1)));
        }
        let n = 8 - lead - trail;
        let middle = self.take(n)?;
        let mut be = [0u8; 8];
        be[lead..8 - trail].copy_from_slice(middle);
        Ok(u64::from_be_bytes(be))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bit_of_every_value_round_trips() {
        let values = [
            0.0,
            -0.0,
            1.0,
            f64::NAN,
            f64::from_bits(0x7ff8_dead_beef_0001),
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::MIN_POSITIVE / 3.0,
            f64::MAX,
            2.5,
            2.5,
            2.500_000_000_000_001,
            -1e300,
        ];
        let points: Vec<(u64, f64)> =
            values.iter().enumerate().map(|(i, &v)| (i as u64 * 3 + u64::from(i == 5) * (1 << 40), v)).collect();
        let back = decode(&encode(&points)).unwrap();
        assert_eq!(back.len(), points.len());
        for (a, b) in points.iter().zip(&back) {
            assert_eq!((a.0, a.1.to_bits()), (b.0, b.1.to_bits()));
        }
    }

    #[test]
    fn steps_far_apart_and_the_largest_step_round_trip() {
        let points = vec![(0, 1.0), (1, 1.0), (u64::MAX / 2, 3.0), (u64::MAX, 4.0)];
        assert_eq!(decode(&encode(&points)).unwrap(), points);
        assert_eq!(decode(&encode(&[])).unwrap(), vec![]);
    }

    #[test]
    fn a_smooth_series_packs_below_ten_bytes_a_point() {
        let points: Vec<(u64, f64)> = (1..=1000u64).map(|s| (s, 3e-3 * (1.0 - s as f64 / 20_000.0))).collect();
        let bytes = encode(&points);
        assert!(bytes.len() < 10 * points.len(), "{} bytes for {} points", bytes.len(), points.len());
    }

    #[test]
    fn damage_is_an_error_not_a_panic() {
        let good = encode(&[(5, 1.5), (6, -2.25), (9, 1e-9)]);
        for cut in 0..good.len() {
            assert!(decode(&good[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = good.clone();
        longer.push(0);
        assert!(decode(&longer).unwrap_err().0.contains("after the block"));
        let mut wrong_format = good.clone();
        wrong_format[0] = 9;
        assert!(decode(&wrong_format).unwrap_err().0.contains("format 9"));
        let mut huge_count = vec![FORMAT];
        put_varint(&mut huge_count, u64::MAX);
        assert!(decode(&huge_count).is_err());
        assert!(decode(&[FORMAT, 1, 0, 0, 0x99]).is_err(), "lead + trail over 8 bytes");
    }
}
