//! Agent identities for the status tests that write notes without running an agent: one status
//! key per cluster name for the whole test binary, and the keys a reader believes them with.
#![allow(dead_code)] // each test binary uses a different part

use fleetgate::status::{StatusIdentity, StatusKeys, StatusSigner};
use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};

/// The fleet the identities belong to (the template's name).
pub const FLEET: &str = "redis-fleet";

fn signers() -> &'static Mutex<BTreeMap<String, StatusSigner>> {
    static SIGNERS: OnceLock<Mutex<BTreeMap<String, StatusSigner>>> = OnceLock::new();
    SIGNERS.get_or_init(Default::default)
}

/// `cluster`'s agent identity (the same key every time in this process).
pub fn identity(cluster: &str) -> StatusIdentity {
    let mut signers = signers().lock().unwrap();
    let signer =
        signers.entry(cluster.to_string()).or_insert_with(|| StatusSigner::generate(cluster).unwrap()).clone();
    StatusIdentity::new(FLEET, signer)
}

/// Keys that believe every identity made so far.
pub fn keys() -> StatusKeys {
    let mut keys = StatusKeys::new(FLEET);
    for (cluster, signer) in signers().lock().unwrap().iter() {
        keys.insert(cluster, signer.public());
    }
    keys
}
