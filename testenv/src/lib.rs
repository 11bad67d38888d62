//! Real components for fleetgate's tests and demo, each started on loopback in its own temp dir and
//! stopped (process killed, dir removed) when its handle drops:
//!
//! * [`TestCluster`] — etcd + kube-apiserver, optionally kube-controller-manager, kube-scheduler and
//!   kwok with a fake node so Deployments really produce Pods ([`cluster`]).
//! * [`TestCluster::deploy_agent`] — `deploy/` applied and a ServiceAccount token for the agent,
//!   so it runs with deploy/'s RBAC as in a spoke ([`deployed`]).
//! * [`GitDaemon`] — `git daemon` serving bare repos over `git://`, push enabled ([`git`]).
//! * [`GpgHome`] — a throw-away `GNUPGHOME` with generated keys ([`gpg`]).
//! * [`Prometheus`] — Debian's Prometheus scraping an endpoint the test serves ([`prometheus`]).
//! * [`Gitea`] — a real forge (API, Git over HTTP, webhooks, pull requests, commit statuses), when
//!   `hack/gitea-binary.sh` built it; over HTTPS with the test's own CA if asked ([`gitea`]).
//! * [`Sshd`] — Debian's OpenSSH server serving bare repos over `ssh://`, Git commands only,
//!   with its own host key ([`sshd`]).
//! * [`Tinyproxy`] — Debian's tinyproxy, an HTTP(S) proxy whose log shows who went through it
//!   ([`proxy`]).
//! * A generated operator at real scale as a Helm chart, and the `helm` that renders it
//!   ([`operator_fixture`]).
//! * Real operators' published manifests (Argo CD's `install.yaml`, prometheus-operator's
//!   `bundle.yaml`), fetched from the Go module proxy into the cache ([`upstream`]).
//!
//! [`wait`] has the bounded waits tests use around them.

pub mod cluster;
pub mod deployed;
pub mod git;
pub mod gitea;
pub mod gpg;
pub mod operator_fixture;
pub mod process;
pub mod prometheus;
pub mod proxy;
pub mod ssh;
pub mod sshd;
pub mod upstream;
pub mod wait;

pub use cluster::*;
pub use deployed::*;
pub use git::*;
pub use gitea::*;
pub use gpg::*;
pub use prometheus::*;
pub use proxy::*;
pub use ssh::*;
pub use sshd::*;
