//! How every Git connection fleetgate makes is set up — the agent's fetches, status notes pushed
//! and fetched, write-back, and the CLI's validate, status, diff, promote and rollback: the one
//! place that builds git2's `RemoteCallbacks`, `ProxyOptions`, `FetchOptions` and `PushOptions`
//! from a [`Credentials`].
//!
//! * **SSH host keys are checked strictly against `known_hosts` content** given with the
//!   credentials (in a pod `HOME` has no `~/.ssh`). A host missing from it, a key that differs and
//!   no `known_hosts` at all are refused ([`HostKeyError`], naming the host and the key type and
//!   SHA-256 fingerprint the server offered); libgit2's own checks are never consulted.
//! * **HTTPS** is fleetgate's own transport ([`super::https`], rustls): `caFile` (PEM, one or
//!   more certificates) adds to the platform's roots for that connection only, rather than with
//!   `git2::opts::set_ssl_cert_file`, which is process-global: it would make a CA given for one
//!   repo trusted for every HTTPS connection, and could not be changed (a rotated Secret) without
//!   a restart.
//! * **Refusals say why, and are not retried.** libgit2's SSH transport replaces the reason a host
//!   key was refused with "invalid or unknown remote ssh hostkey", and a transport's errors reach
//!   the caller as generic network errors. Whoever reports a failed connection passes its error
//!   through [`explain_refusal`], which gives back the refusal this thread recorded
//!   (`ErrorCode::Certificate`, with the [`HostKeyError`] or the TLS verdict).
//! * **Proxies**: `HTTPS_PROXY` and `HTTP_PROXY` (either case) are honoured for `https://` and
//!   `http://` URLs unless `NO_PROXY` covers the host, as reqwest does for the agent's HTTP (both
//!   schemes are fleetgate's own transport). `ssh://` and `git://` connect directly.

use super::Credentials;
use git2::cert::Cert;
use git2::{CertificateCheckStatus, FetchOptions, ProxyOptions, PushOptions, RemoteCallbacks};
use std::cell::RefCell;
use std::fmt::Write as _;

thread_local! {
    /// Why this thread's latest connection refused the server's identity, for
    /// [`explain_refusal`]: libgit2 calls the certificate callback and the transport on the thread
    /// that connects, and then replaces the reason with a message of its own.
    static REFUSAL: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Records why this thread's connection refuses the server (an SSH host key, a TLS certificate).
pub(super) fn record_refusal(reason: String) {
    REFUSAL.with(|r| *r.borrow_mut() = Some(reason));
}

/// `e` as a refusal of the server's identity (`ErrorCode::Certificate`, with the reason recorded
/// instead of libgit2's generic message) when this thread's connection recorded one; any other
/// error unchanged.
pub fn explain_refusal(e: git2::Error) -> git2::Error {
    match REFUSAL.with(|r| r.borrow_mut().take()) {
        Some(reason) => git2::Error::new(git2::ErrorCode::Certificate, e.class(), reason),
        None => e,
    }
}

/// The proxy settings of the environment, read once ([`ProxyEnv::from_env`]) so a test or a
/// caller can also give them explicitly.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProxyEnv {
    /// For `https://` URLs (`HTTPS_PROXY`).
    pub https: Option<String>,
    /// For `http://` URLs (`HTTP_PROXY`).
    pub http: Option<String>,
    /// Hosts reached directly (`NO_PROXY`): `*`, a host or IP, or a domain (`example.com` and
    /// `.example.com` both cover `git.example.com`).
    pub no_proxy: Vec<String>,
}

impl ProxyEnv {
    /// `HTTPS_PROXY`, `HTTP_PROXY`, `NO_PROXY`, each also in lower case (the upper case wins).
    pub fn from_env() -> ProxyEnv {
        let var = |name: &str| {
            std::env::var(name).or_else(|_| std::env::var(name.to_lowercase())).ok().filter(|v| !v.trim().is_empty())
        };
        ProxyEnv {
            https: var("HTTPS_PROXY"),
            http: var("HTTP_PROXY"),
            no_proxy: var("NO_PROXY")
                .map(|v| v.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect())
                .unwrap_or_default(),
        }
    }

