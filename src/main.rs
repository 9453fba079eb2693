//! The one `flightdeck` executable: parses the command line and hands over to `cli`.
use std::io::Write;

fn main() {
    let code = flightdeck::cli::main();
    // Everything the command wrote is flushed and every file it held is closed (each command's
    // state is dropped before it returns). What `exit` would still run are the linked C++
    // libraries' static destructors, libtorch's above all: some 60 ms of tearing down operator
    // tables no command needs, on every `flightdeck runs`, `show`, `parse-log`.
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: `_exit` ends the process at once; nothing of ours is left to run.
    unsafe { libc::_exit(code) }
}
