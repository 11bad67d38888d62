//! Attack: whoever controls what the fleet repo's HTTPS server answers (a compromised proxy in
//! front of it, a repo moved to an address they own, a misconfigured forge) redirects the agent's
//! Git requests to a host of their choosing, hoping the token follows.
//!
//! The repo's server here answers every request with a 302 to the attacker's listener. The fetch
//! must fail with an error that names the redirect and what to do; the token reaches the
//! configured server only, and the listener sees no connection at all. The same over plain
//! `http://`, where libgit2's own transport would have followed the first redirect to another port
//! of the host and handed the token to whoever asked there.

use crate::tls_support;

use fleetgate::source::{Credentials, RetryPolicy, Source};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const TOKEN: &str = "the-agents-git-token";

/// The attacker's listener: counts the connections it gets.
async fn attacker() -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let attacker = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = connections.clone();
    tokio::spawn(async move {
        while listener.accept().await.is_ok() {
            counted.fetch_add(1, Ordering::SeqCst);
        }
    });
    (attacker, connections)
}

/// The repo's server: every request answered with a 302 to `to` (same path), the `Authorization`
/// of each request it got recorded.
fn redirecting_to(to: String) -> (axum::Router, Arc<Mutex<Vec<Option<String>>>>) {
    let seen = Arc::new(Mutex::new(Vec::<Option<String>>::new()));
    let recorded = seen.clone();
    let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
        let auth = req.headers().get("authorization").and_then(|v| v.to_str().ok()).map(str::to_string);
        recorded.lock().unwrap().push(auth);
        let to = format!("{to}{}", req.uri());
        async move { (axum::http::StatusCode::FOUND, [(axum::http::header::LOCATION, to)]) }
    });
    (app, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_gets_neither_the_token_nor_a_connection() {
    let (attacker, connections) = attacker().await;
    let (app, seen) = redirecting_to(format!("https://{attacker}"));
    let dir = tempfile::tempdir().unwrap();
    let pki = tls_support::pki(dir.path(), "repo");
    let server = tls_support::serve(app, &pki).await;
    let url = format!("https://{server}/fleet.git");
    let creds = Credentials { token: Some(TOKEN.into()), ca_file: Some(pki.ca.clone()), ..Credentials::default() };
    assert_refused_and_kept(&url, creds, &format!("https://{attacker}"), seen, connections, dir.path()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_http_redirect_gets_neither_the_token_nor_a_connection() {
    let (attacker, connections) = attacker().await;
    let (app, seen) = redirecting_to(format!("http://{attacker}"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let dir = tempfile::tempdir().unwrap();
    let url = format!("http://{server}/fleet.git");
    let creds = Credentials { token: Some(TOKEN.into()), ..Credentials::default() };
    assert_refused_and_kept(&url, creds, &format!("http://{attacker}"), seen, connections, dir.path()).await;
}

/// A fetch of `url` fails naming the redirect to `attacker`; only the repo's server got the
/// token, the attacker no connection.
async fn assert_refused_and_kept(
    url: &str,
    creds: Credentials,
    attacker: &str,
    seen: Arc<Mutex<Vec<Option<String>>>>,
    connections: Arc<AtomicUsize>,
    dir: &std::path::Path,
) {
    let url = url.to_string();
    let retry = RetryPolicy { attempts: 2, initial: Duration::from_millis(50), max: Duration::from_millis(100) };

    let state = dir.join("state");
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
    assert!(message.contains(&format!("{attacker}/fleet.git/info/refs")), "names where: {message}");
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

/// A repo URL with a token in its user info (`https://user:token@host/…`, which forges accept):
/// the error of a failed fetch, what logs, Events and `/readyz` show, keeps the URL's path and
/// hides the token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_in_the_repo_url_is_not_shown_in_errors() {
    let (app, _) = redirecting_to("http://127.0.0.1:9".to_string());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    for url in [format!("http://oauth2:{TOKEN}@{server}/fleet.git"), format!("http://{TOKEN}@127.0.0.1:9/fleet.git")] {
        let retry = RetryPolicy { attempts: 1, initial: Duration::from_millis(10), max: Duration::from_millis(10) };
        let state = state.clone();
        let err = tokio::task::spawn_blocking(move || {
            Source::open(&url, &state, Credentials::default())?.with_retry(retry).sync().map(drop)
        })
        .await
        .unwrap()
        .expect_err("no repo there");
        let message = fleetgate::model::error_chain(&err);
        println!("{message}");
        assert!(!message.contains(TOKEN), "the token is shown: {message}");
        assert!(message.contains("…@") && message.contains("/fleet.git"), "the URL is still named: {message}");
    }
}
