//! The container image (Dockerfile) built here with buildah (`hack/image.sh`, what `make image`
//! runs) from the test build's binary, and run: `fleetgate --version`, then `fleetgate init` and
//! `fleetgate validate` inside the image, as its non-root user, with its own gpg.
//!
//! Skipped, saying so, when buildah is not installed (it needs root and Debian's package;
//! `make test` installs it through hack/deps.sh, so CI runs it).

use std::path::Path;
use std::process::Command;

fn buildah(args: &[&str]) -> String {
    let out = Command::new("buildah").args(["--storage-driver", "vfs"]).args(args).output().unwrap();
    assert!(out.status.success(), "buildah {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn the_image_runs_version_and_validate() {
    if Command::new("buildah").arg("--version").output().is_err() {
        eprintln!("SKIPPED: buildah is not installed (`make deps-test` or `make image` installs it)");
        return;
    }
    // vfs storage with chroot isolation needs root; rootless buildah needs subuid ranges we do not set up.
    let uid = Command::new("id").arg("-u").output().unwrap();
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        eprintln!("SKIPPED: building the image needs root (buildah with vfs storage and chroot isolation)");
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let binary = Path::new(env!("CARGO_BIN_EXE_fleetgate")).strip_prefix(root).expect("the binary is under target/");
    let image = "localhost/fleetgate:test";
    let out = Command::new("bash")
        .arg(root.join("hack/image.sh"))
        .env("FLEETGATE_BINARY", binary)
        .env("IMAGE", image)
        .output()
        .unwrap();
    assert!(out.status.success(), "hack/image.sh: {}", String::from_utf8_lossy(&out.stderr));

    let container = buildah(&["from", "--pull=never", image]);
    let run = |args: &[&str]| {
        let mut full = vec!["run", "--isolation", "chroot", &container, "--", "/usr/local/bin/fleetgate"];
        full.extend(args);
        buildah(&full)
    };
    let version = run(&["--version"]);
    assert!(version.starts_with("fleetgate "), "{version}");
    run(&["init", "/tmp/fleet"]);
    let validated = run(&["validate", "--repo", "/tmp/fleet"]);
    assert!(validated.contains("no findings"), "{validated}");
    buildah(&["rm", &container]);
}