    /// The proxy `url` goes through, if any.
    pub fn for_url(&self, url: &str) -> Option<&str> {
        let parsed = reqwest::Url::parse(url).ok()?;
        let proxy = match parsed.scheme() {
            "https" => self.https.as_deref(),
            "http" => self.http.as_deref(),
            _ => None,
        }?;
        let host = parsed.host_str()?.trim_start_matches('[').trim_end_matches(']').to_ascii_lowercase();
        let bypassed = self.no_proxy.iter().any(|entry| {
            let entry = entry.to_ascii_lowercase();
            let entry = entry.trim_start_matches('.');
            entry == "*" || host == entry || host.ends_with(&format!(".{entry}"))
        });
        (!bypassed).then_some(proxy)
    }
}

/// An SSH host key refused. Each names the host and what the server offered, so whoever reads the
/// agent's Event can compare it with the key they expect.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostKeyError {
    #[error(
        "{host}: no known_hosts is configured, so its SSH host key ({key_type} {fingerprint}) cannot be checked \
         and is refused; give the host's key as known_hosts (key `known_hosts` of the Git credentials Secret, \
         --git-known-hosts FILE for the agent, --known-hosts FILE for the CLI)"
    )]
    NoKnownHosts { host: String, key_type: String, fingerprint: String },
    #[error(
        "{host}: its SSH host key {key_type} {fingerprint} is refused: known_hosts lists no key for this host \
         (add one, e.g. from `ssh-keyscan`, after checking its fingerprint out of band)"
    )]
    UnknownHost { host: String, key_type: String, fingerprint: String },
    #[error(
        "{host}: SSH HOST KEY MISMATCH: the server offered {key_type} {fingerprint} but known_hosts lists {listed} \
         for this host; refusing to connect (the server may be impersonated; if its key really changed, update \
         known_hosts after checking the new fingerprint out of band)"
    )]
    Mismatch { host: String, key_type: String, fingerprint: String, listed: String },
    #[error("{host}: its SSH host key {key_type} {fingerprint} is marked @revoked in known_hosts; refusing to connect")]
    Revoked { host: String, key_type: String, fingerprint: String },
    #[error("{host}: the SSH transport gave no host key to check; refusing to connect")]
    NoKey { host: String },
}

/// One usable `known_hosts` line.
struct KnownHost {
    revoked: bool,
    patterns: String,
    key: Vec<u8>,
}

/// The host name `known_hosts` files key a server by: `host`, or `[host]:port` off port 22.
fn known_hosts_name(host: &str, port: Option<u16>) -> String {
    match port {
        Some(p) if p != 22 => format!("[{host}]:{p}"),
        _ => host.to_string(),
    }
}

/// Whether a line's comma-separated `patterns` (plain names, `*`/`?` wildcards, `!` negations,
/// or one hashed `|1|salt|hash` entry) cover `name`.
fn patterns_match(patterns: &str, name: &str) -> bool {
    if let Some(hashed) = patterns.strip_prefix("|1|") {
        return hashed_match(hashed, name);
    }
    let mut matched = false;
    for p in patterns.split(',') {
        if let Some(neg) = p.strip_prefix('!') {
            if glob(neg, name) {
                return false;
            }
        } else if glob(p, name) {
            matched = true;
        }
    }
    matched
}

/// `|1|base64(salt)|base64(HMAC-SHA1(salt, name))`, as `ssh-keygen -H` writes.
fn hashed_match(hashed: &str, name: &str) -> bool {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let Some((salt, hash)) = hashed.split_once('|') else { return false };
    let (Ok(salt), Ok(hash)) = (b64.decode(salt), b64.decode(hash)) else { return false };
    let Ok(key) = openssl::pkey::PKey::hmac(&salt) else { return false };
    let Ok(mut signer) = openssl::sign::Signer::new(openssl::hash::MessageDigest::sha1(), &key) else {
        return false;
    };
    signer.sign_oneshot_to_vec(name.as_bytes()).is_ok_and(|mac| openssl::memcmp::eq(&mac, &hash))
}

