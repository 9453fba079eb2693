//! TensorBoard event files written in Rust: the records `flightdeck export` makes, scalars as
//! `simple_value` (what `SummaryWriter.add_scalar` writes, so every reader knows them) and text
//! as the text plugin's string tensors.
//!
//! An `Event` is `wall_time` (1, double), `step` (2, int64), `file_version` (3, string) or
//! `summary` (5); a `Summary.Value` is `tag` (1), `simple_value` (2, float), `metadata` (9:
//! `plugin_data` 1 { `plugin_name` 1 }) and `tensor` (8: `dtype` 1, `tensor_shape` 2,
//! `string_val` 8). Each record is framed by `record` with the masked CRC-32C of its length and
//! of its data, as the reader in `super` checks.
use super::masked_crc;

/// The first record of every event file: TensorBoard reads the file's version from it.
pub fn file_version(wall_time_s: f64) -> Vec<u8> {
    record(&[double(1, wall_time_s), bytes(3, b"brain.Event:2")].concat())
}

/// A scalar at `step`. TensorBoard keeps scalars as 32-bit floats, so `value` is one.
pub fn scalar(wall_time_s: f64, step: u64, tag: &str, value: f32) -> Vec<u8> {
    let value = [bytes(1, tag.as_bytes()), key(2, 5), value.to_le_bytes().to_vec()].concat();
    event(wall_time_s, step, &value)
}

/// A text summary at `step`, shown by TensorBoard's text plugin (markdown).
pub fn text(wall_time_s: f64, step: u64, tag: &str, body: &str) -> Vec<u8> {
    const DT_STRING: u64 = 7;
    let plugin = bytes(1, &bytes(1, b"text"));
    let tensor = [key(1, 0), varint(DT_STRING), bytes(2, &[]), bytes(8, body.as_bytes())].concat();
    let value = [bytes(1, tag.as_bytes()), bytes(9, &plugin), bytes(8, &tensor)].concat();
    event(wall_time_s, step, &value)
}

/// An Event holding a Summary of one Value.
fn event(wall_time_s: f64, step: u64, value: &[u8]) -> Vec<u8> {
    let summary = bytes(1, value);
    record(&[double(1, wall_time_s), key(2, 0), varint(step), bytes(5, &summary)].concat())
}

/// One record: length, its masked CRC, the data, the data's masked CRC.
pub fn record(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    [len.as_slice(), &masked_crc(&len).to_le_bytes(), data, &masked_crc(data).to_le_bytes()].concat()
}

/// A protobuf field's key (the reader's tests build odd messages with these too).
pub(super) fn key(field: u64, wire: u64) -> Vec<u8> {
    varint((field << 3) | wire)
}

pub(super) fn varint(mut v: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(10);
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(byte);
            return out;
        }
        out.push(byte | 0x80);
    }
}

pub(super) fn bytes(field: u64, b: &[u8]) -> Vec<u8> {
    [key(field, 2), varint(b.len() as u64), b.to_vec()].concat()
}

fn double(field: u64, v: f64) -> Vec<u8> {
    [key(field, 1), v.to_le_bytes().to_vec()].concat()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensorboard::{read_events, Scalar};

    #[test]
    fn written_scalars_read_back_exactly_and_text_is_skipped_by_the_scalar_reader() {
        let file = [
            file_version(1.0e9),
            scalar(1.0e9 + 0.25, 7, "loss", 2.5),
            text(1.0e9 + 0.5, 7, "events", "rank 1 **exited**"),
            scalar(1_733_000_000.123, u64::from(u32::MAX) + 5, "loss", -0.1),
        ]
        .concat();
        let got = read_events(&file).expect("reads");
        assert_eq!(got.records, 4);
        assert_eq!(
            got.scalars,
            vec![
                Scalar { tag: "loss".into(), step: 7, wall_time_s: 1.0e9 + 0.25, value: 2.5 },
                Scalar {
                    tag: "loss".into(),
                    step: i64::from(u32::MAX) + 5,
                    wall_time_s: 1_733_000_000.123,
                    value: f64::from(-0.1f32)
                },
            ]
        );
    }

    #[test]
    fn varints_are_protobufs() {
        assert_eq!(varint(0), [0]);
        assert_eq!(varint(300), [0xac, 0x02]);
        assert_eq!(varint(u64::MAX).len(), 10);
    }
}
