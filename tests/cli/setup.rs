//! How fleetgate is built and set up on a machine, for real:
//!
//! * the CLI (the binary these tests run: a plain cargo build, as `cargo install` makes it) runs
//!   wherever a `cargo new` hello world built here runs: it needs no newer glibc symbol version and
//!   no DT_RELR support (`GLIBC_ABI_DT_RELR`, glibc ≥ 2.36);
//! * the image's build (hack/agent-build.sh, with its link/cc and v0 names) links a program with
//!   a symbol-ordering list of readable names (no crate hashes, as link/agent.order holds them):
//!   the listed functions come first, in the list's order, whichever order that is, a new list
//!   relinks, a list naming functions the program lacks still links, and relocations are packed;
//! * hack/deps.sh, against fake apt-get, dpkg-query, systemctl, id and sudo on PATH: a running,
//!   enabled `ssh` stays so, the services of the packages it installs neither start nor stay
//!   enabled, policy-rc.d forbids them only while apt runs, and a machine's own is left alone.
#![cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `program` building into `target_dir`, not this repository's, without the caller's RUSTFLAGS.
fn builder(program: impl AsRef<OsStr>, target_dir: &Path) -> Command {
    let mut cmd = Command::new(program);
    cmd.env("CARGO_TARGET_DIR", target_dir).env_remove("RUSTFLAGS");
    cmd
}

/// The cargo running these tests (hack/agent-build.sh runs it too, as `$CARGO`).
fn cargo(target_dir: &Path) -> Command {
    builder(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()), target_dir)
}

fn success(what: &str, out: Output) -> String {
    assert!(
        out.status.success(),
        "{what}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The symbol versions `binary` needs from glibc (readelf's version needs), e.g. `GLIBC_2.34`.
fn glibc_versions(binary: &Path) -> Vec<String> {
    let out = Command::new("readelf").args(["-V", "--wide"]).arg(binary).output().expect("readelf (binutils)");
    let text = success("readelf -V", out);
    // "  0x0010:   Name: GLIBC_2.34  Flags: none  Version: 5", under "Version needs section".
    let needs = text.split("Version needs section").nth(1).unwrap_or_default();
    let mut names: Vec<String> = needs
        .lines()
        .filter_map(|line| line.split("Name: ").nth(1)?.split_whitespace().next())
        .filter(|name| name.starts_with("GLIBC_"))
        .map(String::from)
        .collect();
    names.sort();
    names.dedup();
    names
}

/// `GLIBC_2.34` → [2, 34]; None for `GLIBC_PRIVATE`, `GLIBC_ABI_DT_RELR`.
fn numbered(version: &str) -> Option<Vec<u32>> {
    version.strip_prefix("GLIBC_")?.split('.').map(|n| n.parse().ok()).collect()
}

#[test]
fn the_cli_needs_no_newer_glibc_than_a_hello_world_built_here() {
    let dir = tempfile::tempdir().unwrap();
    let hello = dir.path().join("hello");
    let mut new = cargo(&dir.path().join("target"));
    new.args(["new", "--offline", "--vcs", "none", "--name", "hello"]).arg(&hello);
    success("cargo new", new.output().unwrap());
    let mut build = cargo(&dir.path().join("target"));
    build.args(["build", "--offline", "--manifest-path"]).arg(hello.join("Cargo.toml"));
    success("cargo build (hello world)", build.output().unwrap());
    let plain = glibc_versions(&dir.path().join("target/debug/hello"));
    let newest = plain.iter().filter_map(|v| numbered(v)).max().expect("a hello world needs some GLIBC_x.y");

    let cli = Path::new(env!("CARGO_BIN_EXE_fleetgate"));
    let needs = glibc_versions(cli);
    assert!(!needs.is_empty(), "{} needs no glibc version: not a dynamic glibc binary?", cli.display());
    assert!(
        !needs.iter().any(|v| v == "GLIBC_ABI_DT_RELR"),
        "the CLI packs its relocations (needs glibc ≥ 2.36): {needs:?}"
    );
    let newer: Vec<&String> = needs.iter().filter(|v| numbered(v).is_some_and(|n| n > newest)).collect();
    assert!(newer.is_empty(), "the CLI needs {newer:?}, newer than a hello world's {plain:?}");
}

const PROGRAM: &str = r#"
#[inline(never)]
fn first<T: std::fmt::Debug>(t: T) { println!("{t:?}"); }
#[inline(never)]
fn second() { println!("second"); }
#[inline(never)]
fn third() { println!("third"); }
fn main() { first(1u8); second(); third(); }
"#;

/// A package whose binary is `fleetgate` (what hack/agent-build.sh builds), with an `agent` profile
/// optimised for size as the real one, less its slow fat LTO.
fn program(dir: &Path) -> PathBuf {
    let package = dir.join("program");
    std::fs::create_dir_all(&package).unwrap();
    std::fs::write(
        package.join("Cargo.toml"),
        "[package]\nname = \"fleetgate\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\n\
         [[bin]]\nname = \"fleetgate\"\npath = \"main.rs\"\n\n\
         [profile.agent]\ninherits = \"release\"\nopt-level = \"z\"\n\n[workspace]\n",
    )
    .unwrap();
    std::fs::write(package.join("main.rs"), PROGRAM).unwrap();
    let mut lock = cargo(&dir.join("target"));
    lock.args(["generate-lockfile", "--offline", "--manifest-path"]).arg(package.join("Cargo.toml"));
    success("cargo generate-lockfile", lock.output().unwrap());
    package
}

/// Links `package` as the image's build does with `order` as the list; the binary and the
/// address of each function, by readable name.
fn link(dir: &Path, package: &Path, order: &[&str]) -> (PathBuf, Vec<(String, u64)>) {
    let list = dir.join("order");
    std::fs::write(&list, order.iter().map(|n| format!("{n}\n")).collect::<String>()).unwrap();
    let build = builder("bash", &dir.join("target"))
        .arg(repo().join("hack/agent-build.sh"))
        .arg("--manifest-path")
        .arg(package.join("Cargo.toml"))
        .env("FLEETGATE_LINK_ORDER", &list)
        .output()
        .unwrap();
    success("hack/agent-build.sh", build);
    let binary = dir.join("target/agent/fleetgate");
    let run = Command::new(&binary).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&run.stdout), "1\nsecond\nthird\n");

    let nm = Command::new("nm").args(["--defined-only", "-C"]).arg(&binary).output().unwrap();
    let symbols = success("nm", nm)
        .lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ' ');
            let addr = u64::from_str_radix(parts.next()?, 16).ok()?;
            let name = parts.nth(1)?;
            // `fleetgate[1a2b…]::second` → `fleetgate::second`, as the list names it.
            let readable = name.split('[').next()?.to_string() + name.split_once(']').map_or("", |(_, rest)| rest);
            Some((readable, addr))
        })
        .collect();
    (binary, symbols)
}

