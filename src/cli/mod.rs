//! placeholder
pub fn main() -> i32 {
    println!("{}", crate::worker::selftest());
    0
}
