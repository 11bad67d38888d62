//! Attack: someone who can push to the fleet repo but holds no key tries to collect the agent's
//! ServiceAccount token and to make the agent send requests to an address of their choosing.
//!
//! They commit a `fleet.yaml` whose `spec.status.forge` points at their listener with
//! `tokenFile: <the agent's token file>` (and `notify: {url: <listener>}`), and a GatePolicy with
//! `prometheus: {url: <listener>}`. The release manager then cuts a good release on top (so even
//! the signed tag's tree carries those settings), and the pusher later promotes a release signed
//! by a key the agent does not trust (a refusal is published too, which is where the old agent
//! sent the token).
//!
//! The listener must see no connection at all. The agent's own forge, Prometheus and
//! notification endpoint (its flags) get the statuses, the queries and the notification; the
//! statuses are in Git notes as always; a Warning Event says the repo's settings were ignored.

use crate::agent_support;

use agent_support::*;
use fleetgate::agent::config::Named;
use fleetgate::agent::{AgentSettings, Outcome};
use fleetgate::model::ForgeKind;
use fleetgate::status::{ForgeSettings, State};
use fleetgate_testenv::GpgHome;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The value of the "ServiceAccount token" the pusher wants.
const SA_TOKEN: &str = "sa-token-7f3a9c-do-not-leak";
/// The token of the agent's own forge.
const SPOKE_FORGE_TOKEN: &str = "spoke-forge-token-2b8e";
/// An instant-query answer that keeps an error-rate gate at 0.
const PROMETHEUS_ANSWER: &str =
    r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"0"]}]}}"#;

