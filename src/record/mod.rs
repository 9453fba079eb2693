//! Records that the wire (`protocol`) and the history (`store`) share, so neither imports the
//! other: runs, ranks, events, verdicts, collectives, checkpoints and GRPO's sample lines. A leaf: it imports only `ids`.
pub mod checkpoint;
pub mod collective;
pub mod rank;
pub mod run;
pub mod sample;
pub mod verdict;

pub use checkpoint::{CheckpointRecord, Skipped};
pub use collective::{CollectiveOp, CollectiveRecord, CollectiveState};
pub use rank::{signal_name, ExitStatus, Phase};
pub use run::*;
pub use sample::SampleLine;
pub use verdict::*;
