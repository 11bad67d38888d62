//! Git's smart HTTP protocol over `https://` and `http://` on fleetgate's own HTTP client
//! ([`crate::http`]: rustls), registered as libgit2's `https` and `http` transports. libgit2's
//! built-in HTTPS would bring OpenSSL into every process: a TLS context and the whole system CA
//! bundle parsed into memory at start, whether or not a repo is ever reached over HTTPS (about 2
//! MiB of the agent's resident memory, docs/BENCHMARKS.md "Agent footprint"). Its plain HTTP follows
//! a redirect of the first request to any port of the same host, and, told to follow one, to any
//! host, credentials asked for there included; here no redirect is followed for either scheme.
//! `ssh://` and `git://` stay libgit2's.
//!
//! A connection does what the [`Credentials`] of its operation say: [`Credentials::callbacks`],
//! which every fetch, push and ls-remote fleetgate makes asks for first, hands them to this thread
//! ([`use_for_this_thread`]), and libgit2 runs the operation, and so this transport, on the thread
//! that asked.
//!
//! * **Trust**: the platform's roots, plus the certificates of `caFile` for this connection only
//!   (read at each connection, so a rotated Secret needs no restart). `caFile` adds trust, never
//!   removes it. The server's intermediates count, as in a browser.
//! * **Credentials** go to the configured URL and nowhere else: no redirect is followed. A token
//!   is sent with every request (Basic, user `username` or `git`); without one and with
//!   `git_helpers` (the CLI on a person's machine), Git's credential helpers are asked once the
//!   server answers 401, as `git` does.
//! * **Proxy**: [`ProxyEnv::for_url`](super::ProxyEnv::for_url) of the credentials (`CONNECT`
//!   tunnel for `https://`, `HTTP_PROXY` forwarding for `http://`); the environment is not read
//!   again here.
//! * **Refusals say why**: a certificate that chains to no trusted root is recorded for
//!   [`explain_refusal`](super::explain_refusal) (an `ErrorCode::Certificate`, not retried), an
//!   answer 401 is a credentials error, and a server that does not speak smart HTTP is named.
//! * Requests run on one small runtime thread of their own (started by the first HTTPS
//!   connection), so the transport blocks nothing async and works from any thread: an agent worker
//!   in `block_in_place`, a CLI command, a test's plain thread.

use super::Credentials;
use bytes::Bytes;
use git2::transport::{Service, SmartSubtransport, SmartSubtransportStream, Transport};
use std::cell::RefCell;
use std::io::{self, Read, Write};
use std::sync::{Arc, Mutex, Once, OnceLock, PoisonError};
use std::time::Duration;

thread_local! {
    /// The credentials of this thread's latest connection ([`use_for_this_thread`]).
    static CONNECTION: RefCell<Option<Arc<Credentials>>> = const { RefCell::new(None) };
}

/// The next HTTPS connection this thread makes uses `credentials`; registers the transport first.
pub(super) fn use_for_this_thread(credentials: &Credentials) {
    register();
    CONNECTION.with(|c| *c.borrow_mut() = Some(Arc::new(credentials.clone())));
}

fn register() {
    static REGISTER: Once = Once::new();
    REGISTER.call_once(|| {
        // SAFETY: libgit2 reads its list of transports without a lock. Every connection fleetgate
        // makes passes here first, and `Once` holds them all until the registration is done.
        for scheme in ["https", "http"] {
            let registered = unsafe {
                git2::transport::register(scheme, |remote| {
                    let credentials = CONNECTION.with(|c| c.borrow().clone()).ok_or_else(|| {
                        git2::Error::from_str("an HTTP connection was made without fleetgate's Git connection settings")
                    })?;
                    Transport::smart(remote, true, Https { credentials, client: OnceLock::new() })
                })
            };
            if let Err(e) = registered {
                tracing::error!("registering the {scheme}:// Git transport: {e}");
            }
        }
    });
}

/// One connection: the requests of one fetch or push, sharing one HTTP client (and so its
/// connection).
struct Https {
    credentials: Arc<Credentials>,
    client: OnceLock<reqwest::Client>,
}

impl Https {
    fn client(&self, url: &str) -> Result<reqwest::Client, git2::Error> {
        if let Some(client) = self.client.get() {
            return Ok(client.clone());
        }
        let client = build_client(&self.credentials, url).map_err(|why| {
            super::access::record_refusal(why.clone());
            git2::Error::new(git2::ErrorCode::Certificate, git2::ErrorClass::Ssl, why)
        })?;
        Ok(self.client.get_or_init(|| client).clone())
    }
}

