//! Builds the simulated-power-loss library (`powerloss/powerloss.c`, an
//! LD_PRELOAD shim) with the system C compiler; tests find it through the
//! `WHARF_POWERLOSS_SO` compile-time variable.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let src = PathBuf::from("powerloss/powerloss.c");
    println!("cargo:rerun-if-changed={}", src.display());
    let out =
        PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("libwharf_powerloss.so");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let status = Command::new(&cc)
        .args([
            "-shared",
            "-fPIC",
            "-O2",
            "-Wall",
            "-Wno-format-truncation",
            "-o",
        ])
        .arg(&out)
        .arg(&src)
        .arg("-ldl")
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("{cc} failed to build {} ({s})", src.display()),
        Err(e) => panic!(
            "cannot run the C compiler {cc:?} for {}: {e}",
            src.display()
        ),
    }
    println!("cargo:rustc-env=WHARF_POWERLOSS_SO={}", out.display());
}
