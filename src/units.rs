//! One way to write sizes, bandwidths and durations, for the cockpit, the CLI and event texts
//! alike: sizes in binary units with the unit always written (`512 B`, `4.7 MiB`, `1.6 GiB`),
//! bandwidth in GB/s (10⁹ bytes a second, as nccl-tests and PyTorch print it), durations as
//! `850ms`, `12s`, `3m05s`, `2h10m`.

/// `512 B`, `1.5 KiB`, `4.7 MiB`, `1.6 GiB`, `2.0 TiB`.
pub fn bytes(b: u64) -> String {
    bytes_f(b as f64)
}

/// A size that may be fractional (a mean of sizes), written like `bytes`.
pub fn bytes_f(b: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    if !b.is_finite() {
        return format!("{b} B");
    }
    let mut v = b;
    let mut u = 0;
    while v.abs() >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{v:.0} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// `1.23 GB/s`.
pub fn gb_per_s(gbps: f64) -> String {
    format!("{gbps:.2} GB/s")
}

/// `850ms`, `12s`, `3m05s`, `2h10m`.
pub fn duration_ms(ms: u64) -> String {
    let s = ms / 1000;
    if ms < 1000 {
        format!("{ms}ms")
    } else if s < 60 {
        format!("{s}s")
    } else if s < 3600 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{}h{:02}m", s / 3600, (s % 3600) / 60)
    }
}

/// Whether a metric's values are sizes (`mem_rss_bytes`, `gpu_mem_used_bytes`): written with
/// `bytes_f` rather than as plain numbers.
pub fn is_size_metric(name: &str) -> bool {
    name.ends_with("_bytes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_binary_with_the_unit_always_written() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(4_889_824), "4.7 MiB");
        assert_eq!(bytes(1_628_160), "1.6 MiB");
        assert_eq!(bytes(3 << 30), "3.0 GiB");
        assert_eq!(bytes_f(1.86e8), "177.4 MiB");
        assert_eq!(gb_per_s(1.234), "1.23 GB/s");
        assert_eq!(duration_ms(850), "850ms");
        assert_eq!(duration_ms(185_000), "3m05s");
        assert!(is_size_metric("mem_rss_bytes") && !is_size_metric("loss"));
    }
}
