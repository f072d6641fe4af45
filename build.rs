//! Build script: stamps the git commit into `kin --version` (`KIN_GIT_COMMIT`). The commit comes
//! from `git` when building from a checkout, from `.cargo_vcs_info.json` when building a packaged
//! crate, and is `unknown` otherwise; a build never fails for want of it.

use std::path::Path;
use std::process::Command;

fn main() {
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).or_else(vcs_info).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=KIN_GIT_COMMIT={commit}");
    // Rebuild when HEAD moves: the HEAD file, the branch it points to, and packed refs.
    for path in ["HEAD", "packed-refs"] {
        if let Some(p) = git(&["rev-parse", "--git-path", path]) {
            println!("cargo:rerun-if-changed={p}");
        }
    }
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"])
        && let Some(p) = git(&["rev-parse", "--git-path", &branch])
    {
        println!("cargo:rerun-if-changed={p}");
    }
    println!("cargo:rerun-if-changed=.cargo_vcs_info.json");
}

/// The trimmed stdout of a successful `git` command, if git is there and answers.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string()).filter(|s| !s.is_empty())
}

/// The commit `cargo package` recorded (crates built from crates.io or a packaged tarball).
fn vcs_info() -> Option<String> {
    let text = std::fs::read_to_string(Path::new(".cargo_vcs_info.json")).ok()?;
    let start = text.find("\"sha1\"")? + "\"sha1\"".len();
    let rest = text[start..].trim_start().strip_prefix(':')?.trim_start().strip_prefix('"')?;
    Some(rest.chars().take_while(|c| c.is_ascii_hexdigit()).take(12).collect())
}
