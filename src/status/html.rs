//! `fleetgate status -o html`: the cluster × release [`Matrix`] as one self-contained page (no
//! external asset: styles and a small script inline), for people who would rather look than read.
//!
//! Rows are clusters grouped by wave, columns releases newest first, each cell coloured by its
//! state; a cell's title (hover) says its description, failing gate and figures, and a click (or
//! Enter) shows them in full in a details panel. Opening the page with `#CLUSTER/RELEASE` in its
//! address selects that cell. Release headers link to their commit when the caller gave a
//! [`CommitUrl`] template. A filter box hides the rows whose cluster, wave, labels and states do
//! not contain its text (kept in the address as `?q=TEXT`, so a filtered view can be linked).
//!
//! Served live ([`HtmlOptions::live`], `fleetgate status --serve`, [`super::live`]), the page
//! also asks its server for the matrix's generation (a long poll) and, when it moved, fetches
//! itself again and swaps the table in place — parsed by `DOMParser` (inert: nothing in it runs),
//! never a reload, so the filter and the selected cell stay.
//!
//! Everything shown comes from the repo and its notes (cluster names, release ids, descriptions,
//! gate figures), which someone without a key can write: every string is escaped for HTML text or
//! a quoted attribute, the script only moves nodes the page already holds (never `innerHTML`), and
//! a Content-Security-Policy allows no script or style but the page's own (by hash), so markup
//! that slipped through would still not run.

use super::matrix::{Cell, ClusterRow, Matrix, ReleaseColumn};
use super::model::{State, Status};
use base64::Engine;
use sha2::{Digest, Sha256};
use std::fmt::Write;

/// A link to a commit on a forge's web UI: `{sha}` is replaced by the full commit id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitUrl(String);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CommitUrlError {
    #[error("commit URL template {0:?}: must start with https:// or http://")]
    Scheme(String),
    #[error("commit URL template {0:?}: must contain {{sha}}")]
    NoSha(String),
}

impl CommitUrl {
    /// Accepts only http(s) templates with a `{sha}` placeholder, so a link on the page can only
    /// lead to a web page about that commit (no `javascript:` or `data:` link).
    pub fn parse(template: &str) -> Result<CommitUrl, CommitUrlError> {
        if !(template.starts_with("https://") || template.starts_with("http://")) {
            return Err(CommitUrlError::Scheme(template.to_string()));
        }
        if !template.contains("{sha}") {
            return Err(CommitUrlError::NoSha(template.to_string()));
        }
        Ok(CommitUrl(template.to_string()))
    }

    /// The link for `sha`, or none when `sha` is not a hex object id (it comes from the
    /// matrix, which read it from Git, but the page does not rely on that).
    fn link(&self, sha: &str) -> Option<String> {
        (!sha.is_empty() && sha.chars().all(|c| c.is_ascii_hexdigit())).then(|| self.0.replace("{sha}", sha))
    }
}

/// How to render the page.
#[derive(Debug, Clone, Default)]
pub struct HtmlOptions {
    pub commit_url: Option<CommitUrl>,
    /// The page is served live: the matrix's generation, which the page watches for a change.
    pub live: Option<u64>,
}