/// `*` and `?` wildcards, case-insensitive (host names).
fn glob(pattern: &str, name: &str) -> bool {
    fn go(p: &[u8], n: &[u8]) -> bool {
        match (p.first(), n.first()) {
            (None, None) => true,
            (Some(b'*'), _) => go(&p[1..], n) || (!n.is_empty() && go(p, &n[1..])),
            (Some(b'?'), Some(_)) => go(&p[1..], &n[1..]),
            (Some(a), Some(b)) if a.eq_ignore_ascii_case(b) => go(&p[1..], &n[1..]),
            _ => false,
        }
    }
    go(pattern.as_bytes(), name.as_bytes())
}

/// The lines of `known_hosts` text that can match a host; comments, `@cert-authority` lines
/// (libgit2 offers no certificates to check) and lines that do not parse are skipped.
fn parse_known_hosts(text: &str) -> Vec<KnownHost> {
    use base64::Engine as _;
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let first = fields.next().filter(|f| !f.starts_with('#'))?;
            let (revoked, patterns) = match first {
                "@revoked" => (true, fields.next()?),
                "@cert-authority" => return None,
                _ => (false, first),
            };
            let _key_type = fields.next()?;
            let key = base64::engine::general_purpose::STANDARD.decode(fields.next()?).ok()?;
            Some(KnownHost { revoked, patterns: patterns.to_string(), key })
        })
        .collect()
}

/// The algorithm name a public key blob starts with (`ssh-ed25519`, `ssh-rsa`, …).
fn key_type(blob: &[u8]) -> String {
    let len = blob.get(..4).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize);
    len.and_then(|l| blob.get(4..4 + l))
        .map(|t| String::from_utf8_lossy(t).into_owned())
        .unwrap_or_else(|| "unknown".into())
}

/// `SHA256:<base64>`, as `ssh-keygen -l` prints it.
fn fingerprint(blob: &[u8]) -> String {
    use base64::Engine as _;
    use sha2::Digest as _;
    format!("SHA256:{}", base64::engine::general_purpose::STANDARD_NO_PAD.encode(sha2::Sha256::digest(blob)))
}

/// Checks the key `blob` a server at `host` (`port` from the URL) offered against `known_hosts`.
pub fn check_host_key(
    known_hosts: Option<&str>,
    host: &str,
    port: Option<u16>,
    blob: &[u8],
) -> Result<(), HostKeyError> {
    let name = known_hosts_name(host, port);
    let (key_type, fingerprint) = (key_type(blob), fingerprint(blob));
    let Some(text) = known_hosts else {
        return Err(HostKeyError::NoKnownHosts { host: name, key_type, fingerprint });
    };
    let lines: Vec<KnownHost> =
        parse_known_hosts(text).into_iter().filter(|l| patterns_match(&l.patterns, &name)).collect();
    if lines.iter().any(|l| l.revoked && l.key == blob) {
        return Err(HostKeyError::Revoked { host: name, key_type, fingerprint });
    }
    let listed: Vec<&KnownHost> = lines.iter().filter(|l| !l.revoked).collect();
    if listed.iter().any(|l| l.key == blob) {
        return Ok(());
    }
    if listed.is_empty() {
        return Err(HostKeyError::UnknownHost { host: name, key_type, fingerprint });
    }
    let mut seen = String::new();
    for (i, l) in listed.iter().enumerate() {
        let _ =
            write!(seen, "{}{} {}", if i > 0 { ", " } else { "" }, self::key_type(&l.key), self::fingerprint(&l.key));
    }
    Err(HostKeyError::Mismatch { host: name, key_type, fingerprint, listed: seen })
}

