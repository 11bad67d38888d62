//! The one way fleetgate builds an HTTP client (Prometheus queries, forge APIs, notification
//! deliveries): reqwest on rustls with ring, the TLS stack the Kubernetes client already links.
//!
//! Why not OpenSSL through native-tls: each native-tls client builds its own `SSL_CTX` and parses
//! the whole system CA bundle into it up front (about 1.1 MB of heap per client while it lives,
//! measured with `mallinfo2` on this machine's Debian bundle), and initialising it pulls most of
//! libcrypto into the agent's resident memory (docs/BENCHMARKS.md, "Agent footprint"). rustls
//! checks certificates against the platform's roots (rustls-platform-verifier) only when a
//! connection needs them, and a `caFile` given for one endpoint adds to those roots for that
//! client alone.

use std::sync::Once;

/// A reqwest client builder on rustls (ring as the process's crypto provider).
///
/// The backend is chosen explicitly, so a build that also enabled reqwest's native-tls could not
/// move fleetgate's clients to OpenSSL.
pub fn client_builder() -> reqwest::ClientBuilder {
    static PROVIDER: Once = Once::new();
    // `Err` only when some other code of the process installed a provider first, which then serves.
    PROVIDER.call_once(|| drop(rustls::crypto::ring::default_provider().install_default()));
    reqwest::Client::builder().tls_backend_rustls()
}