fn addr(symbols: &[(String, u64)], name: &str) -> u64 {
    symbols.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("{name} not in {symbols:?}")).1
}

#[test]
fn the_image_build_puts_the_listed_functions_first_in_the_lists_order() {
    let dir = tempfile::tempdir().unwrap();
    let package = program(dir.path());
    // The second list relinks the same, unchanged program: only the list is new.
    for order in [
        ["fleetgate::third", "fleetgate::second", "fleetgate::first::<u8>"],
        ["fleetgate::first::<u8>", "fleetgate::second", "fleetgate::third"],
    ] {
        let (binary, symbols) = link(dir.path(), &package, &order);
        let at: Vec<u64> = order.iter().map(|n| addr(&symbols, n)).collect();
        assert!(at.windows(2).all(|w| w[0] < w[1]), "{order:?} linked at {at:?}");
        let main = addr(&symbols, "fleetgate::main");
        assert!(at.iter().all(|a| *a < main), "the unlisted fleetgate::main ({main:#x}) before a listed one: {at:?}");
        let needs = glibc_versions(&binary);
        assert!(needs.iter().any(|v| v == "GLIBC_ABI_DT_RELR"), "relocations not packed: {needs:?}");
    }
}

#[test]
fn the_image_build_links_with_a_list_naming_functions_the_program_lacks() {
    let dir = tempfile::tempdir().unwrap();
    let package = program(dir.path());
    let (_, symbols) =
        link(dir.path(), &package, &["gone::since::then", "fleetgate::second", "<fleetgate::Nothing>::method"]);
    assert!(addr(&symbols, "fleetgate::second") < addr(&symbols, "fleetgate::third"));
}

