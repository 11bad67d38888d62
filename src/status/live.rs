//! `fleetgate status --serve ADDR`: the fleet page ([`super::html`]) served live and read-only.
//!
//! The caller's refresh loop re-reads the repo and hands each new matrix to [`LivePage::publish`];
//! a matrix that differs from the last one moves the page's *generation*. The router answers GET
//! only — any other method is 405, so nothing reached through the page can change the fleet:
//!
//! * `/` — the page, narrowed like the terminal's flags by the query `?wave=W&cluster=C&state=S&l=K=V`
//!   (each repeatable; a deep link), failures and stale clusters first; `?q=TEXT` is the page's
//!   own filter box and `#CLUSTER/RELEASE` selects a cell, both applied in the browser;
//! * `/generation?after=N` — the current generation, as soon as it differs from N, else after
//!   [`HOLD`] (a long poll: the page asks again at once, so a change shows within one refresh of
//!   the repo, without reloading).

use super::html::{HtmlOptions, render_html};
use super::matrix::{Matrix, RowFilter, StateFilter, parse_label};
use axum::Router;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How long `/generation` holds a request that has nothing new to say.
pub const HOLD: Duration = Duration::from_secs(20);

/// What the page shows now: the newest matrix and its generation (0: none yet).
#[derive(Debug, Clone, Default)]
struct Shown {
    generation: u64,
    matrix: Option<Matrix>,
}

/// The live page's state, shared by the refresh loop and the server.
#[derive(Clone)]
pub struct LivePage {
    shown: watch::Sender<Shown>,
    opts: HtmlOptions,
}

impl LivePage {
    /// A page with nothing to show yet, rendered with `opts` (commit links).
    pub fn new(opts: HtmlOptions) -> LivePage {
        LivePage { shown: watch::Sender::new(Shown::default()), opts }
    }

    /// Shows `matrix`; watchers hear of it only when it differs from the one shown.
    pub fn publish(&self, matrix: Matrix) {
        self.shown.send_if_modified(|shown| {
            if shown.matrix.as_ref() == Some(&matrix) {
                return false;
            }
            shown.generation += 1;
            shown.matrix = Some(matrix);
            true
        });
    }

    /// The routes (GET only).
    pub fn router(self) -> Router {
        Router::new().route("/", get(page)).route("/generation", get(generation)).with_state(Arc::new(self))
    }

    /// Binds `addr` and serves until the returned task is dropped or aborted.
    ///
    /// # Errors
    /// The address cannot be bound.
    pub async fn serve(self, addr: SocketAddr) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let local = listener.local_addr()?;
        let app = self.router();
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::warn!(error = %e, "the live page's server stopped");
            }
        });
        Ok((local, task))
    }
}

/// The query of `/`: repeated keys as pairs.
fn row_filter(query: &[(String, String)]) -> Result<RowFilter, String> {
    let mut filter = RowFilter::default();
    for (key, value) in query {
        match key.as_str() {
            "wave" => filter.waves.push(value.clone()),
            "cluster" => filter.clusters.push(value.clone()),
            "state" => filter.states.push(value.parse::<StateFilter>().map_err(|e| e.to_string())?),
            "l" => filter.labels.push(parse_label(value).map_err(|e| e.to_string())?),
            // `q` is the page's own filter box; anything else is not ours to refuse.
            _ => {}
        }
    }
    Ok(filter)
}

async fn page(State(live): State<Arc<LivePage>>, Query(query): Query<Vec<(String, String)>>) -> Response {
    let filter = match row_filter(&query) {
        Ok(f) => f,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response(),
    };
    let shown = live.shown.borrow().clone();
    let Some(mut matrix) = shown.matrix else {
        return (StatusCode::SERVICE_UNAVAILABLE, "the fleet repo has not been read yet; try again in a moment\n")
            .into_response();
    };
    if let Err(e) = matrix.select(&filter, None) {
        return (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response();
    }
    let opts = HtmlOptions { live: Some(shown.generation), ..live.opts.clone() };
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8"), (header::CACHE_CONTROL, "no-store")],
        render_html(&matrix, &opts),
    )
        .into_response()
}

#[derive(serde::Deserialize)]
struct After {
    after: Option<u64>,
}

async fn generation(State(live): State<Arc<LivePage>>, Query(q): Query<After>) -> Response {
    let mut rx = live.shown.subscribe();
    let after = q.after.unwrap_or(0);
    let moved = tokio::time::timeout(HOLD, rx.wait_for(|s| s.generation != after)).await;
    let now = match moved {
        Ok(Ok(s)) => s.generation,
        // Held long enough (or shutting down): the same generation, asked again at once.
        _ => live.shown.borrow().generation,
    };
    ([(header::CACHE_CONTROL, "no-store")], format!("{now}\n")).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_query_narrows_like_the_terminals_flags() {
        let q = |pairs: &[(&str, &str)]| {
            row_filter(&pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Vec<_>>())
        };
        let f =
            q(&[("wave", "prod"), ("cluster", "a"), ("cluster", "b"), ("state", "stale"), ("l", "tier=1"), ("q", "x")])
                .unwrap();
        assert_eq!(f.waves, ["prod"]);
        assert_eq!(f.clusters, ["a", "b"]);
        assert_eq!(f.states, [StateFilter::Stale]);
        assert_eq!(f.labels, [("tier".to_string(), "1".to_string())]);
        assert!(q(&[("state", "exploded")]).unwrap_err().contains("--state \"exploded\""));
        assert!(q(&[("l", "novalue")]).is_err());
    }
}
