//! The agent's process: the tokio runtime it runs on and how glibc's malloc keeps memory, set for
//! a small, flat footprint (docs/BENCHMARKS.md "Agent footprint"). The agent mostly waits for its
//! next poll; between passes it should hold only what it uses.
//!
//! * Two worker threads whatever the node's size (tokio's default is one per core: 64 on a large
//!   node, each with a stack and, for glibc, possibly an arena of its own). One thread runs a pass
//!   (which blocks in libgit2 and gpgme through `block_in_place`) while the other keeps the HTTP
//!   server, the Lease renewals and the state watch answering.
//! * One malloc arena: glibc gives threads arenas of their own (up to 8 per core), and each keeps
//!   the free memory of its busiest moment. The agent's threads rarely allocate at the same time,
//!   so they share the main one.
//! * After each pass, [`release_free_memory`] gives the kernel back what malloc holds free (the
//!   pass's manifests, snapshots and API responses), so an idle agent's RSS is what it uses.

/// Worker threads of the agent's runtime.
const WORKER_THREADS: usize = 2;
/// glibc malloc arenas, for every thread of the process.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MALLOC_ARENAS: libc::c_int = 1;

/// Sets malloc's arena limit, then builds the agent's runtime. Call it before any other thread
/// starts (an arena a thread already has stays).
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes malloc's parameters; it takes malloc's own lock.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, MALLOC_ARENAS);
    }
    tokio::runtime::Builder::new_multi_thread().worker_threads(WORKER_THREADS).enable_all().build()
}

/// Returns the free memory malloc holds to the kernel (`malloc_trim`): at the end of a pass, when
/// what the pass allocated has been dropped.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim walks malloc's own free lists under its locks; no pointer is passed.
    unsafe {
        libc::malloc_trim(0);
    }
}
