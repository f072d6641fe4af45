//! Install and release parts that run here: `kin --version` names the commit, scripts/dist.sh
//! builds the archive layout and checksum file the release workflow publishes, and agent.json
//! (the ACP registry manifest) agrees with Cargo.toml and the workflow's target matrix, and the
//! start-up link order (scripts/startup.order) was made for this toolchain and these manifests.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The registry's platform names and the Rust targets the workflow builds for them.
const PLATFORMS: [(&str, &str); 4] = [
    ("linux-x86_64", "x86_64-unknown-linux-musl"),
    ("linux-aarch64", "aarch64-unknown-linux-musl"),
    ("darwin-x86_64", "x86_64-apple-darwin"),
    ("darwin-aarch64", "aarch64-apple-darwin"),
];

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("spawn");
    assert!(out.status.success(), "{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8")
}

#[test]
fn version_names_the_crate_version_and_the_commit() {
    let printed = run(Command::new(env!("CARGO_BIN_EXE_kin")).arg("--version"));
    let expected_commit = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(ROOT)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map_or_else(|| "unknown".to_string(), |o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    assert_eq!(printed.trim(), format!("kin {} (commit {expected_commit})", env!("CARGO_PKG_VERSION")));
}

fn workflow_targets() -> Vec<String> {
    let text = std::fs::read_to_string(Path::new(ROOT).join(".github/workflows/release.yml")).unwrap();
    text.lines().filter_map(|l| l.trim().strip_prefix("- target: ")).map(str::to_string).collect()
}

#[test]
fn agent_manifest_matches_the_crate_and_the_release_matrix() {
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(Path::new(ROOT).join("agent.json")).unwrap()).unwrap();
    let version = env!("CARGO_PKG_VERSION");
    let repository = env!("CARGO_PKG_REPOSITORY");
    assert_eq!(manifest["id"], "kin");
    assert_eq!(manifest["name"], "kin");
    assert_eq!(manifest["version"], version);
    assert_eq!(manifest["description"], env!("CARGO_PKG_DESCRIPTION"));
    assert_eq!(manifest["license"], env!("CARGO_PKG_LICENSE"));
    assert_eq!(manifest["repository"], repository);
    let binary = manifest["distribution"]["binary"].as_object().expect("distribution.binary");
    let mut listed: Vec<&str> = binary.keys().map(String::as_str).collect();
    listed.sort_unstable();
    let mut known: Vec<&str> = PLATFORMS.iter().map(|(p, _)| *p).collect();
    known.sort_unstable();
    assert_eq!(listed, known, "agent.json platforms");
    for (platform, target) in PLATFORMS {
        let entry = &binary[platform];
        assert_eq!(
            entry["archive"],
            format!("{repository}/releases/download/v{version}/kin-{target}.tar.gz"),
            "{platform} archive"
        );
        assert_eq!(entry["cmd"], "./kin", "{platform} cmd");
        assert_eq!(entry["args"], serde_json::json!(["acp"]), "{platform} args");
    }
    let mut built = workflow_targets();
    built.sort();
    let mut wanted: Vec<String> = PLATFORMS.iter().map(|(_, t)| t.to_string()).collect();
    wanted.sort();
    assert_eq!(built, wanted, "release.yml matrix targets");
}

/// Issue 23: a release build links the functions `kin acp` runs to its first turn together, named
/// in scripts/startup.order by their mangled symbols. Those carry a hash of the crate's
/// dependencies and the toolchain, so a dependency change or a new toolchain leaves a file whose
/// names match none of kin's functions: nothing fails, but an idle kin's RSS rose from 6 to 9-10
/// MiB each of the three times that went unnoticed. The file's first line is the key it was made
/// for (scripts/startup-order.sh): SHA-256 of `rustc -V`'s output, Cargo.toml and Cargo.lock.
#[test]
fn the_startup_order_was_made_for_this_toolchain_and_these_manifests() {
    use sha2::Digest;
    let root = Path::new(ROOT);
    let order = std::fs::read_to_string(root.join("scripts/startup.order")).expect("scripts/startup.order");
    let recorded = order.lines().next().and_then(|line| line.strip_prefix("# key ")).unwrap_or("none");
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let mut key = sha2::Sha256::new();
    key.update(run(Command::new(rustc).arg("-V")));
    for manifest in ["Cargo.toml", "Cargo.lock"] {
        key.update(std::fs::read(root.join(manifest)).expect(manifest));
    }
    let key: String = key.finalize().iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        recorded, key,
        "scripts/startup.order was made for another toolchain or other dependencies, so a release build \
         would not find kin's start-up functions in it (an idle kin's RSS grows by a half): run \
         scripts/startup-order.sh and commit the file it writes"
    );
}

#[test]
fn dist_script_builds_the_archive_layout_and_a_checksum_that_verifies() {
    let out = tempfile::tempdir().unwrap();
    let target = "x86_64-unknown-linux-musl";
    run(Command::new(Path::new(ROOT).join("scripts/dist.sh"))
        .args([target, env!("CARGO_BIN_EXE_kin")])
        .arg(out.path()));
    let archive = format!("kin-{target}.tar.gz");
    let listing = run(Command::new("tar").arg("-tvzf").arg(out.path().join(&archive)));
    let entries: Vec<(&str, &str)> = listing
        .lines()
        .map(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            (fields[0], *fields.last().unwrap())
        })
        .collect();
    assert_eq!(entries, [("-rwxr-xr-x", "kin"), ("-rw-r--r--", "README.md")], "{listing}");
    let unpacked = out.path().join("unpacked");
    std::fs::create_dir(&unpacked).unwrap();
    run(Command::new("tar").arg("-xzf").arg(out.path().join(&archive)).arg("-C").arg(&unpacked));
    let version = run(Command::new(unpacked.join("kin")).arg("--version"));
    assert!(version.starts_with(&format!("kin {} (commit ", env!("CARGO_PKG_VERSION"))), "{version}");
    let sums = std::fs::read_to_string(out.path().join(format!("{archive}.sha256"))).unwrap();
    assert!(sums.trim_end().ends_with(&format!("  {archive}")), "{sums}");
    run(Command::new("sha256sum").args(["-c", &format!("{archive}.sha256")]).current_dir(out.path()));
    // A changed archive no longer verifies.
    std::fs::write(out.path().join(&archive), b"tampered").unwrap();
    let check = Command::new("sha256sum").args(["-c", &format!("{archive}.sha256")]).current_dir(out.path()).output();
    assert!(!check.unwrap().status.success(), "a tampered archive must fail its checksum");
}