/// `text` escaped for HTML text and for attribute values in double or single quotes.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = r#"
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#1f2328;background:#fff}
h1{font-size:1.3em;margin:0 0 .2em}
.sub{color:#59636e;margin:0 0 1em}
.layout{display:flex;gap:1.5em;align-items:flex-start;flex-wrap:wrap}
table.matrix{border-collapse:collapse}
.matrix th,.matrix td{border:1px solid #d1d9e0;padding:.3em .6em;text-align:left;white-space:nowrap}
.matrix thead th{background:#f6f8fa;vertical-align:bottom}
.matrix thead .sum{font-weight:normal;color:#59636e;font-size:.85em}
.matrix th.wave{background:#eef1f4;text-transform:uppercase;letter-spacing:.05em;font-size:.8em}
.matrix th.wave .settings{text-transform:none;letter-spacing:0;font-weight:normal;color:#59636e}
.matrix th.cluster{font-weight:normal;padding-left:1.2em}
td.cell{cursor:pointer;min-width:6em}
td.cell:focus,td.cell.selected{outline:3px solid #0969da;outline-offset:-3px}
.st-success{background:#dafbe1;color:#116329}
.st-failure{background:#ffebe9;color:#a40e26;font-weight:bold}
.st-error{background:#fbefff;color:#8250df}
.st-pending{background:#fff8c5;color:#7d4e00}
.st-unknown,.st-none{background:#fff;color:#818b98}
.st-unverified{background:repeating-linear-gradient(45deg,#fff,#fff 4px,#f6f8fa 4px,#f6f8fa 8px);color:#818b98}
.desired{box-shadow:inset 4px 0 0 #0969da}
#details{min-width:22em;max-width:40em;border:1px solid #d1d9e0;border-radius:6px;padding:.8em 1em;background:#f6f8fa}
#details h2{font-size:1.05em;margin:0 0 .4em}
#details table{border-collapse:collapse;margin:.4em 0}
#details td,#details th{border:1px solid #d1d9e0;padding:.15em .5em;text-align:left}
#details tr.fail td{color:#a40e26;font-weight:bold}
.legend span{display:inline-block;padding:.1em .5em;margin-right:.3em;border:1px solid #d1d9e0}
#filter{font:inherit;padding:.2em .4em;margin:0 0 .8em;min-width:20em}
.muted{color:#59636e}
"#;

const SCRIPT: &str = r#"
(function () {
  var box = document.getElementById('filter');
  var selected = '';
  try { selected = decodeURIComponent(location.hash.slice(1)); } catch (e) {}
  function show(cell) {
    document.querySelectorAll('td.cell').forEach(function (c) { c.classList.remove('selected'); });
    cell.classList.add('selected');
    selected = cell.dataset.cluster + '/' + cell.dataset.release;
    var d = cell.querySelector('.details').cloneNode(true);
    d.hidden = false;
    document.getElementById('details').replaceChildren(d);
  }
  function bind() {
    document.querySelectorAll('td.cell').forEach(function (c) {
      c.addEventListener('click', function () { show(c); });
      c.addEventListener('keydown', function (e) {
        if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); show(c); }
      });
      if (selected && c.dataset.cluster + '/' + c.dataset.release === selected) { show(c); }
    });
  }
  function filter() {
    var q = box.value.trim().toLowerCase();
    document.querySelectorAll('tr[data-search]').forEach(function (r) {
      r.hidden = q !== '' && r.dataset.search.indexOf(q) < 0;
    });
  }
  box.value = new URLSearchParams(location.search).get('q') || '';
  box.addEventListener('input', function () {
    filter();
    var u = new URL(location.href);
    if (box.value) { u.searchParams.set('q', box.value); } else { u.searchParams.delete('q'); }
    history.replaceState(null, '', u);
  });
  bind();
  filter();
  var body = document.body;
  function swap(html) {
    var fresh = new DOMParser().parseFromString(html, 'text/html');
    ['.sub', '.layout'].forEach(function (s) { document.querySelector(s).replaceWith(fresh.querySelector(s)); });
    body.dataset.generation = fresh.body.dataset.generation;
    body.dataset.swaps = String(Number(body.dataset.swaps || '0') + 1);
    bind();
    filter();
  }
  function watch() {
    fetch('generation?after=' + body.dataset.generation, { cache: 'no-store' })
      .then(function (r) { return r.text(); })
      .then(function (g) {
        if (g.trim() === body.dataset.generation) { return; }
        return fetch(location.pathname + location.search, { cache: 'no-store' })
          .then(function (r) { return r.text(); })
          .then(swap);
      })
      .then(function () { setTimeout(watch, 500); }, function () { setTimeout(watch, 5000); });
  }
  if (body.dataset.generation) { watch(); }
  body.dataset.ready = 'true';
})();
"#;

fn csp_hash(text: &str) -> String {
    format!("'sha256-{}'", base64::engine::general_purpose::STANDARD.encode(Sha256::digest(text.as_bytes())))
}

/// What the filter box matches a row against, lower case: cluster, wave, labels, its cells'
/// states, `stale` and `paused`.
fn search_text(wave: &str, row: &ClusterRow) -> String {
    let mut words = vec![row.name.clone(), wave.to_string()];
    words.extend(row.labels.iter().map(|(k, v)| format!("{k}={v}")));
    words.extend(row.cells.iter().map(|c| cell_state(c).0.to_string()));
    if row.stale {
        words.push("stale".into());
    }
    if row.paused.is_some() {
        words.push("paused".into());
    }
    words.join(" ").to_lowercase()
}

/// The class suffix and the word shown for a cell.
fn cell_state(cell: &Cell) -> (&'static str, &'static str) {
    match (cell.state, cell.unverified.is_empty()) {
        (Some(s), _) => (s.as_str(), s.as_str()),
        (None, false) => ("unverified", "unverified"),
        (None, true) => ("none", "—"),
    }
}

fn failing_gates(status: &Status) -> impl Iterator<Item = String> + '_ {
    status
        .gates
        .iter()
        .filter(|g| g.verdict == "fail")
        .map(|g| format!("failing gate {}: {} (threshold {})", g.name, g.observed, g.threshold))
}

/// The variant of the release the cluster ran, by its latest verified status.
fn variant(cell: &Cell) -> Option<&str> {
    cell.status.as_ref()?.variant.as_deref()
}

/// The hover text: state, description, failing gates, the wave decision, unverified entries.
fn cell_title(row: &ClusterRow, cell: &Cell) -> String {
    let mut lines = vec![format!("{} · {}: {}", row.name, cell.release, cell_state(cell).1)];
    if let Some(v) = variant(cell) {
        lines.push(format!("variant {v}"));
    }
    if let Some(s) = &cell.status {
        lines.push(s.description.clone());
        lines.extend(failing_gates(s));
    }
    if let Some(g) = &cell.gate {
        lines.push(format!("{}{}", if g.allowed { "may start: " } else { "" }, g.reason));
    }
    if !cell.unverified.is_empty() {
        lines.push(format!(
            "{} unverified entr{} (not counted)",
            cell.unverified.len(),
            if cell.unverified.len() == 1 { "y" } else { "ies" }
        ));
    }
    if cell.desired {
        lines.push("desired release".to_string());
    }
    lines.join("\n")
}

fn time(t: Option<chrono::DateTime<chrono::Utc>>) -> String {
    t.map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)).unwrap_or_else(|| "—".to_string())
}

/// The details panel's content for one cell (hidden in the cell until it is clicked).
fn cell_details(out: &mut String, row: &ClusterRow, col: &ReleaseColumn, cell: &Cell, opts: &HtmlOptions) {
    let (_, shown) = cell_state(cell);
    let _ = write!(
        out,
        "<div class=\"details\" hidden><h2>{} · {}</h2><p>state <b class=\"state\">{}</b>{}{}</p>",
        escape(&row.name),
        escape(&cell.release),
        escape(shown),
        if cell.desired { " · desired release" } else { "" },
        variant(cell).map(|v| format!(" · variant {}", escape(v))).unwrap_or_default()
    );
    if let Some(s) = &cell.status {
        let _ = write!(out, "<p class=\"description\">{}</p>", escape(&s.description));
        if !s.gates.is_empty() {
            out.push_str(
                "<table class=\"gates\"><tr><th>gate</th><th>observed</th><th>threshold</th><th>verdict</th></tr>",
            );
            for g in &s.gates {
                let _ = write!(
                    out,
                    "<tr{}><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                    if g.verdict == "fail" { " class=\"fail\"" } else { "" },
                    escape(&g.name),
                    escape(&g.observed),
                    escape(&g.threshold),
                    escape(&g.verdict)
                );
            }
            out.push_str("</table>");
        }
        let _ = write!(
            out,
            "<p class=\"muted\">started {} · applied {} · decided {} · reported {}{}{}</p>",
            time(s.started_at),
            time(s.applied_at),
            time(s.decided_at),
            time(Some(s.reported_at)),
            s.rollback_to.as_deref().map(|r| format!(" · rolled back to {}", escape(r))).unwrap_or_default(),
            if s.agent_version.is_empty() { String::new() } else { format!(" · agent {}", escape(&s.agent_version)) }
        );
    }
    if let Some(g) = &cell.gate {
        let _ =
            write!(out, "<p class=\"gate\">{}{}</p>", if g.allowed { "may start: " } else { "" }, escape(&g.reason));
    }
    for u in &cell.unverified {
        let _ = write!(
            out,
            "<p class=\"unverified\">unverified {} “{}” (not counted): {}</p>",
            escape(u.status.state.as_str()),
            escape(&u.status.description),
            escape(&u.reason)
        );
    }
    let short: String = col.commit.chars().take(12).collect();
    match opts.commit_url.as_ref().and_then(|u| u.link(&col.commit)) {
        Some(href) => {
            let _ = write!(out, "<p>commit <a href=\"{}\">{}</a></p>", escape(&href), escape(&short));
        }
        None => {
            let _ = write!(out, "<p>commit <code>{}</code></p>", escape(&short));
        }
    }
    out.push_str("</div>");
}

/// The page. Pure: the same matrix and options give the same bytes.
pub fn render_html(m: &Matrix, opts: &HtmlOptions) -> String {
    let rev: String = m.revision.chars().take(12).collect();
    let mut out = String::new();
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src {}; script-src {}{}\">\
         <meta name=\"viewport\" content=\"width=device-width\"><title>fleet {} · fleetgate</title><style>{STYLE}</style></head>\n<body{}>\
         <h1>fleet {}</h1><p class=\"sub\">{} @ <code>{}</code> · {} clusters in {} waves · newest release first</p>\n\
         <input id=\"filter\" type=\"search\" placeholder=\"filter: cluster, wave, label, state\" aria-label=\"filter clusters\">\n",
        csp_hash(STYLE),
        csp_hash(SCRIPT),
        // Live, the page fetches from its own server; a file fetches nothing.
        if opts.live.is_some() { "; connect-src 'self'" } else { "" },
        escape(&m.fleet),
        opts.live.map(|g| format!(" data-generation=\"{g}\"")).unwrap_or_default(),
        escape(&m.fleet),
        escape(&m.branch),
        escape(&rev),
        m.cluster_count(),
        m.waves.len()
    );
    if m.releases.is_empty() {
        out.push_str("<p>no release tags yet (a release is a tag on a commit with release.yaml)</p>");
    }
    out.push_str("<div class=\"layout\"><table class=\"matrix\"><thead><tr><th>cluster</th>");
    for col in &m.releases {
        let id = escape(&col.id);
        let head = match opts.commit_url.as_ref().and_then(|u| u.link(&col.commit)) {
            Some(href) => format!("<a href=\"{}\">{id}</a>", escape(&href)),
            None => id.clone(),
        };
        let _ = write!(
            out,
            "<th class=\"release\" data-release=\"{id}\" title=\"{}\">{head}<div class=\"sum\">{}</div></th>",
            escape(&format!("commit {}", col.commit)),
            escape(&col.summary.sentence())
        );
    }
    out.push_str("</tr></thead>\n");
    for wave in &m.waves {
        // How the wave selects and paces (labels, share, soak, windows…): why these rows are here.
        let settings = wave
            .settings
            .as_deref()
            .map(|s| format!(" <span class=\"settings\">· {}</span>", escape(s)))
            .unwrap_or_default();
        let _ = write!(
            out,
            "<tbody data-wave=\"{}\"><tr><th class=\"wave\" colspan=\"{}\">{}{settings}</th></tr>\n",
            escape(&wave.name),
            m.releases.len() + 1,
            escape(&wave.name)
        );
        for row in &wave.clusters {
            // What it runs and when it was heard from, under its name (exact: the page is a snapshot).
            let _ = write!(
                out,
                "<tr data-search=\"{}\"{}><th class=\"cluster\">{}<div class=\"sum\">runs {} · last seen {}{}</div></th>",
                escape(&search_text(&wave.name, row)),
                if row.stale { " class=\"stale\"" } else { "" },
                escape(&row.name),
                escape(row.running.as_deref().unwrap_or("—")),
                time(row.last_seen),
                if row.stale { " · <span class=\"st-failure\">stale</span>" } else { "" }
            );
            for (col, cell) in m.releases.iter().zip(&row.cells) {
                let (class, shown) = cell_state(cell);
                let _ = write!(
                    out,
                    "<td class=\"cell st-{class}{}\" tabindex=\"0\" data-cluster=\"{}\" data-release=\"{}\" data-state=\"{class}\" title=\"{}\"><span class=\"shown\">{}{}</span>",
                    if cell.desired { " desired" } else { "" },
                    escape(&row.name),
                    escape(&cell.release),
                    escape(&cell_title(row, cell)),
                    escape(shown),
                    match (cell.desired, variant(cell)) {
                        (desired, Some(v)) => format!("{} {}", if desired { "*" } else { "" }, escape(v)),
                        (true, None) => "*".to_string(),
                        (false, None) => String::new(),
                    }
                );
                cell_details(&mut out, row, col, cell, opts);
                out.push_str("</td>");
            }
            out.push_str("</tr>\n");
        }
        out.push_str("</tbody>\n");
    }
    out.push_str("</table>\n<aside id=\"details\"><p class=\"muted\">Click a cell for its gate figures.</p></aside></div>\n<p class=\"legend\">");
    for s in [State::Success, State::Failure, State::Error, State::Pending] {
        let _ = write!(out, "<span class=\"st-{s}\">{s}</span>");
    }
    out.push_str(
        "<span class=\"st-unverified\">unverified</span><span class=\"st-none\">— not reported</span>\
         <span class=\"desired\">* desired release</span></p>\n",
    );
    let _ = write!(out, "<script>{SCRIPT}</script></body></html>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Document, Fleet, FleetSpec, OperatorIdentity, RolloutSettings};
    use crate::status::{Member, Origin, ReleaseRef, StatusSet};

    fn matrix(description: &str, cluster: &str) -> Matrix {
        let fleet: Fleet = Document::new(
            "Fleet",
            "redis-fleet",
            FleetSpec {
                operator: OperatorIdentity { name: "op".into(), namespace: "ns".into(), image: None },
                release: Some("rel-2".into()),
                waves: vec!["canary".into()],
                rollout: RolloutSettings { max_failed_clusters: 1 },
                promotions: Default::default(),
                status: Default::default(),
                paused: false,
            },
        );
        let rels = vec![ReleaseRef { id: "rel-2".into(), commit: "ab".repeat(20), created_at: None }];
        let mut set = StatusSet::new();
        set.insert(Status::new(cluster, "rel-2", "ab".repeat(20), State::Failure, description));
        let members = vec![Member::new(cluster, "canary", Some("rel-2"))];
        Matrix::build(
            &fleet,
            &members,
            &rels,
            set,
            &Origin { branch: "main".into(), revision: "0".repeat(40) },
            chrono::Utc::now(),
        )
    }

    #[test]
    fn repo_text_is_escaped_everywhere() {
        let evil = "<script>alert(1)</script>\"' onmouseover=x";
        let page = render_html(&matrix(evil, "c<b>1"), &HtmlOptions::default());
        assert_eq!(page.matches("<script>").count(), 1, "{page}");
        assert!(!page.contains("<b>1"), "{page}");
        assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;&quot;&#39; onmouseover=x"), "{page}");
    }

    #[test]
    fn a_wave_header_says_how_the_wave_selects_and_paces() {
        let mut m = matrix("ok", "c1");
        assert!(!render_html(&m, &HtmlOptions::default()).contains("class=\"settings\""), "a plain wave has none");
        m.waves[0].settings = Some("env=production, 25 %, soak 15s".into());
        let page = render_html(&m, &HtmlOptions::default());
        assert!(
            page.contains(">canary <span class=\"settings\">· env=production, 25 %, soak 15s</span></th>"),
            "{page}"
        );
    }

    #[test]
    fn commit_links_only_from_http_templates() {
        assert_eq!(
            CommitUrl::parse("javascript:alert('{sha}')"),
            Err(CommitUrlError::Scheme("javascript:alert('{sha}')".into()))
        );
        assert!(matches!(CommitUrl::parse("https://forge/x/commit/"), Err(CommitUrlError::NoSha(_))));
        let opts = HtmlOptions {
            commit_url: Some(CommitUrl::parse("https://forge/x/commit/{sha}").unwrap()),
            ..Default::default()
        };
        let page = render_html(&matrix("ok", "c1"), &opts);
        assert!(page.contains(&format!("href=\"https://forge/x/commit/{}\"", "ab".repeat(20))), "{page}");
        assert_eq!(CommitUrl::parse("https://f/{sha}").unwrap().link("not-hex\"><x"), None);
    }

    #[test]
    fn only_a_live_page_may_fetch_and_it_carries_its_generation() {
        let file = render_html(&matrix("ok", "c1"), &HtmlOptions::default());
        assert!(!file.contains("connect-src") && file.contains("<body><h1>"), "{file}");
        let live = render_html(&matrix("ok", "c1"), &HtmlOptions { live: Some(7), ..Default::default() });
        assert!(live.contains("; connect-src 'self'\">"), "{live}");
        assert!(live.contains("<title>fleet redis-fleet · fleetgate</title>"), "{live}");
        assert!(live.contains("<body data-generation=\"7\"><h1>fleet redis-fleet</h1>"), "{live}");
        assert!(live.contains("<tr data-search=\"c1 canary failure\">"), "{live}");
    }

    #[test]
    fn the_csp_names_the_inline_script_and_style() {
        let page = render_html(&matrix("ok", "c1"), &HtmlOptions::default());
        assert!(page.contains(&format!("script-src {}", csp_hash(SCRIPT))));
        assert!(page.contains(&format!("<script>{SCRIPT}</script>")));
        assert!(page.contains(&format!("<style>{STYLE}</style>")));
    }
}
