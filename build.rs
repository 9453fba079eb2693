//! Bakes the libtorch directory into the binary's run path, so it starts without LD_LIBRARY_PATH.
fn main() {
    println!("cargo:rerun-if-env-changed=FD_TORCH_LIB");
    if let Ok(dir) = std::env::var("FD_TORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}
