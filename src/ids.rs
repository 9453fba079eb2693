//! Identifier newtypes shared by every layer: runs, ranks, steps and collective sequence numbers.
use serde::{Deserialize, Serialize};
use std::fmt;

/// A run's id: `YYYYMMDDTHHMMSS-xxxx`, so ids sort by start time as plain strings.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RunId(pub String);

impl RunId {
    /// A fresh id from the wall clock and a few random bits (the pid and nanoseconds).
    pub fn new_now() -> RunId {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let secs = now.as_secs() as i64;
        let (y, mo, d, h, mi, s) = civil_from_unix(secs);
        let salt = (now.subsec_nanos() ^ (std::process::id() << 16)) & 0xffff;
        RunId(format!("{y:04}{mo:02}{d:02}T{h:02}{mi:02}{s:02}-{salt:04x}"))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A global rank, 0..world_size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Rank(pub u32);

impl fmt::Display for Rank {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A training step, counted from 1 for the first optimizer update.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Step(pub u64);

/// Milliseconds since the Unix epoch, the one clock every message carries.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Microseconds since the Unix epoch, for collective timings.
pub fn unix_us() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0)
}

/// Converts Unix seconds to a UTC civil date and time (Howard Hinnant's algorithm).
pub fn civil_from_unix(secs: i64) -> (i64, u32, u32, u32, u32, u32) {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d, (rem / 3600) as u32, ((rem % 3600) / 60) as u32, (rem % 60) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates_match_known_instants() {
        assert_eq!(civil_from_unix(0), (1970, 1, 1, 0, 0, 0));
        assert_eq!(civil_from_unix(1_798_761_600), (2027, 1, 1, 0, 0, 0));
        assert_eq!(civil_from_unix(951_782_400 + 3661), (2000, 2, 29, 1, 1, 1));
    }

    #[test]
    fn run_ids_sort_by_time() {
        let a = RunId::new_now();
        assert_eq!(a.0.len(), "20261202T095530-3f2a".len());
    }
}
