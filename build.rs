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
    let size_optimised = matches!(std::env::var("OPT_LEVEL").as_deref(), Ok("s" | "z"));
    if std::env::var("TARGET").as_deref() == Ok("x86_64-unknown-linux-gnu") && size_optimised {
        // The functions the agent runs first in `.text`, together (link/agent.order, made by
        // hack/agent-order.sh, for the `agent` profile the image ships): the kernel keeps 64 KiB
        // of code resident around each page it faults in, so the same functions spread over the
        // binary kept nearly all of it resident (docs/BENCHMARKS.md "Agent footprint"). The list
        // names functions without their symbols' crate hashes; link/cc, the linker
        // .cargo/config.toml sets, finds their symbols for lld, which rustc links this target
        // with since 1.90 (the crate's rust-version). Names the build lacks (inlined, renamed
        // since) are skipped: a stale list costs memory, not a failed link.
        let order = concat!(env!("CARGO_MANIFEST_DIR"), "/link/agent.order");
        println!("cargo:rerun-if-changed=link/agent.order");
        println!("cargo:rustc-link-arg-bin=fleetgate=-Wl,--symbol-ordering-file={order}");
        println!("cargo:rustc-link-arg-bin=fleetgate=-Wl,--no-warn-symbol-ordering");
    }
}