/// A machine for hack/deps.sh: fake apt-get, dpkg-query, systemctl, id and sudo first on PATH,
/// their state in files (`absent/PKG`, `active/UNIT`, `enabled/UNIT`), and `root/` where
/// policy-rc.d goes (DEPS_ROOT). Every package is installed unless marked absent.
struct Machine {
    dir: tempfile::TempDir,
}

/// What Debian's apt-get does for each package, as far as services go: its maintainer scripts
/// enable the unit (deb-systemd-helper) and start it unless policy-rc.d says 101
/// (deb-systemd-invoke). `policy-during` is the policy-rc.d of the install, `policy` logs what it
/// answered.
const APT_GET: &str = r#"#!/bin/sh
echo "apt-get $*" >>"$FAKE/calls"
[ "$1" = install ] || exit 0
policy=$DEPS_ROOT/usr/sbin/policy-rc.d
[ ! -e "$policy" ] || cp "$policy" "$FAKE/policy-during"
[ ! -e "$FAKE/apt-fails" ] || exit 100
for pkg; do
  case $pkg in -* | install) continue ;; esac
  rm -f "$FAKE/absent/$pkg"
  case $pkg in openssh-server) unit=ssh ;; prometheus | tinyproxy) unit=$pkg ;; *) continue ;; esac
  touch "$FAKE/enabled/$unit"
  if [ -x "$policy" ]; then rc=0; "$policy" "$unit" start || rc=$?; else rc=none; fi
  echo "$unit start: policy-rc.d $rc" >>"$FAKE/policy"
  [ "$rc" = 101 ] || touch "$FAKE/active/$unit"
done
"#;

const DPKG_QUERY: &str = r#"#!/bin/sh
for pkg; do :; done
[ ! -e "$FAKE/absent/$pkg" ] && printf 'install ok installed'
"#;

const SYSTEMCTL: &str = r#"#!/bin/sh
verb= unit=
for a; do
  case $a in --*) ;; *) if [ -z "$verb" ]; then verb=$a; else unit=$a; fi ;; esac
done
case $verb in
is-active) [ -e "$FAKE/active/$unit" ] ;;
is-enabled) [ -e "$FAKE/enabled/$unit" ] ;;
start) echo "systemctl $*" >>"$FAKE/calls"; touch "$FAKE/active/$unit" ;;
stop) echo "systemctl $*" >>"$FAKE/calls"; rm -f "$FAKE/active/$unit" ;;
enable) echo "systemctl $*" >>"$FAKE/calls"; touch "$FAKE/enabled/$unit" ;;
disable) echo "systemctl $*" >>"$FAKE/calls"; rm -f "$FAKE/enabled/$unit" ;;
*) echo "systemctl $*: not faked" >&2; exit 1 ;;
esac
"#;

impl Machine {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        for sub in ["bin", "absent", "active", "enabled", "root/usr/sbin"] {
            std::fs::create_dir_all(dir.path().join(sub)).unwrap();
        }
        let id = "#!/bin/sh\necho 1000\n";
        let sudo = "#!/bin/sh\nprintf 'sudo %s\\n' \"$*\" >>\"$FAKE/calls\"\nexec \"$@\"\n";
        for (name, script) in
            [("apt-get", APT_GET), ("dpkg-query", DPKG_QUERY), ("systemctl", SYSTEMCTL), ("id", id), ("sudo", sudo)]
        {
            Self::executable(&dir.path().join("bin").join(name), script);
        }
        Machine { dir }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn executable(path: &Path, script: &str) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(path, script).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn absent(&self, packages: &[&str]) {
        for p in packages {
            std::fs::write(self.path(&format!("absent/{p}")), "").unwrap();
        }
    }

    fn running_and_enabled(&self, unit: &str) {
        std::fs::write(self.path(&format!("active/{unit}")), "").unwrap();
        std::fs::write(self.path(&format!("enabled/{unit}")), "").unwrap();
    }

    fn is(&self, state: &str, unit: &str) -> bool {
        self.path(&format!("{state}/{unit}")).exists()
    }

    fn policy_rc_d(&self) -> PathBuf {
        self.path("root/usr/sbin/policy-rc.d")
    }

