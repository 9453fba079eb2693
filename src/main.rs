//! The one `flightdeck` executable: parses the command line and hands over to `cli`.
fn main() {
    std::process::exit(flightdeck::cli::main());
}
