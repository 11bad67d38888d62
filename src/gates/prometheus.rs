//! Prometheus gates: instant queries over the HTTP API, compared with an absolute bound or with a
//! baseline sampled before the apply.
//!
//! The servers are the agent's ([`PrometheusEndpoints`], `--prometheus NAME=URL`); a GatePolicy
//! only names one. Errors never carry a response body or a whole URL: they end up in statuses
//! (Git notes anyone can read), Events and logs.

use super::{GateError, GateEvaluation, Threshold};
use crate::model::{
    GatePolicyProblem, GatePolicySpec, PrometheusBound, PrometheusGate, Quantity, Unit, error_chain, redacted_url,
};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// One series of an instant query's result.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// How the agent proves itself to one Prometheus source. The secrets stay in files (mounted
/// Secrets), read when a client is built, so a rotated Secret is picked up by the next bake.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum PrometheusAuth {
    #[default]
    None,
    /// `Authorization: Bearer <the file's content>`.
    Bearer { token_file: PathBuf },
    /// `Authorization: Basic …` of `username` and the file's content.
    Basic { username: String, password_file: PathBuf },
}

/// One of the agent's Prometheus servers (or Mimir/Thanos/Cortex query frontends): where it is
/// and how to talk to it. Only the agent's configuration builds these: nothing from the fleet
/// repo decides where a credential goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrometheusSource {
    /// The logical name policies use (`prometheus: NAME`); errors name the source by it.
    pub name: String,
    /// Base URL; it may carry `user:pw@`, which the HTTP client sends as basic auth.
    pub url: reqwest::Url,
    pub auth: PrometheusAuth,
    /// Extra request headers, e.g. `X-Scope-OrgID` for a Mimir tenant.
    pub headers: BTreeMap<String, String>,
    /// PEM file of the CA(s) the server's certificate is checked against, besides the system's.
    pub ca_file: Option<PathBuf>,
}

impl PrometheusSource {
    /// A source without credentials beyond what `url` carries (`--prometheus NAME=URL`).
    pub fn plain(name: &str, url: reqwest::Url) -> PrometheusSource {
        PrometheusSource {
            name: name.to_string(),
            url,
            auth: PrometheusAuth::None,
            headers: BTreeMap::new(),
            ca_file: None,
        }
    }
}

/// The agent's Prometheus servers by logical name (`--prometheus [NAME=]URL`, a bare URL being
/// [`crate::model::DEFAULT_ENDPOINT`], or `prometheusSources` in the config file with
/// credentials). URLs may carry credentials (`https://user:pw@…`, which the HTTP client sends as
/// basic auth), so they are shown only redacted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrometheusEndpoints(BTreeMap<String, PrometheusSource>);

impl PrometheusEndpoints {
    pub fn new(endpoints: BTreeMap<String, reqwest::Url>) -> PrometheusEndpoints {
        PrometheusEndpoints(endpoints.into_iter().map(|(n, u)| (n.clone(), PrometheusSource::plain(&n, u))).collect())
    }

    /// These endpoints and `sources` (a source replaces an endpoint of the same name).
    pub fn with_sources(mut self, sources: impl IntoIterator<Item = PrometheusSource>) -> PrometheusEndpoints {
        self.0.extend(sources.into_iter().map(|s| (s.name.clone(), s)));
        self
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }

    /// The server `policy`'s `prometheus` gates query: None when it has no such gate.
    ///
    /// # Errors
    /// [`GateError::InvalidPolicy`] ([`GatePolicyProblem::UnknownPrometheus`]) when the policy names
    /// an endpoint this agent does not have: a configuration problem to fix on the agent (or in
    /// the policy), not a gate that fails.
    pub fn for_policy(&self, policy: &GatePolicySpec) -> Result<Option<&PrometheusSource>, GateError> {
        let gates = policy.prometheus_gates();
        if gates.is_empty() {
            return Ok(None);
        }
        let name = policy.prometheus_endpoint();
        match self.0.get(name) {
            Some(source) => Ok(Some(source)),
            None => Err(GateError::InvalidPolicy(vec![GatePolicyProblem::UnknownPrometheus {
                name: name.to_string(),
                gates,
                known: if self.0.is_empty() { "none".to_string() } else { self.names().collect::<Vec<_>>().join(", ") },
            }])),
        }
    }
}