    /// The file `name`, empty when it was never written.
    fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.path(name)).unwrap_or_default()
    }

    fn log(&self, name: &str) -> Vec<String> {
        self.read(name).lines().map(String::from).collect()
    }

    /// Runs `hack/deps.sh SET`.
    fn deps(&self, set: &str) -> Output {
        let path = format!("{}:{}", self.path("bin").display(), std::env::var("PATH").unwrap());
        Command::new("bash")
            .arg(repo().join("hack/deps.sh"))
            .arg(set)
            .env("PATH", path)
            .env("FAKE", self.dir.path())
            .env("DEPS_ROOT", self.path("root"))
            .output()
            .unwrap()
    }
}

#[test]
fn deps_leaves_a_running_ssh_running_and_the_new_services_neither_started_nor_enabled() {
    let machine = Machine::new();
    machine.running_and_enabled("ssh");
    machine.absent(&["prometheus", "chromium", "tinyproxy"]);

    success("hack/deps.sh test", machine.deps("test"));

    assert!(machine.is("active", "ssh") && machine.is("enabled", "ssh"), "ssh no longer running and enabled");
    let calls = machine.log("calls");
    assert!(!calls.iter().any(|c| c.ends_with(" ssh")), "deps.sh touched ssh: {calls:?}");
    assert!(
        calls.iter().any(|c| c == "apt-get install -y -qq --no-install-recommends prometheus chromium tinyproxy"),
        "{calls:?}"
    );
    // Its own policy-rc.d forbade both starts, and is gone; the enabled units are disabled again.
    assert!(machine.read("policy-during").ends_with("exit 101\n"), "{}", machine.read("policy-during"));
    assert_eq!(machine.log("policy"), ["prometheus start: policy-rc.d 101", "tinyproxy start: policy-rc.d 101"]);
    assert!(!machine.policy_rc_d().exists(), "policy-rc.d left behind");
    for unit in ["prometheus", "tinyproxy"] {
        assert!(
            !machine.is("active", unit) && !machine.is("enabled", unit),
            "{unit} left running or enabled: {calls:?}"
        );
    }
}

#[test]
fn deps_leaves_a_machines_own_policy_rc_d_as_it_is() {
    let machine = Machine::new();
    let own = "#!/bin/sh\n# the machine's own: every service may start\nexit 0\n";
    Machine::executable(&machine.policy_rc_d(), own);
    machine.absent(&["prometheus"]);

    success("hack/deps.sh test", machine.deps("test"));

    assert_eq!(std::fs::read_to_string(machine.policy_rc_d()).unwrap(), own);
    assert_eq!(machine.read("policy-during"), own);
    // The machine's own answered during the install (so Prometheus started), and deps.sh put it
    // back as it was before: stopped, not enabled.
    assert_eq!(machine.log("policy"), ["prometheus start: policy-rc.d 0"]);
    assert!(!machine.is("active", "prometheus") && !machine.is("enabled", "prometheus"), "{:?}", machine.log("calls"));
}

#[test]
fn deps_removes_its_policy_rc_d_when_the_install_fails() {
    let machine = Machine::new();
    machine.absent(&["tinyproxy"]);
    std::fs::write(machine.path("apt-fails"), "").unwrap();

    let out = machine.deps("test");

    assert!(!out.status.success(), "deps.sh succeeded although apt-get failed");
    assert!(machine.read("policy-during").ends_with("exit 101\n"), "apt-get ran without policy-rc.d");
    assert!(!machine.policy_rc_d().exists(), "policy-rc.d left behind after a failed install");
}

#[test]
fn deps_for_the_demo_installs_only_the_demos_packages_and_nothing_when_they_are_there() {
    let machine = Machine::new();
    machine.absent(&["chromium", "zsh", "fish", "tinyproxy", "openssh-server", "prometheus", "buildah"]);
    success("hack/deps.sh demo", machine.deps("demo"));
    assert_eq!(machine.log("calls"), Vec::<String>::new(), "nothing to install, yet it called sudo or apt");

    machine.absent(&["git"]);
    success("hack/deps.sh demo", machine.deps("demo"));
    let installs: Vec<String> = machine.log("calls").into_iter().filter(|c| c.starts_with("apt-get install")).collect();
    assert_eq!(installs, ["apt-get install -y -qq --no-install-recommends git"]);
}
