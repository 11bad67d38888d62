//! Link settings of the `fleetgate` binary.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if os == "linux" && env == "gnu" {
        // Relative relocations packed into a bitmap (DT_RELR) instead of 24 bytes each: the
        // dynamic loader reads every one at start, so the 1.9 MB table they took was resident in
        // every process (docs/BENCHMARKS.md "Agent footprint"). Needs binutils 2.38 (or lld 15)
        // to link and glibc 2.36 to run; an older glibc refuses the binary at start, by name
        // (GLIBC_ABI_DT_RELR), rather than misloading it. The image's base is Debian 12's 2.36.
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}