/// Longest text from Prometheus' own error fields that a message repeats.
const MAX_ERROR_TEXT: usize = 200;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PrometheusError {
    #[error("Prometheus did not answer within {0:?}")]
    Timeout(Duration),
    /// `url` is redacted ([`redacted_url`]), `reason` the client's error chain without the URL.
    #[error("cannot reach Prometheus at {url}: {reason}")]
    Unreachable { url: String, reason: String },
    /// The body is not kept: it is not the API's JSON, so nothing in it is fit for a status.
    #[error("Prometheus answered HTTP {status} without an API answer (the body is not shown)")]
    Http { status: u16 },
    /// 401/403: the source refused the agent's credentials (or their absence).
    #[error(
        "{status} from source {source_name}: the credentials were refused; check the source's bearerTokenFile, \
         basicAuth and headers in the agent's configuration"
    )]
    Refused { source_name: String, status: u16 },
    /// A credential or CA file of the source cannot be used; `what` says which, never its content.
    #[error("source {source_name}: {what}")]
    Setup { source_name: String, what: String },
    #[error("Prometheus refused the query ({error_type}): {error}")]
    Query { error_type: String, error: String },
    #[error("unexpected answer from Prometheus: {0}")]
    Decode(String),
    #[error("the query returned a range vector; gates need an instant vector or a scalar")]
    RangeVector,
}

/// A Prometheus HTTP API client whose every request has a timeout.
#[derive(Debug, Clone)]
pub struct PrometheusClient {
    http: reqwest::Client,
    base: reqwest::Url,
    source: String,
    timeout: Duration,
}

impl PrometheusClient {
    /// A client of `source` (its base URL, credentials, headers, CA); `timeout` bounds each query.
    ///
    /// # Errors
    /// [`PrometheusError::Setup`] when a credential or CA file cannot be read or used,
    /// [`PrometheusError::Unreachable`] when the HTTP client cannot be built.
    pub fn new(source: &PrometheusSource, timeout: Duration) -> Result<PrometheusClient, PrometheusError> {
        let url = &source.url;
        let mut base = url.clone();
        if !base.path().ends_with('/') {
            let p = format!("{}/", base.path());
            base.set_path(&p);
        }
        let setup = |what: String| PrometheusError::Setup { source_name: source.name.clone(), what };
        let mut builder = crate::http::client_builder().timeout(timeout).default_headers(source_headers(source)?);
        if source.auth != PrometheusAuth::None {
            // A redirect would carry the credentials to wherever the answer points.
            builder = builder.redirect(reqwest::redirect::Policy::none());
        }
        if let Some(ca) = &source.ca_file {
            let pem = std::fs::read(ca).map_err(|e| setup(format!("reading caFile {}: {e}", ca.display())))?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|_| setup(format!("caFile {} holds no PEM certificate", ca.display())))?;
            for cert in certs {
                builder = builder.add_root_certificate(cert);
            }
        }
        let http = builder.build().map_err(|e| PrometheusError::Unreachable {
            url: redacted_url(url),
            reason: error_chain(&e.without_url()),
        })?;
        Ok(PrometheusClient { http, base, source: source.name.clone(), timeout })
    }

    /// Runs an instant query at the current time.
    pub async fn instant(&self, query: &str) -> Result<Vec<Sample>, PrometheusError> {
        let mut url = self.base.join("api/v1/query").map_err(|e| PrometheusError::Decode(e.to_string()))?;
        url.query_pairs_mut().append_pair("query", query);
        let send = self.http.get(url).send();
        let resp = match tokio::time::timeout(self.timeout, send).await {
            Err(_) => return Err(PrometheusError::Timeout(self.timeout)),
            Ok(Err(e)) if e.is_timeout() => return Err(PrometheusError::Timeout(self.timeout)),
            Ok(Err(e)) => {
                return Err(PrometheusError::Unreachable {
                    url: redacted_url(&self.base),
                    reason: error_chain(&e.without_url()),
                });
            }
            Ok(Ok(r)) => r,
        };
        let status = resp.status();
        if matches!(status.as_u16(), 401 | 403) {
            return Err(PrometheusError::Refused { source_name: self.source.clone(), status: status.as_u16() });
        }
        let body = match tokio::time::timeout(self.timeout, resp.text()).await {
            Err(_) => return Err(PrometheusError::Timeout(self.timeout)),
            Ok(Err(e)) => return Err(PrometheusError::Decode(error_chain(&e.without_url()))),
            Ok(Ok(b)) => b,
        };
        parse_response(status.as_u16(), &body)
    }
}

