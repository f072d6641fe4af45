//! Build script: stamps the git commit into `kin --version` (`KIN_GIT_COMMIT`). The commit comes
//! from `git` when building from a checkout, from `.cargo_vcs_info.json` when building a packaged
//! crate, and is `unknown` otherwise; a build never fails for want of it.
//!
//! A release build of the binary for Linux also links the functions `kin acp` runs from start to
//! its first turn together, in the order they first run (`scripts/startup.order`, made by
//! `scripts/startup-order.sh`), when the linker takes a symbol ordering file (LLD, rustc's default
//! linker on x86_64 Linux): the kernel maps a binary's code 64 KiB around each page a process
//! touches, so start-up code spread over the whole binary made most of an idle kin's RSS. Where the
//! linker does not take the file, the build goes on without it (with a warning).

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
    link_order();
}

/// The start-up symbol order, for release builds of the binary on Linux (`KIN_LINK_ORDER=0`
/// turns it off); `KIN_LINK_MAP=PATH` also writes the linker's map there.
fn link_order() {
    const ORDER: &str = "scripts/startup.order";
    println!("cargo:rerun-if-changed={ORDER}");
    println!("cargo:rerun-if-env-changed=KIN_LINK_ORDER");
    println!("cargo:rerun-if-env-changed=KIN_LINK_MAP");
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    if var("PROFILE") != "release" || var("CARGO_CFG_TARGET_OS") != "linux" || var("KIN_LINK_ORDER") == "0" {
        return;
    }
    let order = Path::new(&var("CARGO_MANIFEST_DIR")).join(ORDER);
    if !order.is_file() {
        return;
    }
    let mut args = vec![
        format!("-Wl,--symbol-ordering-file={}", order.display()),
        // Symbols the file names that this build does not have (another toolchain or dependency
        // version) are skipped; the rest keep their order.
        "-Wl,--no-warn-symbol-ordering".to_string(),
    ];
    if !var("KIN_LINK_MAP").is_empty() {
        args.push(format!("-Wl,-Map={}", var("KIN_LINK_MAP")));
    }
    match links_with(&args) {
        Ok(()) => {
            for arg in args {
                println!("cargo:rustc-link-arg-bins={arg}");
            }
        }
        Err(why) => println!("cargo:warning=kin is linked without its start-up order ({ORDER}): {why}"),
    }
}

/// Whether a trivial binary links with `args` for this target and linker configuration.
fn links_with(args: &[String]) -> Result<(), String> {
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    let out = Path::new(&var("OUT_DIR")).join("link-order-probe");
    std::fs::create_dir_all(&out).map_err(|e| e.to_string())?;
    let source = out.join("probe.rs");
    std::fs::write(&source, "fn main() {}\n").map_err(|e| e.to_string())?;
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let mut command = Command::new(rustc);
    command.arg("--target").arg(var("TARGET")).arg("-o").arg(out.join("probe")).arg(&source);
    command.args(var("CARGO_ENCODED_RUSTFLAGS").split('\x1f').filter(|f| !f.is_empty()));
    if !var("RUSTC_LINKER").is_empty() {
        command.arg(format!("-Clinker={}", var("RUSTC_LINKER")));
    }
    for arg in args.iter().filter(|a| !a.starts_with("-Wl,-Map=")) {
        command.arg(format!("-Clink-arg={arg}"));
    }
    let output = command.output().map_err(|e| format!("cannot run rustc: {e}"))?;
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    Err(stderr.lines().find(|l| l.contains("error")).unwrap_or("the probe did not link").trim().to_string())
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