/// What a certificate callback decides for `url`.
fn check_certificate(
    creds: &Credentials,
    url: &str,
    cert: &Cert<'_>,
    host: &str,
) -> Result<CertificateCheckStatus, git2::Error> {
    let refuse =
        |message: String| Err(git2::Error::new(git2::ErrorCode::Certificate, git2::ErrorClass::Callback, message));
    if let Some(hostkey) = cert.as_hostkey() {
        let port = reqwest::Url::parse(url).ok().and_then(|u| u.port());
        let Some(blob) = hostkey.hostkey() else {
            return refuse(HostKeyError::NoKey { host: host.to_string() }.to_string());
        };
        return match check_host_key(creds.known_hosts.as_deref(), host, port, blob) {
            Ok(()) => Ok(CertificateCheckStatus::CertificateOk),
            Err(e) => {
                record_refusal(e.to_string());
                refuse(e.to_string())
            }
        };
    }
    Ok(CertificateCheckStatus::CertificatePassthrough)
}

/// libgit2's proxy options: none. `https://` and `http://` go through the proxy in fleetgate's own
/// transport ([`super::https`]); `ssh://` and `git://` connect directly.
pub fn no_libgit2_proxy<'a>() -> ProxyOptions<'a> {
    ProxyOptions::new()
}

/// What to tell someone whose HTTPS connection failed its certificate check.
pub const CA_HINT: &str = "if the server's certificate is issued by a private CA, give that CA's certificate (PEM) \
     as caFile: key `caFile` of the Git credentials Secret, --git-ca-file for the agent, --ca-file for the CLI";

impl Credentials {
    /// The callbacks of a connection to `url`: credentials (given up after the remote refuses
    /// what was offered, instead of offering it forever) and the host checks above. Add a
    /// command's own callbacks (progress, push answers) to the value returned. An `https://`
    /// connection this thread makes next uses these credentials ([`super::https`]).
    pub fn callbacks<'a>(&self, url: &str) -> RemoteCallbacks<'a> {
        // A new connection: a refusal an earlier one left unexplained is not this one's.
        REFUSAL.with(|r| r.borrow_mut().take());
        super::https::use_for_this_thread(self);
        let mut cb = RemoteCallbacks::new();
        let creds = self.clone();
        let mut offered = false;
        cb.credentials(move |url, user_from_url, allowed| {
            // libgit2 calls again after a rejection; offering the same secret again would loop.
            if offered {
                return Err(git2::Error::from_str("the remote rejected the configured credentials"));
            }
            // A user name alone (libgit2's first question for SSH) is not a secret offered.
            offered = allowed != git2::CredentialType::USERNAME;
            creds.cred(url, user_from_url, allowed)
        });
        let creds = self.clone();
        let url = url.to_string();
        cb.certificate_check(move |cert, host| check_certificate(&creds, &url, cert, host));
        cb
    }