/// The headers every request to `source` carries: its own, then `Authorization` from its
/// credential file (marked sensitive, so it never shows in debug output).
fn source_headers(source: &PrometheusSource) -> Result<reqwest::header::HeaderMap, PrometheusError> {
    use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderName, HeaderValue};
    let setup = |what: String| PrometheusError::Setup { source_name: source.name.clone(), what };
    let read = |what: &str, path: &PathBuf| {
        std::fs::read_to_string(path)
            .map(|s| s.trim_end_matches(['\r', '\n']).to_string())
            .map_err(|e| setup(format!("reading {what} {}: {e}", path.display())))
    };
    let mut headers = HeaderMap::new();
    for (name, value) in &source.headers {
        let name =
            HeaderName::from_bytes(name.as_bytes()).map_err(|_| setup(format!("header name {name:?} is not valid")))?;
        let value =
            HeaderValue::from_str(value).map_err(|_| setup(format!("header {name} has a value HTTP cannot carry")))?;
        headers.insert(name, value);
    }
    let authorization = match &source.auth {
        PrometheusAuth::None => None,
        PrometheusAuth::Bearer { token_file } => Some(format!("Bearer {}", read("bearerTokenFile", token_file)?)),
        PrometheusAuth::Basic { username, password_file } => {
            use base64::Engine;
            let pair = format!("{username}:{}", read("basicAuth.passwordFile", password_file)?);
            Some(format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(pair)))
        }
    };
    if let Some(text) = authorization {
        let mut value = HeaderValue::from_str(&text)
            .map_err(|_| setup("the credential holds characters HTTP cannot carry".into()))?;
        value.set_sensitive(true);
        headers.insert(AUTHORIZATION, value);
    }
    Ok(headers)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ApiResponse {
    status: String,
    #[serde(default)]
    data: Option<ApiData>,
    #[serde(default)]
    error_type: Option<String>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ApiData {
    result_type: String,
    result: serde_json::Value,
}

#[derive(Deserialize)]
struct VectorItem {
    #[serde(default)]
    metric: BTreeMap<String, String>,
    value: (f64, String),
}

/// Reads the body of `/api/v1/query`. Prometheus reports query errors as HTTP 400/422 with a JSON
/// body, so the body is read before the status.
fn parse_response(status: u16, body: &str) -> Result<Vec<Sample>, PrometheusError> {
    let resp: ApiResponse = match serde_json::from_str(body) {
        Ok(r) => r,
        Err(_) if status != 200 => return Err(PrometheusError::Http { status }),
        Err(e) => return Err(PrometheusError::Decode(e.to_string())),
    };
    if resp.status != "success" {
        // The API's own error fields (a PromQL parse error names the query's position); cut short.
        return Err(PrometheusError::Query {
            error_type: cut(&resp.error_type.unwrap_or_default()),
            error: cut(&resp.error.unwrap_or_default()),
        });
    }
    let data = resp.data.ok_or_else(|| PrometheusError::Decode("no data".into()))?;
    let value =
        |s: &str| parse_value(s).ok_or_else(|| PrometheusError::Decode(format!("value {:?} is not a number", cut(s))));
    match data.result_type.as_str() {
        "vector" => {
            let items: Vec<VectorItem> =
                serde_json::from_value(data.result).map_err(|e| PrometheusError::Decode(e.to_string()))?;
            items.into_iter().map(|i| Ok(Sample { labels: i.metric, value: value(&i.value.1)? })).collect()
        }
        "scalar" => {
            let (_, v): (f64, String) =
                serde_json::from_value(data.result).map_err(|e| PrometheusError::Decode(e.to_string()))?;
            Ok(vec![Sample { labels: BTreeMap::new(), value: value(&v)? }])
        }
        "matrix" => Err(PrometheusError::RangeVector),
        other => Err(PrometheusError::Decode(format!("result type {other:?}"))),
    }
}

fn cut(s: &str) -> String {
    match s.char_indices().nth(MAX_ERROR_TEXT) {
        Some((end, _)) => format!("{}…", &s[..end]),
        None => s.to_string(),
    }
}

/// Prometheus writes special values as `NaN`, `+Inf`, `-Inf`.
fn parse_value(s: &str) -> Option<f64> {
    match s {
        "NaN" => Some(f64::NAN),
        "+Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        _ => s.parse().ok(),
    }
}

/// The unit the query's value is shown in: the gate's `unit`, else its bound's.
fn display_unit(gate: &PrometheusGate) -> Unit {
    gate.unit.unwrap_or(match gate.bound() {
        Some(PrometheusBound::Max(q) | PrometheusBound::Min(q)) => q.unit,
        _ => Unit::Number,
    })
}

/// The figure that counts among several series: the highest for upper bounds, the lowest for a
/// lower bound. NaN series (a ratio with no traffic) are skipped.
pub(crate) fn worst(gate: &PrometheusGate, samples: &[Sample]) -> Result<Sample, String> {
    let numbers: Vec<&Sample> = samples.iter().filter(|s| !s.value.is_nan()).collect();
    let lower_bound = matches!(gate.bound(), Some(PrometheusBound::Min(_)));
    let pick = numbers.into_iter().reduce(|a, b| {
        let b_worse = if lower_bound { b.value < a.value } else { b.value > a.value };
        if b_worse { b } else { a }
    });
    match pick {
        Some(s) => Ok(s.clone()),
        None if samples.is_empty() => Err("query returned no samples".into()),
        None => Err("query returned only NaN (no traffic to compute a ratio from?)".into()),
    }
}

/// What the policy compares a query's value with; `baseline` is the relative gate's value before
/// the apply (`Err` says why there is none).
pub(crate) fn threshold(gate: &PrometheusGate, baseline: Option<Result<f64, &str>>) -> Threshold {
    let unit = display_unit(gate);
    match gate.bound() {
        Some(PrometheusBound::Max(limit)) => Threshold::AtMost { limit },
        Some(PrometheusBound::Min(limit)) => Threshold::AtLeast { limit },
        Some(PrometheusBound::MaxIncreaseOverBaseline(increase)) => match baseline {
            Some(Ok(b)) => Threshold::AtMostOverBaseline {
                baseline: Quantity { value: b, unit },
                increase,
                limit: Quantity { value: b * (1.0 + increase.value), unit },
            },
            _ => Threshold::IncreaseOverMissingBaseline { increase },
        },
        // `validate` refuses such policies; keep the evaluation honest anyway.
        None => Threshold::Expect { what: "exactly one bound".into() },
    }
}

/// Judges one query result against the gate's bound.
pub(crate) fn judge(
    name: &str,
    gate: &PrometheusGate,
    result: Result<Vec<Sample>, PrometheusError>,
    baseline: Option<Result<f64, &str>>,
) -> GateEvaluation {
    let threshold = threshold(gate, baseline);
    if let Some(Err(reason)) = baseline {
        return GateEvaluation::unknown(name, format!("no baseline: {reason}"), threshold);
    }
    let samples = match result {
        Ok(s) => s,
        Err(e) => return GateEvaluation::unknown(name, e.to_string(), threshold),
    };
    match worst(gate, &samples) {
        Err(reason) => GateEvaluation::unknown(name, reason, threshold),
        Ok(s) => {
            let detail =
                (samples.len() > 1).then(|| format!("worst of {} series: {}", samples.len(), labels(&s.labels)));
            GateEvaluation::compare(name, Quantity { value: s.value, unit: display_unit(gate) }, threshold, detail)
        }
    }
}

fn labels(l: &BTreeMap<String, String>) -> String {
    let inner: Vec<String> = l.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
    format!("{{{}}}", inner.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn gate(bound: &str, q: &str) -> PrometheusGate {
        let q: Quantity = q.parse().unwrap();
        let mut g =
            PrometheusGate { query: "x".into(), unit: None, max: None, min: None, max_increase_over_baseline: None };
        match bound {
            "max" => g.max = Some(q),
            "min" => g.min = Some(q),
            _ => {
                g.max_increase_over_baseline = Some(q);
                g.unit = Some(Unit::Seconds);
            }
        }
        g
    }

    fn samples(values: &[f64]) -> Vec<Sample> {
        values
            .iter()
            .enumerate()
            .map(|(i, v)| Sample { labels: BTreeMap::from([("pod".to_string(), format!("p{i}"))]), value: *v })
            .collect()
    }

    #[rstest]
    #[case::error_rate_ok(gate("max", "5%"), samples(&[0.02]), None, "error-rate 2 % ≤ 5 %")]
    #[case::error_rate_high(gate("max", "5%"), samples(&[0.073]), None, "error-rate 7.3 % > 5 %")]
    #[case::worst_series_counts(gate("max", "500ms"), samples(&[0.1, 0.62, f64::NAN]), None, "error-rate 620 ms > 500 ms — worst of 3 series: {pod=\"p1\"}")]
    #[case::lower_bound_takes_the_lowest(gate("min", "99%"), samples(&[0.999, 0.95]), None, "error-rate 95 % < 99 % — worst of 2 series: {pod=\"p1\"}")]
    #[case::baseline_plus_10(gate("inc", "20%"), samples(&[0.11]), Some(Ok(0.1)), "error-rate 110 ms ≤ 120 ms (baseline 100 ms + 20 %)")]
    #[case::baseline_plus_30(gate("inc", "20%"), samples(&[0.13]), Some(Ok(0.1)), "error-rate 130 ms > 120 ms (baseline 100 ms + 20 %)")]
    #[case::no_baseline(gate("inc", "20%"), samples(&[0.13]), Some(Err("query returned no samples")), "error-rate unknown (no baseline: query returned no samples; threshold ≤ baseline + 20 % (no baseline))")]
    #[case::empty(gate("max", "5%"), samples(&[]), None, "error-rate unknown (query returned no samples; threshold ≤ 5 %)")]
    #[case::only_nan(gate("max", "5%"), samples(&[f64::NAN]), None, "error-rate unknown (query returned only NaN (no traffic to compute a ratio from?); threshold ≤ 5 %)")]
    fn query_results_are_judged(
        #[case] g: PrometheusGate,
        #[case] s: Vec<Sample>,
        #[case] baseline: Option<Result<f64, &str>>,
        #[case] want: &str,
    ) {
        assert_eq!(judge("error-rate", &g, Ok(s), baseline).to_string(), want);
    }

    #[tokio::test]
    async fn unreachable_servers_are_named_without_credentials_or_path() {
        let url: reqwest::Url = "http://scraper:s3cret@127.0.0.1:9/prom/?token=t0k".parse().unwrap();
        let err = PrometheusClient::new(&PrometheusSource::plain("default", url), Duration::from_secs(2))
            .unwrap()
            .instant("up")
            .await
            .unwrap_err();
        let text = err.to_string();
        assert!(text.starts_with("cannot reach Prometheus at http://127.0.0.1:9/…: "), "{text}");
        for secret in ["s3cret", "t0k", "scraper", "/prom", "query="] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
    }

    #[test]
    fn query_errors_are_cut_short() {
        let body = format!(r#"{{"status":"error","errorType":"bad_data","error":"{}"}}"#, "x".repeat(10_000));
        assert!(parse_response(400, &body).unwrap_err().to_string().len() < 300);
    }

    fn policy(prometheus: &str) -> GatePolicySpec {
        let text = format!(
            "bakeTime: 1m\n{prometheus}gates:\n  - name: errors\n    prometheus: {{query: x, max: 5%}}\n  - name: up\n    podRestarts: {{max: 1}}\n"
        );
        serde_saphyr::from_str(&text).unwrap()
    }

    #[test]
    fn policies_name_the_agents_endpoints() {
        let url = |u: &str| reqwest::Url::parse(u).unwrap();
        let endpoints = PrometheusEndpoints::new(BTreeMap::from([
            ("default".to_string(), url("http://prom:9090")),
            ("thanos".to_string(), url("http://thanos:9090")),
        ]));
        let got = |p: &str| endpoints.for_policy(&policy(p)).map(|s| s.map(|s| s.url.host_str().unwrap().to_string()));
        assert_eq!(got("").unwrap().as_deref(), Some("prom"));
        assert_eq!(got("prometheus: thanos\n").unwrap().as_deref(), Some("thanos"));
        // The old form names a URL: ignored, the agent's default is used.
        assert_eq!(got("prometheus: {url: 'http://attacker:1'}\n").unwrap().as_deref(), Some("prom"));
        let err = got("prometheus: victoria\n").unwrap_err().to_string();
        assert!(
            err.contains("gate(s) errors query Prometheus \"victoria\", which this agent does not have (it has: default, thanos); pass --prometheus victoria=URL"),
            "{err}"
        );
        let none = PrometheusEndpoints::default();
        assert!(none.for_policy(&policy("")).unwrap_err().to_string().contains("(it has: none)"));
        let no_prometheus_gates: GatePolicySpec =
            serde_saphyr::from_str("bakeTime: 1m\ngates:\n  - name: up\n    podRestarts: {max: 1}\n").unwrap();
        assert_eq!(none.for_policy(&no_prometheus_gates).unwrap(), None);
    }

    #[test]
    fn errors_make_the_gate_unknown() {
        let e = judge("p99", &gate("max", "500ms"), Err(PrometheusError::Timeout(Duration::from_secs(2))), None);
        assert!(e.is_unknown());
        assert!(e.to_string().contains("did not answer within 2s"), "{e}");
    }

    #[rstest]
    #[case::vector(200, r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"job":"a"},"value":[1.5,"0.25"]}]}}"#, Ok(vec![(Some("a"), 0.25)]))]
    #[case::scalar(200, r#"{"status":"success","data":{"resultType":"scalar","result":[1.5,"3"]}}"#, Ok(vec![(None, 3.0)]))]
    #[case::inf(200, r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"+Inf"]}]}}"#, Ok(vec![(None, f64::INFINITY)]))]
    #[case::bad_query(
        400,
        r#"{"status":"error","errorType":"bad_data","error":"parse error"}"#,
        Err("Prometheus refused the query (bad_data): parse error")
    )]
    #[case::matrix(
        200,
        r#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#,
        Err("the query returned a range vector; gates need an instant vector or a scalar")
    )]
    #[case::not_json(
        502,
        "bad gateway <secret>",
        Err("Prometheus answered HTTP 502 without an API answer (the body is not shown)")
    )]
    fn api_responses_are_read(
        #[case] status: u16,
        #[case] body: &str,
        #[case] want: Result<Vec<(Option<&str>, f64)>, &str>,
    ) {
        let got = parse_response(status, body)
            .map(|v| v.into_iter().map(|s| (s.labels.get("job").cloned(), s.value)).collect::<Vec<_>>())
            .map_err(|e| e.to_string());
        let want = want
            .map(|v| v.into_iter().map(|(j, x)| (j.map(str::to_string), x)).collect::<Vec<_>>())
            .map_err(str::to_string);
        assert_eq!(got, want);
    }
}
