//! `fleetgate status --serve`: the real binary serves the fleet page from a repo on a real
//! `git daemon`; headless Chromium (driven over its DevTools protocol on a pipe,
//! `--remote-debugging-pipe`) opens it with a filter and a selected cell; a status lands in the
//! repo; the open page shows it without reloading (the same document: a value the test left in it
//! is still there), filter and selection kept. Deep links narrow on the server, the page is
//! read-only (POST is 405) and binds loopback for a bare port. Skips, saying so, without chromium.

use crate::status_support;

use fleetgate::status::{self, GitRemote, State, Status};
use fleetgate_testenv::process::{Guarded, free_port};
use serde_json::{Value, json};
use status_support::{NEW, chromium, fleet, identity};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One HTTP/1.0 request to the served page: status code and body.
fn http(port: u16, method: &str, path: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(s, "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let code = text.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (code, text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
}

/// Headless Chromium with its DevTools protocol on fds 3 (commands) and 4 (answers), messages
/// NUL-terminated JSON: no port, no WebSocket.
struct Browser {
    child: Child,
    to: std::io::PipeWriter,
    from: BufReader<std::io::PipeReader>,
    next: u64,
    session: String,
    _profile: tempfile::TempDir,
}

impl Browser {
    fn open(chromium: &Path, url: &str) -> Browser {
        let profile = tempfile::tempdir().unwrap();
        let (commands_r, commands_w) = std::io::pipe().unwrap();
        let (answers_r, answers_w) = std::io::pipe().unwrap();
        let (r, w) = (commands_r.as_raw_fd(), answers_w.as_raw_fd());
        let mut cmd = Command::new(chromium);
        cmd.args(["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--remote-debugging-pipe"])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg(url)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: only async-signal-safe calls (fcntl, dup2) between fork and exec. Copied above
        // 10 first, so neither end is overwritten when it already sits at 3 or 4.
        unsafe {
            cmd.pre_exec(move || {
                let (r, w) = (libc::fcntl(r, libc::F_DUPFD, 10), libc::fcntl(w, libc::F_DUPFD, 10));
                if r < 0 || w < 0 || libc::dup2(r, 3) < 0 || libc::dup2(w, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().unwrap();
        drop((commands_r, answers_w));
        let mut b = Browser {
            child,
            to: commands_w,
            from: BufReader::new(answers_r),
            next: 0,
            session: String::new(),
            _profile: profile,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        let target = loop {
            let targets = b.call(None, "Target.getTargets", json!({}));
            if let Some(t) = targets["targetInfos"].as_array().unwrap().iter().find(|t| t["type"] == "page") {
                break t["targetId"].as_str().unwrap().to_string();
            }
            assert!(Instant::now() < deadline, "chromium opened no page");
            std::thread::sleep(Duration::from_millis(200));
        };
        let attached = b.call(None, "Target.attachToTarget", json!({"targetId": target, "flatten": true}));
        b.session = attached["sessionId"].as_str().unwrap().to_string();
        b
    }

    fn call(&mut self, session: Option<&str>, method: &str, params: Value) -> Value {
        self.next += 1;
        let mut message = json!({"id": self.next, "method": method, "params": params});
        if let Some(s) = session {
            message["sessionId"] = json!(s);
        }
        self.to.write_all(&serde_json::to_vec(&message).unwrap()).unwrap();
        self.to.write_all(b"\0").unwrap();
        loop {
            let mut raw = Vec::new();
            assert!(self.from.read_until(0, &mut raw).unwrap() > 0, "chromium closed its DevTools pipe");
            raw.pop();
            let answer: Value = serde_json::from_slice(&raw).unwrap();
            if answer["id"] == json!(self.next) {
                assert!(answer.get("error").is_none(), "{method}: {answer}");
                return answer["result"].clone();
            }
        }
    }

    /// The value of a JavaScript expression in the page.
    fn eval(&mut self, expression: &str) -> Value {
        let session = self.session.clone();
        let r = self.call(Some(&session), "Runtime.evaluate", json!({"expression": expression, "returnByValue": true}));
        r["result"]["value"].clone()
    }

    /// Evaluates `expression` every 200 ms until `done` holds for its value (at most `secs`).
    fn until(&mut self, what: &str, secs: u64, expression: &str, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let v = self.eval(expression);
            if done(&v) {
                return v;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what}; last: {v}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the test reads from the page: cluster-a's cell on NEW, the rows the filter leaves
/// visible, the panel's heading, how many times the page swapped its table in.
const PROBE: &str = r#"(function () {
  var cell = document.querySelector('td.cell[data-cluster="cluster-a"][data-release="rel-20250315-001"]');
  var rows = Array.from(document.querySelectorAll('tr[data-search]')).filter(function (r) { return !r.hidden; });
  var heading = document.querySelector('#details h2');
  return {
    state: cell ? cell.dataset.state : null,
    visible: rows.map(function (r) { return r.querySelector('th.cluster').firstChild.textContent; }),
    panel: heading ? heading.textContent : null,
    swaps: Number(document.body.dataset.swaps || '0'),
    mark: window.leftByTheTest || null,
  };
})()"#;

#[test]
fn the_served_page_shows_a_new_status_without_reloading() {
    let f = fleet();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fleetgate"));
    cmd.args(["status", "--repo", &f.url, "--serve", &port.to_string(), "--interval", "500ms"]);
    cmd.env_remove("FLEETGATE_REPO");
    let _serve = Guarded::spawn("status-serve", cmd, &dir.path().join("serve.log")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).map_or(true, |_| http(port, "GET", "/").0 != 200) {
        assert!(
            Instant::now() < deadline,
            "the page was not served: {}",
            std::fs::read_to_string(dir.path().join("serve.log")).unwrap()
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // Read-only, and deep links narrow like the terminal's flags.
    assert_eq!(http(port, "POST", "/").0, 405);
    assert_eq!(http(port, "DELETE", "/generation").0, 405);
    let (code, failures) = http(port, "GET", "/?state=failure");
    assert_eq!(code, 200);
    assert!(
        failures.contains("data-cluster=\"cluster-b\"") && !failures.contains("data-cluster=\"cluster-a\""),
        "{failures}"
    );
    let (code, typo) = http(port, "GET", "/?wave=canery");
    assert_eq!(code, 400);
    assert!(typo.contains("no wave canery in this fleet"), "{typo}");

    let Some(chromium) = chromium() else { return };
    let mut page = Browser::open(&chromium, &format!("http://127.0.0.1:{port}/?q=cluster-a#cluster-a/{NEW}"));
    let before = page.until("the page's script", 60, PROBE, |v| v["state"].is_string() && v["panel"].is_string());
    assert_eq!(before["state"], "success", "{before}");
    assert_eq!(before["visible"], json!(["cluster-a"]), "the filter box from ?q=: {before}");
    assert_eq!(before["panel"], format!("cluster-a · {NEW}"), "{before}");
    page.eval("window.leftByTheTest = 'same document'");

    // A status lands in the repo: cluster-a reports an error on NEW.
    let agent = tempfile::tempdir().unwrap();
    let repo = git2::Repository::init_bare(agent.path()).unwrap();
    let remote = GitRemote::new(&f.url);
    status::sync(&repo, &remote).unwrap();
    let s = Status::new("cluster-a", NEW, &f.new, State::Error, "could not reach the API server");
    status::write(&repo, &remote, &s, &identity("cluster-a")).unwrap();

    let after = page.until("the new status on the open page", 60, PROBE, |v| v["state"] == "error");
    println!("{after}");
    assert_eq!(after["mark"], "same document", "the page was reloaded: {after}");
    assert!(after["swaps"].as_u64().unwrap() >= 1, "{after}");
    assert_eq!(after["visible"], json!(["cluster-a"]), "the filter stays: {after}");
    assert_eq!(after["panel"], format!("cluster-a · {NEW}"), "the selected cell stays: {after}");
}
