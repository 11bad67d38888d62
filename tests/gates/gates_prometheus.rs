//! Prometheus gates against a real Prometheus (Debian's package) scraping a metrics endpoint this
//! test serves and changes: an operator-like service with request counters, a latency histogram
//! and reconcile-time summary, fed 10 times a second at figures the test sets.
//!
//! These policies hold only Prometheus gates, so the runner's Kubernetes client (pointed at a
//! closed port) is never called; a Kubernetes call would turn a gate unknown and fail the test.

use fleetgate::gates::{
    BakeVerdict, Baseline, GateEvaluation, GateRunner, OperatorTarget, PrometheusEndpoints, Verdict,
};
use fleetgate::model::{GatePolicy, GatePolicySpec, parse_document};
use fleetgate_testenv::Prometheus;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The figures the fake service produces; the test changes them.
#[derive(Debug, Clone, Copy)]
struct Figures {
    error_ratio: f64,
    latency_seconds: f64,
    reconcile_seconds: f64,
}

#[derive(Default)]
struct Counters {
    ok: u64,
    errors: u64,
    /// Cumulative histogram bucket counts, one per `BUCKETS` entry, plus +Inf last.
    buckets: Vec<u64>,
    reconcile_sum: f64,
    reconcile_count: u64,
}

const BUCKETS: [f64; 6] = [0.05, 0.1, 0.25, 0.5, 1.0, 2.5];

struct FakeService {
    figures: Arc<Mutex<Figures>>,
    addr: SocketAddr,
}

