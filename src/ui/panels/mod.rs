//! The cockpit's panels: one file each, holding its view state, its keys and its drawing.
pub mod banner;
pub mod chart;
pub mod ckpts;
pub mod collectives;
pub mod compare;
pub mod events;
pub mod gpu;
pub mod heatmap;
pub mod help;
pub mod home;
pub mod incident;
pub mod logs;
pub mod matrix;
pub mod ranks;
pub mod stacks;
