//! Prometheus sources with credentials: a real Prometheus behind an authenticating reverse proxy
//! (TLS with a test CA, a bearer token and a tenant header, as Mimir's gateway wants them).
//! Right credentials: the gate evaluates. Wrong ones: the gate is `unknown` with
//! `401 from source prod-mimir`, never a pass. A policy that names a URL of its own gets no
//! credentials: the proxy never sees the token.

use crate::tls_support;

use fleetgate::gates::{PrometheusAuth, PrometheusClient, PrometheusEndpoints, PrometheusSource};
use fleetgate::model::GatePolicySpec;
use fleetgate_testenv::Prometheus;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

const TOKEN: &str = "good-token";
const TENANT: &str = "team-a";

/// A scrape target with one gauge.
async fn target() -> SocketAddr {
    let app = axum::Router::new()
        .route("/metrics", axum::routing::get(|| async { "# TYPE error_ratio gauge\nerror_ratio 0.02\n" }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// The proxy: TLS (with `pki`'s certificate), then `Authorization: Bearer TOKEN` and
/// `X-Scope-OrgID: TENANT` or 401; forwards the request to `upstream`. Counts requests that
/// carried the right token.
async fn proxy(upstream: String, pki: &tls_support::Pki, authorized: Arc<AtomicUsize>) -> SocketAddr {
    let http = fleetgate::http::client_builder().build().unwrap();
    let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
        let (http, upstream, authorized) = (http.clone(), upstream.clone(), authorized.clone());
        // Read what is needed before any await: the request's body is not Sync.
        let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
        let allowed = header("authorization").as_deref() == Some(&format!("Bearer {TOKEN}"))
            && header("x-scope-orgid").as_deref() == Some(TENANT);
        let path = req.uri().path_and_query().map(|p| p.as_str().to_string()).unwrap_or_default();
        async move {
            if !allowed {
                return (axum::http::StatusCode::UNAUTHORIZED, "no".to_string());
            }
            authorized.fetch_add(1, Ordering::SeqCst);
            let resp = http.get(format!("{upstream}{path}")).send().await.unwrap();
            let status = axum::http::StatusCode::from_u16(resp.status().as_u16()).unwrap();
            (status, resp.text().await.unwrap())
        }
    });
    tls_support::serve(app, pki).await
}

fn policy(prometheus: &str) -> GatePolicySpec {
    serde_saphyr::from_str(&format!(
        "bakeTime: 1m\ninterval: 1s\n{prometheus}gates:\n  - name: error-rate\n    prometheus: {{query: 'max(error_ratio)', max: 5%}}\n"
    ))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_go_only_to_the_agents_named_source() {
    let prom = Prometheus::start(target().await).await.unwrap();
    prom.wait_for_scrape(Duration::from_secs(60)).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let pki = tls_support::pki(dir.path(), "proxy");
    let (ca, token, wrong) = (pki.ca.clone(), dir.path().join("token"), dir.path().join("wrong"));
    std::fs::write(&token, format!("{TOKEN}\n")).unwrap();
    std::fs::write(&wrong, "stolen-guess").unwrap();
    let authorized = Arc::new(AtomicUsize::new(0));
    let addr = proxy(prom.url().trim_end_matches('/').to_string(), &pki, authorized.clone()).await;
    let source = |token_file: &Path| PrometheusSource {
        name: "prod-mimir".into(),
        url: format!("https://127.0.0.1:{}/", addr.port()).parse().unwrap(),
        auth: PrometheusAuth::Bearer { token_file: token_file.to_path_buf() },
        headers: BTreeMap::from([("X-Scope-OrgID".to_string(), TENANT.to_string())]),
        ca_file: Some(ca.clone()),
    };
    let named = policy("prometheus: prod-mimir\n");
    let evaluate = |source: PrometheusSource| {
        let named = named.clone();
        async move {
            let endpoints = PrometheusEndpoints::default().with_sources([source]);
            let chosen = endpoints.for_policy(&named).unwrap().unwrap().clone();
            let client = PrometheusClient::new(&chosen, Duration::from_secs(5)).unwrap();
            client.instant("max(error_ratio)").await
        }
    };

    // Right credentials, through TLS checked against the test CA: the figure comes back.
    let samples = evaluate(source(&token)).await.unwrap();
    assert_eq!(samples.len(), 1);
    assert!((samples[0].value - 0.02).abs() < 1e-9, "{samples:?}");
    let seen = authorized.load(Ordering::SeqCst);
    assert!(seen >= 1);

    // Wrong token: a specific error naming the source, which makes the gate unknown, not a pass.
    let err = evaluate(source(&wrong)).await.unwrap_err().to_string();
    assert!(err.starts_with("401 from source prod-mimir: the credentials were refused"), "{err}");
    assert!(!err.contains("stolen-guess") && !err.contains(TOKEN), "{err}");

    // A policy in the repo that names the proxy's URL itself: ignored, the agent's `default`
    // (which it lacks here) is asked for, so nothing is sent anywhere with the credentials.
    let by_url = policy(&format!("prometheus: {{url: 'https://127.0.0.1:{}/'}}\n", addr.port()));
    let endpoints = PrometheusEndpoints::default().with_sources([source(&token)]);
    let refused = endpoints.for_policy(&by_url).unwrap_err().to_string();
    assert!(
        refused.contains("query Prometheus \"default\", which this agent does not have (it has: prod-mimir)"),
        "{refused}"
    );
    assert_eq!(authorized.load(Ordering::SeqCst), seen, "the token went nowhere else");
}
