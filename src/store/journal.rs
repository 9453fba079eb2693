//! A journal entry: the points one ingest batch brought for one run, every series together,
//! written as one key so a batch costs one write however many series it touches. Compaction
//! (`points.rs`) later moves them into blocks.
//!
//! Layout: a format byte; the metric names (count, then each as length and UTF-8 bytes); the
//! points (count, then each as metric index, rank and step as varints and the value as 8
//! little-endian bytes).
use super::block::{put_varint, Malformed, Reader};
use super::Point;
use std::borrow::Cow;

const FORMAT: u8 = 1;

/// One run's points from one batch, in arrival order.
pub fn encode<'a>(points: impl Iterator<Item = (&'a str, &'a Point)> + Clone) -> Vec<u8> {
    let mut names: Vec<&str> = Vec::new();
    let mut index = Vec::new();
    for (metric, _) in points.clone() {
        // Batches carry a handful of metrics: a linear search beats hashing every point.
        let i = names.iter().position(|n| *n == metric).unwrap_or_else(|| {
            names.push(metric);
            names.len() - 1
        });
        index.push(i as u64);
    }
    let mut out = Vec::with_capacity(16 + index.len() * 14);
    out.push(FORMAT);
    put_varint(&mut out, names.len() as u64);
    for n in &names {
        put_varint(&mut out, n.len() as u64);
        out.extend_from_slice(n.as_bytes());
    }
    put_varint(&mut out, index.len() as u64);
    for ((_, p), i) in points.zip(index) {
        put_varint(&mut out, i);
        put_varint(&mut out, u64::from(p.rank));
        put_varint(&mut out, p.step);
        out.extend_from_slice(&p.value.to_le_bytes());
    }
    out
}

/// The entry's points with their metric names, in the order they were written.
pub fn decode(bytes: &[u8]) -> Result<Vec<(Cow<'static, str>, Point)>, Malformed> {
    let mut r = Reader { bytes, at: 0 };
    let format = r.byte()?;
    if format != FORMAT {
        return Err(Malformed(format!("journal entry format {format}, this flightdeck reads format {FORMAT}")));
    }
    let n_names = r.varint()?;
    if n_names > bytes.len() as u64 {
        return Err(Malformed(format!("journal entry says {n_names} metric names in {} bytes", bytes.len())));
    }
    let mut names = Vec::with_capacity(n_names as usize);
    for _ in 0..n_names {
        let len = r.varint()? as usize;
        let raw = r.take(len)?;
        let name = std::str::from_utf8(raw).map_err(|_| Malformed("a metric name is not UTF-8".into()))?;
        names.push(name.to_string());
    }
    let n_points = r.varint()?;
    if n_points > bytes.len() as u64 {
        return Err(Malformed(format!("journal entry says {n_points} points in {} bytes", bytes.len())));
    }
    let mut out = Vec::with_capacity(n_points as usize);
    for _ in 0..n_points {
        let i = r.varint()? as usize;
        let name = names.get(i).ok_or_else(|| Malformed(format!("metric index {i} of {} names", names.len())))?;
        let rank = u32::try_from(r.varint()?).map_err(|_| Malformed("a rank beyond u32".into()))?;
        let step = r.varint()?;
        let value = f64::from_le_bytes(r.take(8)?.try_into().map_err(|_| Malformed("short value".into()))?);
        out.push((Cow::Owned(name.clone()), Point { step, rank, value }));
    }
    if r.at != bytes.len() {
        return Err(Malformed(format!("{} bytes after the journal entry's {n_points} points", bytes.len() - r.at)));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_round_trips_names_order_and_bits() {
        let points = [
            ("loss", Point { step: 1, rank: 0, value: 2.5 }),
            ("lr", Point { step: 1, rank: 0, value: 3e-4 }),
            ("loss", Point { step: 1, rank: 1023, value: f64::NAN }),
            ("tokens/s", Point { step: u64::MAX, rank: u32::MAX, value: -0.0 }),
        ];
        let bytes = encode(points.iter().map(|(m, p)| (*m, p)));
        let back = decode(&bytes).unwrap();
        assert_eq!(back.len(), points.len());
        for ((m, p), (bm, bp)) in points.iter().zip(&back) {
            assert_eq!((*m, p.step, p.rank, p.value.to_bits()), (bm.as_ref(), bp.step, bp.rank, bp.value.to_bits()));
        }
    }

    #[test]
    fn a_damaged_entry_is_an_error() {
        let p = Point { step: 7, rank: 2, value: 1.0 };
        let good = encode([("loss", &p), ("lr", &p)].into_iter());
        for cut in 0..good.len() {
            assert!(decode(&good[..cut]).is_err(), "cut at {cut}");
        }
        let mut bad_index = encode([("loss", &p)].into_iter());
        let at = 1 + 1 + 1 + 4 + 1; // format, name count, name length, "loss", point count
        bad_index[at] = 5;
        assert!(decode(&bad_index).unwrap_err().0.contains("metric index 5"));
    }
}
