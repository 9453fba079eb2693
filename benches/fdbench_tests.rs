//! fdbench's unit tests. `fdbench` is `harness = false` (the drivers start it with arguments),
//! so libtest never sees its `#[test]`s; its pure modules are compiled again here, where it does:
//! `cargo test --release --bench fdbench_tests` (part of `make check` and `make test`).
#[path = "fdbench/charts.rs"]
mod charts;
#[path = "fdbench/tables.rs"]
mod tables;