impl FakeService {
    async fn start(f: Figures) -> FakeService {
        let figures = Arc::new(Mutex::new(f));
        let counters = Arc::new(Mutex::new(Counters { buckets: vec![0; BUCKETS.len() + 1], ..Default::default() }));
        // 100 requests and 10 reconciles per tick, 10 ticks a second, at the current figures.
        let (fig, cnt) = (figures.clone(), counters.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            loop {
                tick.tick().await;
                let f = *fig.lock().unwrap();
                let mut c = cnt.lock().unwrap();
                let errors = (100.0 * f.error_ratio).round() as u64;
                c.errors += errors;
                c.ok += 100 - errors;
                for (i, le) in BUCKETS.iter().chain([&f64::INFINITY]).enumerate() {
                    if f.latency_seconds <= *le {
                        c.buckets[i] += 100;
                    }
                }
                c.reconcile_sum += 10.0 * f.reconcile_seconds;
                c.reconcile_count += 10;
            }
        });
        let app = axum::Router::new().route(
            "/metrics",
            axum::routing::get(move || {
                let c = counters.clone();
                async move { render(&c.lock().unwrap()) }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        FakeService { figures, addr }
    }

    fn set(&self, change: impl FnOnce(&mut Figures)) {
        change(&mut self.figures.lock().unwrap());
    }
}

fn render(c: &Counters) -> String {
    let mut out = String::new();
    out.push_str("# TYPE http_requests_total counter\n");
    out.push_str(&format!(
        "http_requests_total{{code=\"200\"}} {}\nhttp_requests_total{{code=\"500\"}} {}\n",
        c.ok, c.errors
    ));
    out.push_str("# TYPE http_request_duration_seconds histogram\n");
    for (i, le) in BUCKETS.iter().map(|b| b.to_string()).chain(["+Inf".to_string()]).enumerate() {
        out.push_str(&format!("http_request_duration_seconds_bucket{{le=\"{le}\"}} {}\n", c.buckets[i]));
    }
    let total = c.buckets[BUCKETS.len()];
    out.push_str(&format!("http_request_duration_seconds_count {total}\n"));
    out.push_str("# TYPE controller_reconcile_time_seconds summary\n");
    out.push_str(&format!(
        "controller_reconcile_time_seconds_sum {}\ncontroller_reconcile_time_seconds_count {}\n",
        c.reconcile_sum, c.reconcile_count
    ));
    out
}

const ERROR_RATE: &str = r#"sum(rate(http_requests_total{code=~"5.."}[5s])) / sum(rate(http_requests_total[5s]))"#;
const P99: &str = "histogram_quantile(0.99, sum(rate(http_request_duration_seconds_bucket[5s])) by (le))";
const RECONCILE: &str =
    "sum(rate(controller_reconcile_time_seconds_sum[5s])) / sum(rate(controller_reconcile_time_seconds_count[5s]))";

/// A policy whose Prometheus gates query the agent's endpoint `monitoring` (see [`endpoints`]).
fn policy(bake: &str, gates: &str) -> GatePolicySpec {
    let text = format!(
        "apiVersion: fleetgate.io/v1alpha1\nkind: GatePolicy\nmetadata: {{name: t}}\nspec:\n  bakeTime: {bake}\n  interval: 1s\n  \
         callTimeout: 3s\n  prometheus: monitoring\n  gates:\n{gates}"
    );
    let p: GatePolicy = parse_document("policy.yaml", &text, "GatePolicy").unwrap();
    p.spec
}

fn absolute_gates() -> String {
    format!(
        "    - name: error-rate\n      prometheus: {{query: '{ERROR_RATE}', max: 5%}}\n    \
         - name: p99-latency\n      prometheus: {{query: '{P99}', max: 500ms}}\n"
    )
}

/// A client for a cluster that does not exist: these policies never call it.
fn unused_kube_client() -> kube::Client {
    let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
    kube::Client::try_from(config).unwrap()
}

/// The agent's Prometheus endpoints, as `--prometheus monitoring=URL` gives them.
fn endpoints(prom: &Prometheus) -> PrometheusEndpoints {
    PrometheusEndpoints::new(BTreeMap::from([("monitoring".to_string(), prom.url().parse().unwrap())]))
}

fn runner(policy: GatePolicySpec, prom: &Prometheus, bake_from_now: bool, baseline: Baseline) -> GateRunner {
    let target = OperatorTarget { namespace: "unused".into(), selector: String::new() };
    let applied_at = if bake_from_now { chrono::Utc::now() } else { chrono::Utc::now() - chrono::Duration::hours(1) };
    let endpoints = endpoints(prom);
    let url = endpoints.for_policy(&policy).unwrap();
    GateRunner::new(policy, url, unused_kube_client(), target, applied_at, baseline).unwrap()
}

/// Evaluates until every gate satisfies `done`: after a change, figures move while the 5 s rate
/// window holds old and new samples, then settle exactly on the new value.
async fn evaluate_until(r: &GateRunner, what: &str, done: impl Fn(&GateEvaluation) -> bool) -> Vec<GateEvaluation> {
    let deadline = Instant::now() + Duration::from_secs(45);
    loop {
        let evals = r.evaluate().await;
        if evals.iter().all(&done) {
            return evals;
        }
        assert!(
            Instant::now() < deadline,
            "gates never reached {what}: {:#?}",
            evals.iter().map(ToString::to_string).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn observed(e: &GateEvaluation) -> f64 {
    e.observed.map(|q| q.value).unwrap_or(f64::NAN)
}

fn near(value: f64, want: f64) -> bool {
    (value - want).abs() <= want * 1e-6
}

async fn start(f: Figures) -> (FakeService, Prometheus) {
    let service = FakeService::start(f).await;
    let prom = Prometheus::start(service.addr).await.unwrap();
    prom.wait_for_scrape(Duration::from_secs(30)).await.unwrap();
    (service, prom)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_rate_and_p99_pass_then_fail_when_the_figures_rise() {
    let (service, prom) = start(Figures { error_ratio: 0.02, latency_seconds: 0.3, reconcile_seconds: 0.1 }).await;
    let r = runner(policy("1h", &absolute_gates()), &prom, true, Baseline::default());

    // All latencies in the (250 ms, 500 ms] bucket: histogram_quantile puts P99 at 497.5 ms.
    let evals = evaluate_until(&r, "pass at 2 % / 300 ms", |e| {
        e.is_pass() && (near(observed(e), 0.02) || near(observed(e), 0.4975))
    })
    .await;
    assert_eq!(evals[0].to_string(), "error-rate 2 % ≤ 5 %");
    assert_eq!(evals[1].to_string(), "p99-latency 497.5 ms ≤ 500 ms");

    // A bake over the passing figures ends Passed after the bake time.
    let short = runner(policy("3s", &absolute_gates()), &prom, true, Baseline::default());
    let mut rounds = Vec::new();
    let verdict =
        tokio::time::timeout(Duration::from_secs(30), short.run(|round| rounds.push(round.clone()))).await.unwrap();
    assert!(verdict.passed(), "{verdict}");
    assert!(rounds.len() >= 3, "one round per second for 3 s, got {}", rounds.len());

    service.set(|f| {
        f.error_ratio = 0.10;
        f.latency_seconds = 0.7;
    });
    let evals = evaluate_until(&r, "fail at 10 % / 700 ms", |e| {
        e.verdict == Verdict::Fail && (near(observed(e), 0.10) || near(observed(e), 0.995))
    })
    .await;
    assert_eq!(evals[0].to_string(), "error-rate 10 % > 5 %");
    assert_eq!(evals[1].to_string(), "p99-latency 995 ms > 500 ms");

    // The bake now fails fast, on the first round, naming the gate, figure and threshold.
    let started = Instant::now();
    let verdict = tokio::time::timeout(Duration::from_secs(30), r.run(|_| {})).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(10), "fail fast, not after the 1 h bake");
    let BakeVerdict::Failed { gate, at_bake_end, rounds, .. } = &verdict else { panic!("{verdict}") };
    assert_eq!((gate.gate.as_str(), *at_bake_end, *rounds), ("error-rate", false, 1));
    assert_eq!(verdict.to_string(), "gate error-rate failed: error-rate 10 % > 5 %");
    let json = serde_json::to_value(&verdict).unwrap();
    assert_eq!(json["result"], "failed");
    assert_eq!(json["gate"]["observed"]["value"].as_f64().map(|v| near(v, 0.10)), Some(true));
    assert_eq!(json["gate"]["threshold"]["limit"]["value"], 0.05);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn baseline_relative_gate_passes_at_plus_10_and_fails_at_plus_30_percent() {
    let (service, prom) = start(Figures { error_ratio: 0.0, latency_seconds: 0.1, reconcile_seconds: 0.1 }).await;
    let gates = format!(
        "    - name: reconcile-latency\n      prometheus: {{query: '{RECONCILE}', unit: seconds, maxIncreaseOverBaseline: 20%}}\n"
    );
    let spec = policy("1h", &gates);

    // Before the apply: wait for a steady 100 ms, then sample the baseline.
    let source = fleetgate::gates::PrometheusSource::plain("monitoring", prom.url().parse().unwrap());
    let client = fleetgate::gates::PrometheusClient::new(&source, Duration::from_secs(3)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(45);
    while !client.instant(RECONCILE).await.is_ok_and(|s| s.len() == 1 && near(s[0].value, 0.1)) {
        assert!(Instant::now() < deadline, "reconcile time never settled at 100 ms");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let mut baseline = Baseline::default();
    baseline.sample_metrics(&spec, endpoints(&prom).for_policy(&spec).unwrap()).await.unwrap();
    assert!(near(baseline.metrics["reconcile-latency"], 0.1), "{baseline:?}");

    let r = runner(spec.clone(), &prom, true, baseline);
    service.set(|f| f.reconcile_seconds = 0.11);
    let evals = evaluate_until(&r, "110 ms", |e| near(observed(e), 0.11)).await;
    assert!(evals[0].is_pass(), "{}", evals[0]);
    assert_eq!(evals[0].to_string(), "reconcile-latency 110 ms ≤ 120 ms (baseline 100 ms + 20 %)");

    service.set(|f| f.reconcile_seconds = 0.13);
    let evals = evaluate_until(&r, "130 ms", |e| near(observed(e), 0.13)).await;
    assert!(evals[0].is_fail(), "{}", evals[0]);
    assert_eq!(evals[0].to_string(), "reconcile-latency 130 ms > 120 ms (baseline 100 ms + 20 %)");

    // Without a baseline the same gate is unknown, and fails only once the bake is over.
    let unsampled = runner(spec, &prom, false, Baseline::default());
    let verdict = tokio::time::timeout(Duration::from_secs(30), unsampled.run(|_| {})).await.unwrap();
    let BakeVerdict::Failed { gate, at_bake_end: true, .. } = &verdict else { panic!("{verdict}") };
    assert_eq!(gate.verdict, Verdict::Unknown { reason: "no baseline: not sampled before the apply".into() });
}