/// An HTTP client for `url` that trusts `caFile` besides the platform's roots, follows no
/// redirect and goes through the credentials' proxy for it. `Err` says why it cannot be built.
fn build_client(credentials: &Credentials, url: &str) -> Result<reqwest::Client, String> {
    let mut builder = crate::http::client_builder()
        .user_agent(concat!("git/2.0 (fleetgate/", env!("CARGO_PKG_VERSION"), ")"))
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(Duration::from_secs(30))
        // Per read: a large pack may take long, a server that stops sending may not.
        .read_timeout(Duration::from_secs(120))
        .no_proxy();
    if let Some(proxy) = credentials.proxy.for_url(url) {
        builder = builder.proxy(reqwest::Proxy::all(proxy).map_err(|e| format!("the proxy {proxy}: {e}"))?);
    }
    if let Some(ca_file) = &credentials.ca_file {
        let pem = std::fs::read(ca_file).map_err(|e| format!("reading caFile {}: {e}", ca_file.display()))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem)
            .ok()
            .filter(|certs| !certs.is_empty())
            .ok_or_else(|| format!("caFile {} holds no PEM certificate", ca_file.display()))?;
        for cert in certs {
            builder = builder.add_root_certificate(cert);
        }
    }
    builder.build().map_err(|e| crate::model::error_chain(&e))
}

impl SmartSubtransport for Https {
    fn action(&self, url: &str, action: Service) -> Result<Box<dyn SmartSubtransportStream>, git2::Error> {
        let (service, listing) = match action {
            Service::UploadPackLs => ("git-upload-pack", true),
            Service::UploadPack => ("git-upload-pack", false),
            Service::ReceivePackLs => ("git-receive-pack", true),
            Service::ReceivePack => ("git-receive-pack", false),
        };
        let base = url.trim_end_matches('/');
        let url = if listing { format!("{base}/info/refs?service={service}") } else { format!("{base}/{service}") };
        Ok(Box::new(Exchange {
            client: self.client(&url)?,
            credentials: self.credentials.clone(),
            shown: crate::model::redact_userinfo(&url),
            url,
            service,
            listing,
            request: Vec::new(),
            response: None,
        }))
    }

    fn close(&self) -> Result<(), git2::Error> {
        Ok(())
    }
}

/// One request and its answer: libgit2 writes the request body (a POST), then reads the answer.
struct Exchange {
    client: reqwest::Client,
    credentials: Arc<Credentials>,
    url: String,
    /// `url` as messages show it: a token in its user info is not repeated in logs and `/readyz`.
    shown: String,
    service: &'static str,
    /// GET `info/refs` (the refs advertised) rather than POST to the service.
    listing: bool,
    request: Vec<u8>,
    response: Option<Body>,
}

/// The answer's body as it arrives, and what of it was not read yet.
struct Body {
    chunks: tokio::sync::mpsc::Receiver<Result<Bytes, reqwest::Error>>,
    unread: Bytes,
}

/// What the runtime thread tells the reader first: the answer's status and headers.
type Head = Result<(reqwest::StatusCode, reqwest::header::HeaderMap), reqwest::Error>;

impl Exchange {
    fn send(&mut self) -> io::Result<Body> {
        let body = Bytes::from(std::mem::take(&mut self.request));
        let mut auth = self.credentials.token_auth().map(|(user, token)| (user.to_string(), token.to_string()));
        let mut asked_helpers = false;
        loop {
            let (head, chunks) = self.request(body.clone(), auth.clone())?;
            let (status, headers) = head.map_err(|e| failed(&self.shown, e))?;
            let header = |name| headers.get(name).and_then(|v: &reqwest::header::HeaderValue| v.to_str().ok());
            if status == reqwest::StatusCode::UNAUTHORIZED {
                if auth.is_none() && self.credentials.git_helpers && !asked_helpers {
                    asked_helpers = true;
                    auth = self.helper_credentials();
                    if auth.is_some() {
                        continue;
                    }
                }
                return Err(io::Error::other(if auth.is_some() {
                    format!("{}: the remote rejected the configured credentials (HTTP 401)", self.shown)
                } else {
                    format!("{}: the remote asks for credentials and none are configured (HTTP 401)", self.shown)
                }));
            }
            if status.is_redirection() {
                return Err(io::Error::other(format!(
                    "{}: the server redirects (HTTP {status}) to {}; fleetgate follows no redirect, which would take \
                     the token along: give the repo's URL as the redirect names it",
                    self.shown,
                    header(reqwest::header::LOCATION).unwrap_or("nowhere"),
                )));
            }
            if !status.is_success() {
                return Err(io::Error::other(format!("{}: the server answered HTTP {status}", self.shown)));
            }
            let expected = if self.listing {
                format!("application/x-{}-advertisement", self.service)
            } else {
                format!("application/x-{}-result", self.service)
            };
            let content_type = header(reqwest::header::CONTENT_TYPE);
            if content_type != Some(expected.as_str()) {
                return Err(io::Error::other(format!(
                    "{}: not a Git smart HTTP server (answered {} instead of {expected}); check the repo URL",
                    self.shown,
                    content_type.unwrap_or("no content type"),
                )));
            }
            return Ok(Body { chunks, unread: Bytes::new() });
        }
    }

