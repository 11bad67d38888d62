//! [`error_chain`]: the one way an error becomes text for people. By convention an error's message
//! does not repeat its `source()`'s text; the chain is printed once, here, at the edge (the CLI's
//! output, the agent's status, Events, notifications and logs), so no layer's detail is lost and
//! none is printed twice.

use std::error::Error;

/// `err` and every `source()` below it, joined with ": ". A source whose text the message so far
/// already contains (foreign error types that print their source themselves) is not repeated.
pub fn error_chain(err: &(dyn Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

/// A repo URL as messages may show it: its path kept (which repo it is), a password in its user
/// info replaced by `…`, and for `http(s)://` a user name alone too, since forges take a token
/// there (`https://ghp_…@github.com/…`). An SSH user (`ssh://git@host`, `git@host:path`) is no
/// secret and stays. Every place that prints a repo URL (errors, logs, `/readyz`) passes it here.
pub fn redact_userinfo(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_string() };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else { return url.to_string() };
    let hidden = match rest[..at].split_once(':') {
        Some((user, _password)) => format!("{user}:…"),
        None if scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https") => "…".to_string(),
        None => return url.to_string(),
    };
    format!("{scheme}://{hidden}{}", &rest[at..])
}

/// `url` as messages may show it: scheme, host and port, then `/…` when it had more. A webhook
/// URL's path is its secret (Slack's `https://hooks.slack.com/services/T…/B…/…`), and user info
/// or a query may hold credentials; logs, Events and statuses get only where it points.
pub fn redacted_url(url: &reqwest::Url) -> String {
    let host = url.host_str().unwrap_or("");
    let port = url.port().map(|p| format!(":{p}")).unwrap_or_default();
    let more = url.path() != "/" || url.query().is_some() || url.fragment().is_some() || !url.username().is_empty();
    format!("{}://{host}{port}{}", url.scheme(), if more { "/…" } else { "" })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    enum Inner {
        #[error("connection refused")]
        Refused,
    }

    #[derive(Debug, thiserror::Error)]
    enum Middle {
        #[error("fetching git://host/fleet.git")]
        Fetch(#[source] Inner),
    }

    #[rstest::rstest]
    #[case(
        "https://user:s3cret-token@git.example.com/platform/fleet.git",
        "https://user:…@git.example.com/platform/fleet.git"
    )]
    #[case("https://ghp_s3cret@github.com/acme/fleet.git", "https://…@github.com/acme/fleet.git")]
    #[case("http://oauth2:s3cret@10.0.0.1:3000/fleet.git", "http://oauth2:…@10.0.0.1:3000/fleet.git")]
    #[case("ssh://git@git.example.com/fleet.git", "ssh://git@git.example.com/fleet.git")]
    #[case("ssh://git:s3cret@git.example.com/fleet.git", "ssh://git:…@git.example.com/fleet.git")]
    #[case("git@github.com:acme/fleet.git", "git@github.com:acme/fleet.git")]
    #[case("https://git.example.com/a@b/fleet.git", "https://git.example.com/a@b/fleet.git")]
    #[case("/srv/fleet.git", "/srv/fleet.git")]
    fn repo_urls_lose_their_secrets_only(#[case] url: &str, #[case] shown: &str) {
        assert_eq!(redact_userinfo(url), shown);
    }

    #[rstest::rstest]
    #[case("https://hooks.slack.com/services/T000/B000/XXXX", "https://hooks.slack.com/…")]
    #[case("http://prometheus.monitoring:9090", "http://prometheus.monitoring:9090")]
    #[case("https://user:pw@prom.example.com/", "https://prom.example.com/…")]
    #[case("http://127.0.0.1:9090/?token=s3cret", "http://127.0.0.1:9090/…")]
    fn urls_keep_only_where_they_point(#[case] url: &str, #[case] shown: &str) {
        assert_eq!(redacted_url(&url.parse().unwrap()), shown);
    }

    /// A foreign-style error that prints its source itself as well as returning it.
    #[derive(Debug, thiserror::Error)]
    enum Repeating {
        #[error("source: {0}")]
        Source(#[source] Middle),
    }

    #[test]
    fn error_chain_prints_each_source_once() {
        let e = Middle::Fetch(Inner::Refused);
        assert_eq!(error_chain(&e), "fetching git://host/fleet.git: connection refused");
        let e = Repeating::Source(Middle::Fetch(Inner::Refused));
        assert_eq!(error_chain(&e), "source: fetching git://host/fleet.git: connection refused");
    }
}