    /// Fetch options with `callbacks` (from [`Credentials::callbacks`]): no libgit2 proxy, no
    /// redirect followed.
    pub fn fetch_options<'a>(&self, callbacks: RemoteCallbacks<'a>) -> FetchOptions<'a> {
        let mut opts = FetchOptions::new();
        opts.remote_callbacks(callbacks).proxy_options(no_libgit2_proxy()).follow_redirects(git2::RemoteRedirect::None);
        opts
    }

    /// Push options with `callbacks` (from [`Credentials::callbacks`]): no libgit2 proxy, no
    /// redirect followed.
    pub fn push_options<'a>(&self, callbacks: RemoteCallbacks<'a>) -> PushOptions<'a> {
        let mut opts = PushOptions::new();
        opts.remote_callbacks(callbacks).proxy_options(no_libgit2_proxy()).follow_redirects(git2::RemoteRedirect::None);
        opts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blob(name: &str, body: &[u8]) -> Vec<u8> {
        let mut b = (name.len() as u32).to_be_bytes().to_vec();
        b.extend_from_slice(name.as_bytes());
        b.extend_from_slice(body);
        b
    }

    fn line(patterns: &str, key: &[u8]) -> String {
        use base64::Engine as _;
        format!("{patterns} {} {}\n", key_type(key), base64::engine::general_purpose::STANDARD.encode(key))
    }

    #[test]
    fn host_keys_are_checked_strictly() {
        let good = blob("ssh-ed25519", b"good");
        let other = blob("ssh-ed25519", b"other");
        let kh = format!("# comment\n{}{}", line("[127.0.0.1]:2222", &good), line("git.example.com,gh", &other));
        assert_eq!(check_host_key(Some(&kh), "127.0.0.1", Some(2222), &good), Ok(()));
        assert!(matches!(
            check_host_key(Some(&kh), "127.0.0.1", Some(2222), &other),
            Err(HostKeyError::Mismatch { ref host, .. }) if host == "[127.0.0.1]:2222"
        ));
        // Port 22 is written without brackets; a different port is a different host.
        assert!(matches!(check_host_key(Some(&kh), "127.0.0.1", None, &good), Err(HostKeyError::UnknownHost { .. })));
        assert_eq!(check_host_key(Some(&kh), "git.example.com", Some(22), &other), Ok(()));
        assert!(matches!(check_host_key(None, "gh", None, &other), Err(HostKeyError::NoKnownHosts { .. })));
        let revoked = format!("@revoked * {}", line("", &good).trim_start());
        assert!(matches!(
            check_host_key(Some(&format!("{revoked}{kh}")), "127.0.0.1", Some(2222), &good),
            Err(HostKeyError::Revoked { .. })
        ));
        assert!(matches!(
            check_host_key(Some(&line("*.example.com,!bad.example.com", &good)), "bad.example.com", None, &good),
            Err(HostKeyError::UnknownHost { .. })
        ));
    }

    #[test]
    fn hashed_host_names_match() {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD;
        let salt = b"0123456789abcdefghij";
        let key = openssl::pkey::PKey::hmac(salt).unwrap();
        let mut signer = openssl::sign::Signer::new(openssl::hash::MessageDigest::sha1(), &key).unwrap();
        let mac = signer.sign_oneshot_to_vec(b"[127.0.0.1]:2222").unwrap();
        let good = blob("ssh-ed25519", b"good");
        let kh = line(&format!("|1|{}|{}", b64.encode(salt), b64.encode(mac)), &good);
        assert_eq!(check_host_key(Some(&kh), "127.0.0.1", Some(2222), &good), Ok(()));
        assert!(check_host_key(Some(&kh), "127.0.0.2", Some(2222), &good).is_err());
    }

    #[test]
    fn a_refusal_recorded_on_this_thread_explains_the_next_error_only() {
        use git2::{ErrorClass, ErrorCode};
        let network = || git2::Error::new(ErrorCode::GenericError, ErrorClass::Net, "https://h/r: connection reset");
        assert_eq!(explain_refusal(network()).code(), ErrorCode::GenericError, "a network failure stays one");
        record_refusal("the server's TLS certificate was refused: UnknownIssuer".into());
        let explained = explain_refusal(network());
        assert_eq!(
            (explained.code(), explained.message()),
            (ErrorCode::Certificate, "the server's TLS certificate was refused: UnknownIssuer")
        );
        assert_eq!(explain_refusal(network()).code(), ErrorCode::GenericError, "taken once");
        record_refusal("stale".into());
        drop(Credentials::default().callbacks("https://h/r"));
        assert_eq!(
            explain_refusal(network()).code(),
            ErrorCode::GenericError,
            "a new connection forgets the old refusal"
        );
    }

    #[test]
    fn no_proxy_covers_hosts_and_domains() {
        let env = ProxyEnv {
            https: Some("http://proxy:3128".into()),
            http: None,
            no_proxy: vec!["example.com".into(), "10.0.0.1".into()],
        };
        assert_eq!(env.for_url("https://github.com/o/r.git"), Some("http://proxy:3128"));
        assert_eq!(env.for_url("https://git.example.com/o/r.git"), None);
        assert_eq!(env.for_url("https://10.0.0.1:8443/r.git"), None);
        assert_eq!(env.for_url("http://github.com/o/r.git"), None, "no HTTP_PROXY");
        assert_eq!(env.for_url("ssh://git@github.com/o/r.git"), None, "libgit2 proxies HTTP only");
        let all = ProxyEnv { no_proxy: vec!["*".into()], ..env };
        assert_eq!(all.for_url("https://github.com/o/r.git"), None);
    }
}
