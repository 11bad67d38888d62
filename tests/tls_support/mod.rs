//! TLS for tests: a CA made here and a certificate for 127.0.0.1 it issued ([`pki`], as PEM files
//! for a `caFile` or a server's configuration), and an axum app served with them over HTTPS on
//! loopback ([`serve`], rustls on ring).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio_rustls::rustls;

/// A CA, and a server certificate for 127.0.0.1 it issued.
pub struct Pki {
    /// The CA's certificate (what `caFile` holds).
    pub ca: PathBuf,
    /// The server's certificate, then the CA's (what a server such as Gitea serves).
    pub chain: PathBuf,
    pub key: PathBuf,
    leaf_der: Vec<u8>,
    key_der: Vec<u8>,
}

/// A new [`Pki`], its files named after `name` in `dir`.
pub fn pki(dir: &Path, name: &str) -> Pki {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.distinguished_name.push(DnType::CommonName, format!("{name} test CA"));
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&leaf_key, &Issuer::from_params(&ca, &ca_key))
        .unwrap();
    let pki = Pki {
        ca: dir.join(format!("{name}-ca.pem")),
        chain: dir.join(format!("{name}-chain.pem")),
        key: dir.join(format!("{name}-key.pem")),
        leaf_der: leaf.der().to_vec(),
        key_der: leaf_key.serialize_der(),
    };
    std::fs::write(&pki.ca, ca_cert.pem()).unwrap();
    std::fs::write(&pki.chain, format!("{}{}", leaf.pem(), ca_cert.pem())).unwrap();
    std::fs::write(&pki.key, leaf_key.serialize_pem()).unwrap();
    pki
}

/// Serves `app` over HTTPS on 127.0.0.1 with `pki`'s server certificate until the test ends.
pub async fn serve(app: axum::Router, pki: &Pki) -> SocketAddr {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![pki.leaf_der.clone().into()],
            rustls::pki_types::PrivatePkcs8KeyDer::from(pki.key_der.clone()).into(),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let (acceptor, app) = (acceptor.clone(), app.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else { return };
                let io = hyper_util::rt::TokioIo::new(tls);
                let svc = hyper_util::service::TowerToHyperService::new(app);
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, svc).await;
            });
        }
    });
    addr
}
