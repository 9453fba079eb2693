//! The wire protocol: framing (`frame`) and the message types (`message`).
pub mod frame;
pub mod message;
pub mod spec;
pub mod stacks;
pub mod tcp_link;

pub use frame::{read_frame, read_frame_async, write_frame, write_frame_async, Decoder, FrameError};
pub use message::*;
// The records the wire shares with the store live in `record`; they are part of the protocol's
// vocabulary, so they are named from here too.
pub use crate::record::verdict::*;
