//! Graceful stop: SIGUSR1 from the agent sets a flag; at each step boundary every rank adds its
//! flag into a one-element all-reduce, so all ranks see the same sum and stop after the same step.
use crate::collective::CollectiveError;
use crate::worker::group::StepCollective;
use std::sync::atomic::{AtomicBool, Ordering};

static REQUESTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_signal: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    REQUESTED.store(true, Ordering::SeqCst);
}

/// Installs the SIGUSR1 handler. Done first thing in the worker, so a stop that arrives during
/// start-up is remembered instead of killing the rank (SIGUSR1's default action).
pub fn install() -> std::io::Result<()> {
    // SAFETY: a zeroed sigaction is a valid "no flags, empty mask" value; the handler only
    // stores to an atomic. SA_RESTART resumes interrupted blocking calls (socket reads);
    // the ring's poll loop treats EINTR as "no progress yet".
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        action.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        if libc::sigaction(libc::SIGUSR1, &action, std::ptr::null_mut()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The flag SIGUSR1 sets. Training takes the flag as a parameter, so in-process tests can use
/// their own without stopping each other.
pub fn flag() -> &'static AtomicBool {
    &REQUESTED
}

/// True on every rank iff any rank was asked to stop. One tiny collective per step on a group;
/// a lone rank only reads its flag.
pub fn agree(group: &mut dyn StepCollective, asked: bool) -> Result<bool, CollectiveError> {
    if group.world_size() == 1 {
        return Ok(asked);
    }
    let mut flag = [if asked { 1.0f32 } else { 0.0 }];
    group.all_reduce_sum(&mut flag)?;
    Ok(flag[0] > 0.0)
}
