//! Records that the wire (`protocol`) and the history (`store`) share, so neither imports the
//! other: runs, ranks, events, verdicts, collectives, checkpoints, GRPO's sample lines and sweeps. A leaf: it imports only `ids`.
pub mod checkpoint;
pub mod collective;
pub mod rank;
pub mod run;
pub mod sample;
pub mod sweep;
pub mod verdict;

pub use checkpoint::{CheckpointRecord, Skipped};
pub use collective::{CollectiveOp, CollectiveRecord, CollectiveState};
pub use rank::{signal_name, ExitStatus, Phase};
pub use run::*;
pub use sample::SampleLine;
pub use sweep::{PointState, PointStatus, SweepPoint, SweepPointSpec, SweepRecord, SweepStatus};
pub use verdict::*;
