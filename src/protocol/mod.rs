//! The wire protocol: framing (`frame`) and the message types (`message`).
pub mod frame;
pub mod message;
pub mod verdict;

pub use frame::{read_frame, read_frame_async, write_frame, write_frame_async, Decoder, FrameError};
pub use message::*;
pub use verdict::*;
