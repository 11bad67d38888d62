//! `fleetgate status -o html` in a real browser: the page is written from a fleet repo served by
//! `git daemon` with signed statuses, opened in headless Chromium (Debian `chromium`; the tests
//! skip, saying so, where it is missing), and the cells are read back from the DOM Chromium
//! renders after the page's script ran — including a status whose description and gate name are
//! markup an attacker wrote, which must show as text and never run.

use crate::status_support;

use fleetgate::status::{self, GateFigure, GitRemote, State, Status};
use status_support::{NEW, OLD, chromium, fleet, identity};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Writes the page with the binary, as a user would.
fn write_page(url: &str, dir: &Path) -> PathBuf {
    let page = dir.join("fleet.html");
    let out = Command::new(env!("CARGO_BIN_EXE_fleetgate"))
        .args(["status", "--repo", url, "-o", "html", "--out"])
        .arg(&page)
        .args(["--commit-url-template", "https://forge.example/acme/fleet/commit/{sha}"])
        .env_remove("FLEETGATE_REPO")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.stdout.is_empty(), "--out writes the file, not stdout");
    page
}

/// The DOM after load and scripts, opened at `page#fragment`.
fn rendered_dom(chromium: &Path, page: &Path, fragment: &str) -> String {
    let profile = tempfile::tempdir().unwrap();
    let mut child = Command::new(chromium)
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--dump-dom"])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("file://{}#{fragment}", page.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut s).unwrap();
        s
    });
    let deadline = Instant::now() + Duration::from_secs(90);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("chromium did not finish within 90 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    reader.join().unwrap()
}

/// `(cluster, release) -> data-state` of every matrix cell in the DOM.
fn cells(dom: &str) -> BTreeMap<(String, String), String> {
    let re = regex::Regex::new(
        r#"<td class="cell[^"]*" tabindex="0" data-cluster="([^"]*)" data-release="([^"]*)" data-state="([^"]*)""#,
    )
    .unwrap();
    re.captures_iter(dom).map(|c| ((c[1].to_string(), c[2].to_string()), c[3].to_string())).collect()
}

/// The details panel's content as rendered (what the script put there).
fn panel(dom: &str) -> &str {
    let start = dom.find("<aside id=\"details\">").expect("a details panel");
    &dom[start..start + dom[start..].find("</aside>").unwrap()]
}

#[test]
fn chromium_renders_each_cells_state_and_the_clicked_cells_figures() {
    let Some(chromium) = chromium() else { return };
    let f = fleet();
    let dir = tempfile::tempdir().unwrap();
    let page = write_page(&f.url, dir.path());
    let dom = rendered_dom(&chromium, &page, &format!("cluster-b/{NEW}"));
    assert!(dom.contains("data-ready=\"true\""), "the page's script did not run: {dom}");

    let state = |c: &str, r: &str| cells(&dom).get(&(c.to_string(), r.to_string())).cloned();
    assert_eq!(cells(&dom).len(), 8, "{dom}");
    assert_eq!(state("cluster-a", NEW).as_deref(), Some("success"));
    assert_eq!(state("cluster-b", NEW).as_deref(), Some("failure"));
    assert_eq!(state("cluster-c", NEW).as_deref(), Some("none"));
    assert_eq!(state("cluster-d", NEW).as_deref(), Some("none"));
    for c in ["cluster-a", "cluster-b", "cluster-c", "cluster-d"] {
        assert_eq!(state(c, OLD).as_deref(), Some("success"), "{c}");
    }
    // Grouped by wave, in rollout order.
    let canary = dom.find("data-wave=\"canary\"").unwrap();
    let prod = dom.find("data-wave=\"prod\"").unwrap();
    assert!(canary < prod && dom[canary..prod].contains("cluster-b") && dom[prod..].contains("cluster-d"));

    // The fragment selected cluster-b's cell: the panel shows its description and rollback.
    let shown = panel(&dom);
    assert!(shown.contains("cluster-b · rel-20250315-001"), "{shown}");
    assert!(shown.contains("error-rate 7.3 % &gt; 5 %"), "{shown}");
    assert!(shown.contains("rolled back to rel-20250301-001"), "{shown}");
    // Hover text of a cell that has not started says why (the wave gate).
    assert!(dom.contains("blocked: cluster-b in earlier wave canary failed"), "{dom}");
    // Release headers link to their commits on the forge.
    assert!(dom.contains(&format!("href=\"https://forge.example/acme/fleet/commit/{}\"", f.new)), "{dom}");

    // The README's picture: FLEETGATE_SCREENSHOT=$PWD/docs/status-page.png cargo test --test status status_html
    if let Some(png) = std::env::var_os("FLEETGATE_SCREENSHOT") {
        let profile = tempfile::tempdir().unwrap();
        let out = Command::new(&chromium)
            .args(["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars"])
            .args(["--window-size=1100,520", &format!("--user-data-dir={}", profile.path().display())])
            .arg(format!("--screenshot={}", Path::new(&png).display()))
            .arg(format!("file://{}#cluster-b/{NEW}", page.display()))
            .output()
            .unwrap();
        assert!(out.status.success() && Path::new(&png).is_file(), "{}", String::from_utf8_lossy(&out.stderr));
    }
}

#[test]
fn markup_in_a_status_shows_as_text_and_never_runs() {
    let Some(chromium) = chromium() else { return };
    let f = fleet();
    // Anyone who can push notes can write this; a status key does not vouch for its content.
    let agent = tempfile::tempdir().unwrap();
    let repo = git2::Repository::init_bare(agent.path()).unwrap();
    repo.remote_anonymous(&f.url).unwrap().fetch(&["+refs/tags/*:refs/tags/*"], None, None).unwrap();
    let hostile = "<script>document.body.dataset.pwned='script'</script>\
                   <img src=x onerror=\"document.body.dataset.pwned='img'\">\"><b>all gates passed</b>";
    let gates = vec![GateFigure {
        name: "<i onmouseover=alert(1)>error-rate</i>".into(),
        observed: "7.3 %".into(),
        threshold: "≤ 5 %".into(),
        verdict: "fail".into(),
    }];
    let status = Status::new("cluster-c", NEW, &f.new, State::Failure, hostile).with_gates(gates);
    status::sync(&repo, &GitRemote::new(&f.url)).unwrap();
    status::write(&repo, &GitRemote::new(&f.url), &status, &identity("cluster-c")).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let page = write_page(&f.url, dir.path());
    let dom = rendered_dom(&chromium, &page, &format!("cluster-c/{NEW}"));
    assert!(dom.contains("data-ready=\"true\""), "the page's script did not run: {dom}");
    assert!(!dom.contains("data-pwned"), "injected script ran: {dom}");
    assert_eq!(dom.matches("<script").count(), 1, "only the page's own script element: {dom}");
    for element in ["<img", "<b>", "<i "] {
        assert!(!dom.contains(element), "{element} became an element: {dom}");
    }
    // Shown as the text it is, in the panel the click opened and in the cell's hover title.
    let shown = panel(&dom);
    assert!(shown.contains("&lt;script&gt;document.body.dataset.pwned='script'&lt;/script&gt;"), "{shown}");
    assert!(shown.contains("&lt;i onmouseover=alert(1)&gt;error-rate&lt;/i&gt;"), "{shown}");
    assert!(shown.contains("<tr class=\"fail\">"), "the failing gate is marked: {shown}");
    assert!(dom.contains("title=\"cluster-c · rel-20250315-001: failure\n&lt;script&gt;"), "{dom}");
    assert_eq!(cells(&dom).get(&("cluster-c".into(), NEW.into())).map(String::as_str), Some("failure"));
}