/// A loopback HTTP server that records every connection (the request's bytes as read) and answers
/// each with 200 and `body`.
struct Recorder {
    url: String,
    requests: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Recorder {
    async fn start(body: &'static str) -> Recorder {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else { return };
                // Recorded at once: a connection counts even if it never sends a byte.
                let index = {
                    let mut seen = seen.lock().unwrap();
                    seen.push(String::new());
                    seen.len() - 1
                };
                let seen = seen.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    let mut request = Vec::new();
                    // Read the head and whatever body arrives with it (these requests are small).
                    while let Ok(Ok(n)) =
                        tokio::time::timeout(std::time::Duration::from_millis(300), stream.read(&mut buf)).await
                    {
                        if n == 0 {
                            break;
                        }
                        request.extend_from_slice(&buf[..n]);
                    }
                    seen.lock().unwrap()[index] = String::from_utf8_lossy(&request).into_owned();
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = stream.write_all(answer.as_bytes()).await;
                });
            }
        });
        Recorder { url, requests, task }
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }

    /// Requests whose first line contains `needle` (method and path).
    fn requests_to(&self, needle: &str) -> Vec<String> {
        self.requests().into_iter().filter(|r| r.lines().next().is_some_and(|l| l.contains(needle))).collect()
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repo_forge_prometheus_and_notify_settings_reach_nobody_and_the_token_stays_home() {
    let logs = LogCapture::install();
    let fleet = Fleet::start("attack-forge", false).await;
    let attacker = Recorder::start("{}").await;
    let spoke_forge = Recorder::start("{}").await;
    let spoke_prometheus = Recorder::start(PROMETHEUS_ANSWER).await;

    // The file the pusher names: in a Pod it would be the mounted ServiceAccount token.
    let sa_token = fleet.dir.path().join("serviceaccount-token");
    std::fs::write(&sa_token, SA_TOKEN).unwrap();
    let spoke_token = fleet.dir.path().join("forge-token");
    std::fs::write(&spoke_token, SPOKE_FORGE_TOKEN).unwrap();

    // The pusher's commits: a Prometheus gate whose policy names their listener, and the forge
    // and notification endpoint in fleet.yaml.
    let gates = format!(
        "{QUICK_GATES}    - name: error-rate\n      prometheus: {{query: 'sum(rate(errors_total[1m]))', max: 5%}}\n"
    );
    fleet.set_policy("3s", &format!("  prometheus:\n    url: {}\n", attacker.url), &gates);
    fleet.edit(
        "fleet.yaml",
        "    forge: true\n",
        &format!(
            "    forge:\n      kind: gitea\n      url: {}\n      repository: platform/fleet\n      tokenFile: {}\n",
            attacker.url,
            sa_token.display()
        ),
    );
    fleet.edit("fleet.yaml", "    notify: default\n", &format!("    notify:\n      url: {}/hook\n", attacker.url));
    fleet.commit_and_push("status: mirror to our forge");

    let settings = AgentSettings {
        forge: ForgeSettings {
            kind: Some(ForgeKind::Gitea),
            url: Some(spoke_forge.url.clone()),
            repository: Some("platform/fleet".into()),
            token_file: Some(spoke_token),
            ..Default::default()
        },
        prometheus: Named::list(&[spoke_prometheus.url.as_str()]),
        notify_url: Named::list(&[format!("{}/hooks/oncall", spoke_forge.url)]),
        ..fleet.settings()
    };

    // (i) A good release, cut on top of the pusher's commits: its signed tree carries them too.
    let rel1 = fleet.release("rel-1", |_| {});
    fleet.promote("rel-1");
    let mut agent = fleet.agent_with(settings.clone()).await;
    let outcome = within("reconcile rel-1", 90, agent.reconcile()).await.unwrap();
    assert_eq!(outcome, Outcome::Succeeded("rel-1".into()));
    let states: Vec<State> = fleet.statuses(&rel1).iter().map(|s| s.state).collect();
    assert_eq!(states, [State::Pending, State::Pending, State::Success], "the statuses are in Git notes");
    let mirrored = spoke_forge.requests_to(&format!("/api/v1/repos/platform/fleet/statuses/{rel1}"));
    assert_eq!(mirrored.len(), 3, "the agent's own forge got every status: {:?}", spoke_forge.requests());
    assert!(mirrored.iter().all(|r| r.contains(&format!("token {SPOKE_FORGE_TOKEN}"))), "{mirrored:?}");
    assert!(!spoke_prometheus.requests_to("/api/v1/query").is_empty(), "the gate queried the agent's Prometheus");

    // (ii) The pusher promotes a release signed by their own key: refused, and the refusal is
    // published — still never to the repo's forge.
    let mallory = GpgHome::new().unwrap();
    let fpr = mallory.generate_key("Mallory", "mallory@example.com").unwrap();
    let rel2 = fleet.release_signed_by("rel-2", &mallory, &fpr, |_| {});
    fleet.promote("rel-2");
    let outcome = within("reconcile rel-2", 60, agent.reconcile()).await.unwrap();
    assert!(matches!(&outcome, Outcome::Refused { release, .. } if release == "rel-2"), "{outcome:?}");
    let refused = fleet.statuses(&rel2);
    assert_eq!(refused.iter().map(|s| s.state).collect::<Vec<_>>(), [State::Error], "{refused:?}");
    assert_eq!(spoke_forge.requests_to(&format!("/statuses/{rel2}")).len(), 1, "{:?}", spoke_forge.requests());
    // Notifications are delivered in the background: wait for it.
    let notified = eventually("the refusal's notification", 30, || async {
        let n = spoke_forge.requests_to("/hooks/oncall").len();
        (n > 0).then_some(n)
    })
    .await;
    assert_eq!(notified, 1, "the agent's own notification endpoint");

    // The listener received nothing at all: no connection, so no token, no query, no notification.
    assert_eq!(attacker.requests(), Vec::<String>::new(), "the pusher's listener was contacted");
    for request in spoke_forge.requests().iter().chain(&spoke_prometheus.requests()) {
        assert!(!request.contains(SA_TOKEN), "the ServiceAccount token left the agent: {request}");
    }
    assert!(!logs.text().contains(SA_TOKEN), "the ServiceAccount token is in the logs");

    // Whoever looks at the cluster learns why the repo's settings had no effect.
    let events = fleet.events_json().await;
    assert!(events.contains("RepoSettingIgnored"), "{events}");
    assert!(events.contains("spec.status.forge names a forge URL, repository or token, which is ignored"), "{events}");
    assert!(events.contains("spec.prometheus names a URL, which is ignored"), "{events}");
    assert!(!events.contains(&attacker.url), "Events repeat the pusher's URL: {events}");
}
