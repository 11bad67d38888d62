//! Attack: whoever controls what the fleet repo's HTTPS server answers (a compromised proxy in
//! front of it, a repo moved to an address they own, a misconfigured forge) redirects the agent's
//! Git requests to a host of their choosing, hoping the token follows.
//!
//! The repo's server here answers every request with a 302 to the attacker's listener. The fetch
//! must fail with an error that names the redirect and what to do; the token reaches the
//! configured server only, and the listener sees no connection at all.

mod tls_support;

use fleetgate::source::{Credentials, RetryPolicy, Source};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const TOKEN: &str = "the-agents-git-token";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_gets_neither_the_token_nor_a_connection() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let attacker = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = connections.clone();
    tokio::spawn(async move {
        while listener.accept().await.is_ok() {
            counted.fetch_add(1, Ordering::SeqCst);
        }
    });

    // The `Authorization` of each request the repo's server got.
    let seen = Arc::new(Mutex::new(Vec::<Option<String>>::new()));
    let recorded = seen.clone();
    let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
        let auth = req.headers().get("authorization").and_then(|v| v.to_str().ok()).map(str::to_string);
        recorded.lock().unwrap().push(auth);
        let to = format!("https://{attacker}{}", req.uri());
        async move { (axum::http::StatusCode::FOUND, [(axum::http::header::LOCATION, to)]) }
    });
    let dir = tempfile::tempdir().unwrap();
    let pki = tls_support::pki(dir.path(), "repo");
    let server = tls_support::serve(app, &pki).await;
    let url = format!("https://{server}/fleet.git");
    let creds = Credentials { token: Some(TOKEN.into()), ca_file: Some(pki.ca.clone()), ..Credentials::default() };
    let retry = RetryPolicy { attempts: 2, initial: Duration::from_millis(50), max: Duration::from_millis(100) };

    let state = dir.path().join("state");
    let err = tokio::task::spawn_blocking(move || {
        let mut source = Source::open(&url, &state, creds)?.with_retry(retry);
        source.sync().map(drop)
    })
    .await
    .unwrap()
    .expect_err("a redirect is no repo");
    let message = err.to_string();
    println!("{message}");
    assert!(message.contains("redirects (HTTP 302 Found)"), "{message}");
    assert!(message.contains(&format!("https://{attacker}/fleet.git/info/refs")), "names where: {message}");
    assert!(message.contains("follows no redirect"), "says why: {message}");

    let seen = seen.lock().unwrap().clone();
    assert!(!seen.is_empty(), "the repo's server was never asked");
    let basic = |v: &str| v.strip_prefix("Basic ").map(str::to_string);
    for auth in &seen {
        use base64::Engine as _;
        let decoded =
            auth.as_deref().and_then(basic).map(|b| base64::engine::general_purpose::STANDARD.decode(b).unwrap());
        assert_eq!(decoded.as_deref(), Some(format!("git:{TOKEN}").as_bytes()), "the configured server gets the token");
    }
    // Give a connection that was on its way the time to land.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(connections.load(Ordering::SeqCst), 0, "the redirect's target was contacted");
}