    /// Sends the request on the runtime thread and waits for the answer's status line; its body
    /// follows through the channel returned.
    fn request(
        &self,
        body: Bytes,
        auth: Option<(String, String)>,
    ) -> io::Result<(Head, tokio::sync::mpsc::Receiver<Result<Bytes, reqwest::Error>>)> {
        use reqwest::header::{ACCEPT, CONTENT_TYPE};
        let mut request = if self.listing {
            self.client.get(&self.url)
        } else {
            self.client
                .post(&self.url)
                .header(CONTENT_TYPE, format!("application/x-{}-request", self.service))
                .header(ACCEPT, format!("application/x-{}-result", self.service))
                .body(body)
        };
        if let Some((user, password)) = auth {
            request = request.basic_auth(user, Some(password));
        }
        let (head_tx, head_rx) = futures::channel::oneshot::channel::<Head>();
        // A few chunks ahead of the reader, no more: the rest waits in the socket.
        let (chunk_tx, chunks) = tokio::sync::mpsc::channel(4);
        runtime()?.spawn(async move {
            let mut response = match request.send().await {
                Ok(response) => response,
                Err(e) => return drop(head_tx.send(Err(e))),
            };
            if head_tx.send(Ok((response.status(), response.headers().clone()))).is_err() {
                return;
            }
            loop {
                let chunk = response.chunk().await.transpose();
                let Some(chunk) = chunk else { return };
                let last = chunk.is_err();
                // The reader gone (libgit2 stopped reading): drop the answer and its connection.
                if chunk_tx.send(chunk).await.is_err() || last {
                    return;
                }
            }
        });
        let head = futures::executor::block_on(head_rx)
            .map_err(|_| io::Error::other(format!("{}: the HTTP request was dropped", self.shown)))?;
        Ok((head, chunks))
    }

    /// Git's credential helpers' user and password for the URL, as `git` would ask them.
    fn helper_credentials(&self) -> Option<(String, String)> {
        let config = git2::Config::open_default().ok()?;
        let user = reqwest::Url::parse(&self.url).ok().map(|u| u.username().to_string()).filter(|u| !u.is_empty());
        git2::CredentialHelper::new(&self.url).config(&config).username(user.as_deref()).execute()
    }
}

/// `e`, a request to `url` failing, as the error libgit2 reports; a certificate refused is
/// recorded as the refusal it is.
fn failed(url: &str, e: reqwest::Error) -> io::Error {
    let refused = refused_certificate(&e);
    let message = format!("{url}: {}", crate::model::error_chain(&e.without_url()));
    if refused {
        super::access::record_refusal(format!("the server's TLS certificate was refused: {message}"));
    }
    io::Error::other(message)
}

/// Whether `e` is rustls refusing the server's certificate (rather than a network failure).
fn refused_certificate(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(e);
    while let Some(mut s) = source {
        // An `io::Error`'s `source()` skips the error it wraps (itself an `io::Error` at times).
        while let Some(inner) = s.downcast_ref::<io::Error>().and_then(io::Error::get_ref) {
            s = inner;
        }
        if let Some(tls) = s.downcast_ref::<rustls::Error>() {
            return matches!(tls, rustls::Error::InvalidCertificate(_));
        }
        source = s.source();
    }
    false
}

impl Read for Exchange {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.response.is_none() {
            self.response = Some(self.send()?);
        }
        let Some(body) = self.response.as_mut() else { return Ok(0) };
        while body.unread.is_empty() {
            match futures::executor::block_on(body.chunks.recv()) {
                None => return Ok(0),
                Some(Ok(chunk)) => body.unread = chunk,
                Some(Err(e)) => return Err(failed(&self.shown, e)),
            }
        }
        let n = buf.len().min(body.unread.len());
        buf[..n].copy_from_slice(&body.unread.split_to(n));
        Ok(n)
    }
}

impl Write for Exchange {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.request.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The runtime HTTPS requests run on: one thread, started by the first connection, idle (parked)
/// between connections.
fn runtime() -> io::Result<tokio::runtime::Handle> {
    static RUNTIME: Mutex<Option<tokio::runtime::Handle>> = Mutex::new(None);
    let mut handle = RUNTIME.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(handle) = &*handle {
        return Ok(handle.clone());
    }
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let started = runtime.handle().clone();
    std::thread::Builder::new()
        .name("git-https".into())
        .spawn(move || runtime.block_on(std::future::pending::<()>()))?;
    *handle = Some(started.clone());
    Ok(started)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_certificate_refused_is_found_inside_the_io_errors_that_carry_it() {
        use rustls::{CertificateError, Error as Tls};
        // As hyper-rustls hands it up: rustls's error in an io::Error, at times in another one.
        let wrapped = |tls: Tls| io::Error::other(io::Error::new(io::ErrorKind::InvalidData, tls));
        assert!(refused_certificate(&wrapped(Tls::InvalidCertificate(CertificateError::UnknownIssuer))));
        assert!(refused_certificate(&wrapped(Tls::InvalidCertificate(CertificateError::NotValidForName))));
        assert!(!refused_certificate(&wrapped(Tls::DecryptError)), "a broken handshake is no refusal");
        assert!(!refused_certificate(&io::Error::from(io::ErrorKind::ConnectionReset)));
    }
}
