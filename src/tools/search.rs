//! The search tools `glob` (files by name) and `grep` (file contents by regex). Both walk the
//! tree with `ignore::WalkBuilder`, honouring `.gitignore` even outside a git repository and
//! skipping `.git`, on the blocking pool; results are capped (100 paths; 250 matches and 50 KB;
//! 2000 characters of a line; lines of at most 8 MiB are searched) with a note of what was left
//! out.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use futures::FutureExt;
use futures::future::BoxFuture;
use globset::{GlobBuilder, GlobMatcher};
use grep_regex::RegexMatcher;
use grep_searcher::{BinaryDetection, Searcher, SearcherBuilder, Sink, SinkMatch};
use ignore::{DirEntry, Walk, WalkBuilder};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::access::named_path;
use super::args::{aborted, call_cwd, optional_str, required_str, run_blocking};
use super::fs::{MAX_LINE_BYTES, check_access, shown_line};
use super::paths;
use super::{Access, Tool, ToolContext, ToolError, ToolOutput};

/// Paths `glob` lists at most.
const MAX_GLOB_RESULTS: usize = 100;
/// Matching lines `grep` lists at most.
const MAX_GREP_MATCHES: usize = 250;
/// Bytes of matching lines one `grep` result holds at most; the note tells what was left out.
const MAX_GREP_BYTES: usize = 50 * 1024;
/// The longest line `grep` searches: the searcher's buffer never grows beyond this, and a file
/// with a longer line is reported as not (fully) searched.
const MAX_GREP_LINE_BYTES: usize = 8 * 1024 * 1024;
/// Files named in the note about files that could not be searched.
const MAX_NAMED_SKIPS: usize = 5;

/// `glob <pattern>` or `grep <pattern>`, with ` in <path>` when the call names one.
fn search_title(tool: &str, arguments: &Value) -> String {
    let pattern = arguments["pattern"].as_str().unwrap_or_default();
    match arguments["path"].as_str() {
        Some(path) => format!("{tool} {pattern} in {path}"),
        None => format!("{tool} {pattern}"),
    }
}

// ---------------------------------------------------------------------------------------------
// glob

/// `glob`: files whose names match a glob pattern, newest first.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct GlobTool;

impl Tool for GlobTool {
    fn name(&self) -> &str {
        "glob"
    }

    fn access(&self, arguments: &Value) -> Access {
        Access::Search { paths: named_path(arguments, "path") }
    }

    fn title(&self, arguments: &Value) -> String {
        search_title("glob", arguments)
    }

    fn guidance(&self) -> Option<&'static str> {
        Some("find files by name (`**/*.rs`); prefer it to `find` or `ls -R`.")
    }

    fn check(&self, arguments: &Value) -> Result<(), ToolError> {
        required_str(arguments, "pattern", "glob")?;
        optional_str(arguments, "path", "glob").map(drop)
    }

    fn description(&self) -> String {
        "Find files by name with a glob pattern such as `**/*.rs`, `src/**/*.{ts,tsx}` or \
         `Cargo.toml`. A pattern without `/` matches file names at any depth; a pattern with `/` \
         matches paths relative to the search directory (`*` stays within one directory, `**` \
         crosses directories). Searches `path` (default: the working directory), skipping files \
         ignored by .gitignore and the .git directory. Returns paths relative to the search \
         directory, most recently modified first, at most 100. To search file contents use grep."
            .to_string()
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "pattern": {
                    "type": "string",
                    "description": "Glob pattern, e.g. `**/*.rs` or `*.json`."
                },
                "path": {
                    "type": "string",
                    "description": "Directory to search in. Defaults to the working directory."
                }
            },
            "required": ["pattern"]
        })
    }

    fn parallel_safe(&self) -> bool {
        true
    }

    fn execute(&self, arguments: Value, ctx: ToolContext) -> BoxFuture<'static, Result<ToolOutput, ToolError>> {
        async move {
            let pattern = required_str(&arguments, "pattern", "glob")?;
            let path = optional_str(&arguments, "path", "glob")?;
            let cwd = call_cwd(&ctx);
            let cancel = ctx.cancel.clone();
            let allow = ctx.allow_outside;
            let text =
                run_blocking("glob", move || glob_files(&cwd, &pattern, path.as_deref(), &cancel, allow)).await?;
            Ok(ToolOutput::text(text))
        }
        .boxed()
    }
}

fn glob_files(
    cwd: &Path,
    pattern: &str,
    path: Option<&str>,
    cancel: &CancellationToken,
    allow_outside: bool,
) -> Result<String, ToolError> {
    let filter = NameFilter::new(pattern, "glob pattern")?;
    let root = search_root(cwd, path, allow_outside)?;
    if !root.is_dir() {
        return Err(ToolError::new(
            "NOT_A_DIRECTORY",
            format!("glob path {} is a file, not a directory; pass the directory to search in", root.display()),
        ));
    }
    let (found, unread) = find_files(&root, &filter, cancel);
    if cancel.is_cancelled() {
        return Err(aborted());
    }
    let mut text = render_glob(&root, pattern, found);
    if !unread.is_empty() {
        text.push_str(&format!(
            "\n\n({} director{} could not be read, so files in {} may be missing: {})",
            unread.len(),
            if unread.len() == 1 { "y" } else { "ies" },
            if unread.len() == 1 { "it" } else { "them" },
            named_briefly(&unread)
        ));
    }
    Ok(text)
}

/// The non-ignored files under `root` matching `filter`: the `MAX_GLOB_RESULTS` newest; and
/// the directories that could not be read, with why.
fn find_files(root: &Path, filter: &NameFilter, cancel: &CancellationToken) -> (Newest, Vec<String>) {
    let mut found = Newest::new(MAX_GLOB_RESULTS);
    let mut unread = Vec::new();
    for entry in walker(root) {
        if cancel.is_cancelled() {
            break;
        }
        let entry = match entry {
            Ok(entry) => entry,
            Err(error) => {
                unread.extend(unreadable(&error, root).map(|(shown, why)| format!("{shown} ({why})")));
                continue;
            }
        };
        if !is_file(&entry) || !filter.matches(entry.path(), root) {
            continue;
        }
        let modified = entry.metadata().ok().and_then(|meta| meta.modified().ok()).unwrap_or(SystemTime::UNIX_EPOCH);
        found.offer(entry.into_path(), modified);
    }
    (found, unread)
}

/// A directory the walk could not read (permission denied): its path relative to `base`, and
/// why; `None` for any other walk error (a symlink loop is left out on purpose).
fn unreadable(error: &ignore::Error, base: &Path) -> Option<(String, &'static str)> {
    fn denied(error: &ignore::Error) -> Option<Option<&Path>> {
        match error {
            ignore::Error::WithPath { path, err } => denied(err).map(|_| Some(path.as_path())),
            ignore::Error::WithDepth { err, .. } | ignore::Error::WithLineNumber { err, .. } => denied(err),
            ignore::Error::Io(e) if e.kind() == io::ErrorKind::PermissionDenied => Some(None),
            _ => None,
        }
    }
    let path = denied(error)?;
    let shown = path.map_or_else(|| base.display().to_string(), |p| relative_display(p, base));
    Some((shown, "permission denied"))
}

/// The first few of `names`, and how many more there are.
fn named_briefly(names: &[String]) -> String {
    const SHOWN: usize = 10;
    let mut text = names.iter().take(SHOWN).cloned().collect::<Vec<_>>().join(", ");
    if names.len() > SHOWN {
        text.push_str(&format!("; and {} more", names.len() - SHOWN));
    }
    text
}

/// The newest of the paths offered (by modification time, then by path), at most `keep` of
/// them, and how many were offered in all: memory stays bounded however many files match.
#[derive(Debug)]
struct Newest {
    keep: usize,
    /// A max-heap whose top is the worst kept: the oldest, the last by path among equals.
    heap: BinaryHeap<(Reverse<SystemTime>, PathBuf)>,
    total: usize,
}

impl Newest {
    fn new(keep: usize) -> Self {
        Newest { keep, heap: BinaryHeap::with_capacity(keep), total: 0 }
    }

    fn offer(&mut self, path: PathBuf, modified: SystemTime) {
        self.total += 1;
        let item = (Reverse(modified), path);
        if self.heap.len() < self.keep {
            self.heap.push(item);
        } else if let Some(mut worst) = self.heap.peek_mut()
            && item < *worst
        {
            *worst = item;
        }
    }

    /// The kept paths, newest first (then by path).
    fn into_sorted(self) -> Vec<PathBuf> {
        self.heap.into_sorted_vec().into_iter().map(|(_, path)| path).collect()
    }
}

fn render_glob(root: &Path, pattern: &str, found: Newest) -> String {
    let total = found.total;
    if total == 0 {
        let mut text = format!("No files found matching `{pattern}` in {}", root.display());
        // A pattern that names a place above or outside the search directory matches nothing
        // below it: say where to point instead.
        let outside = pattern.starts_with("../")
            || pattern.contains("/../")
            || (Path::new(pattern).is_absolute() && !Path::new(pattern).starts_with(root));
        if outside {
            text.push_str(
                " (a pattern matches paths below the search directory; to search another directory, give it as `path` and the pattern relative to it)",
            );
        }
        return text;
    }
    let shown = found.into_sorted();
    let mut text = shown.iter().map(|path| relative_display(path, root)).collect::<Vec<_>>().join("\n");
    if total > shown.len() {
        text.push_str(&format!(
            "\n\n({} more files omitted: showing the {} most recently modified of {total}. Use a \
             more specific pattern or path to see the rest.)",
            total - shown.len(),
            shown.len()
        ));
    }
    text
}

// ---------------------------------------------------------------------------------------------
// grep

/// `grep`: lines matching a regular expression, as `path:line: text`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct GrepTool;

struct GrepRequest {
    pattern: String,
    path: Option<String>,
    include: Option<String>,
}

impl Tool for GrepTool {
    fn name(&self) -> &str {
        "grep"
    }

    fn access(&self, arguments: &Value) -> Access {
        Access::Search { paths: named_path(arguments, "path") }
    }

    fn title(&self, arguments: &Value) -> String {
        search_title("grep", arguments)
    }

    fn guidance(&self) -> Option<&'static str> {
        Some(
            "search file contents by regex (`include` narrows by file name); prefer it to running \
             grep or rg in bash.",
        )
    }

    fn check(&self, arguments: &Value) -> Result<(), ToolError> {
        required_str(arguments, "pattern", "grep")?;
        optional_str(arguments, "path", "grep")?;
        optional_str(arguments, "include", "grep").map(drop)
    }

    fn description(&self) -> String {
        "Search file contents with a regular expression (Rust regex syntax, e.g. `fn\\s+main` or \
         `TODO|FIXME`; escape `(`, `[`, `.` and similar with a backslash to match them \
         literally). Searches the text files under `path` (default: the working directory; a \
         single file also works), skipping files ignored by .gitignore, the .git directory and \
         binary files. `include` keeps only files whose names match a glob such as `*.rs` or \
         `*.{ts,tsx}`. Each match is one line `path:line: text`, with paths relative to the \
         search directory; at most 250 matches are listed. Use glob to find files by name, and \
         read to see a match in context."
            .to_string()
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "pattern": {
                    "type": "string",
                    "description": "Regular expression to search for (Rust regex syntax)."
                },
                "path": {
                    "type": "string",
                    "description": "Directory or file to search. Defaults to the working directory."
                },
                "include": {
                    "type": "string",
                    "description": "Glob filter on file names, e.g. `*.rs` or `*.{ts,tsx}`."
                }
            },
            "required": ["pattern"]
        })
    }

    fn parallel_safe(&self) -> bool {
        true
    }

    fn execute(&self, arguments: Value, ctx: ToolContext) -> BoxFuture<'static, Result<ToolOutput, ToolError>> {
        async move {
            let request = GrepRequest {
                pattern: required_str(&arguments, "pattern", "grep")?,
                path: optional_str(&arguments, "path", "grep")?,
                include: optional_str(&arguments, "include", "grep")?,
            };
            let cwd = call_cwd(&ctx);
            let cancel = ctx.cancel.clone();
            let allow = ctx.allow_outside;
            let text = run_blocking("grep", move || grep_files(&cwd, &request, &cancel, allow)).await?;
            Ok(ToolOutput::text(text))
        }
        .boxed()
    }
}

/// The first `MAX_GREP_MATCHES` matching lines (at most `MAX_GREP_BYTES` of them), how many
/// there were in all, and the files that could not be searched to the end.
#[derive(Debug, Default)]
struct Hits {
    lines: Vec<String>,
    bytes: usize,
    /// True when `MAX_GREP_BYTES` stopped the listing.
    capped: bool,
    total: usize,
    /// How many files' searches failed (their matches so far are kept).
    skipped: usize,
    /// `path: why` of the first `MAX_NAMED_SKIPS` of them.
    named_skips: Vec<String>,
}

impl Hits {
    /// Counts a file whose search failed, naming it (`shown: why`) if it is one of the first.
    fn skip(&mut self, shown: &str, why: &str) {
        self.skipped += 1;
        if self.named_skips.len() < MAX_NAMED_SKIPS {
            self.named_skips.push(format!("{shown}: {why}"));
        }
    }

    /// Adds one file's matches (shown as `shown:line: text`) unless the file turned out binary.
    fn add_file(&mut self, shown: &str, found: FileMatches) {
        if found.binary {
            return;
        }
        self.total += found.count;
        for (number, text) in found.lines {
            if self.lines.len() >= MAX_GREP_MATCHES || self.capped {
                break;
            }
            let line = format!("{shown}:{number}: {text}");
            if self.bytes + line.len() > MAX_GREP_BYTES && !self.lines.is_empty() {
                self.capped = true;
                break;
            }
            self.bytes += line.len() + 1;
            self.lines.push(line);
        }
    }
}

/// The matches of one file. A file found to contain a NUL byte is binary: the search of it stops
/// and its matches are dropped.
#[derive(Debug, Default)]
struct FileMatches {
    /// The first `MAX_GREP_MATCHES` matching lines (number, text).
    lines: Vec<(u64, String)>,
    count: usize,
    binary: bool,
}

impl Sink for FileMatches {
    type Error = io::Error;

    fn matched(&mut self, _searcher: &Searcher, mat: &SinkMatch<'_>) -> Result<bool, io::Error> {
        self.count += 1;
        if self.lines.len() < MAX_GREP_MATCHES {
            // Only the start of the line is decoded: a match may be one huge line.
            let raw = mat.bytes();
            let raw = raw.strip_suffix(b"\n").unwrap_or(raw);
            let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
            let text = shown_line(&raw[..raw.len().min(MAX_LINE_BYTES)], raw.len() as u64).text;
            self.lines.push((mat.line_number().unwrap_or(0), text));
        }
        Ok(true)
    }

    fn binary_data(&mut self, _searcher: &Searcher, _offset: u64) -> Result<bool, io::Error> {
        self.binary = true;
        Ok(false)
    }
}

fn grep_files(
    cwd: &Path,
    request: &GrepRequest,
    cancel: &CancellationToken,
    allow_outside: bool,
) -> Result<String, ToolError> {
    let matcher = RegexMatcher::new_line_matcher(&request.pattern).map_err(|e| {
        ToolError::new(
            "INVALID_PATTERN",
            format!(
                "invalid regular expression `{}`: {e}. Patterns use Rust regex syntax; escape \
                 special characters such as `(`, `[` or `.` with a backslash to match them \
                 literally.",
                request.pattern
            ),
        )
    })?;
    let include = request.include.as_deref().map(|glob| NameFilter::new(glob, "include glob")).transpose()?;
    let root = search_root(cwd, request.path.as_deref(), allow_outside)?;
    let base = if root.is_dir() { root.clone() } else { root.parent().map(Path::to_path_buf).unwrap_or_default() };
    let mut searcher = SearcherBuilder::new()
        .binary_detection(BinaryDetection::quit(0))
        .line_number(true)
        .heap_limit(Some(MAX_GREP_LINE_BYTES))
        .build();
    let mut hits = Hits::default();
    for entry in walker(&root) {
        if cancel.is_cancelled() {
            break;
        }
        let entry = match entry {
            Ok(entry) => entry,
            Err(error) => {
                if let Some((shown, why)) = unreadable(&error, &base) {
                    hits.skip(&shown, &format!("a directory that cannot be read ({why})"));
                }
                continue;
            }
        };
        let wanted = include.as_ref().is_none_or(|filter| filter.matches(entry.path(), &root));
        if !is_file(&entry) || !wanted {
            continue;
        }
        let mut found = FileMatches::default();
        let shown = relative_display(entry.path(), &base);
        let searched = searcher.search_path(&matcher, entry.path(), &mut found);
        if let Err(error) = searched {
            tracing::debug!(path = %entry.path().display(), %error, "grep could not search a whole file");
            let why = if error.to_string().contains("allocation limit") {
                format!("a line is longer than {} MiB", MAX_GREP_LINE_BYTES >> 20)
            } else {
                error.to_string()
            };
            hits.skip(&shown, &why);
        }
        if found.binary && root.is_file() {
            // The one file asked about: "no matches" would be wrong.
            return Ok(format!(
                "{} is a binary file (it holds a NUL byte), which grep does not search; read it, or \
                 search it with a command",
                root.display()
            ));
        }
        hits.add_file(&shown, found);
    }
    if cancel.is_cancelled() {
        return Err(aborted());
    }
    Ok(render_grep(&request.pattern, &root, &hits))
}

fn render_grep(pattern: &str, root: &Path, hits: &Hits) -> String {
    let mut text = if hits.lines.is_empty() {
        format!("No matches for `{pattern}` in {}", root.display())
    } else {
        hits.lines.join("\n")
    };
    if hits.total > hits.lines.len() {
        let why = if hits.capped { "Output capped at 50 KB. " } else { "" };
        text.push_str(&format!(
            "\n\n({why}Showing the first {} of {} matches. Use a more specific pattern, path or \
             include to see the rest.)",
            hits.lines.len(),
            hits.total
        ));
    }
    if hits.skipped > 0 {
        let more = hits.skipped - hits.named_skips.len();
        let more = if more > 0 { format!("; and {more} more") } else { String::new() };
        text.push_str(&format!(
            "\n\n({} file(s) could not be searched to the end, so matches in them may be missing: {}{more}. \
             Use bash (e.g. `grep -o` with a bounded pattern) for those.)",
            hits.skipped,
            hits.named_skips.join("; ")
        ));
    }
    text
}

// ---------------------------------------------------------------------------------------------
// shared

/// A glob over file names (pattern without `/`), paths relative to the search root (pattern
/// with `/`), or absolute paths (pattern starting with `/`).
struct NameFilter {
    matcher: GlobMatcher,
    target: MatchTarget,
}

enum MatchTarget {
    FileName,
    RelativePath,
    AbsolutePath,
}

impl NameFilter {
    /// `role` names the argument in the error, e.g. "glob pattern".
    fn new(pattern: &str, role: &str) -> Result<Self, ToolError> {
        let trimmed = pattern.strip_prefix("./").unwrap_or(pattern);
        let target = if trimmed.starts_with('/') {
            MatchTarget::AbsolutePath
        } else if trimmed.contains('/') {
            MatchTarget::RelativePath
        } else {
            MatchTarget::FileName
        };
        let glob = GlobBuilder::new(trimmed)
            .literal_separator(true)
            .build()
            .map_err(|e| ToolError::new("INVALID_PATTERN", format!("invalid {role} `{pattern}`: {e}")))?;
        Ok(NameFilter { matcher: glob.compile_matcher(), target })
    }

    fn matches(&self, path: &Path, root: &Path) -> bool {
        match self.target {
            MatchTarget::FileName => path.file_name().is_some_and(|name| self.matcher.is_match(name)),
            MatchTarget::RelativePath => path.strip_prefix(root).is_ok_and(|relative| self.matcher.is_match(relative)),
            MatchTarget::AbsolutePath => self.matcher.is_match(path),
        }
    }
}

/// The directory or file to search: `path` (or the working directory) resolved, inside the
/// workspace (unless the permission gate allowed this call outside it), and existing.
fn search_root(cwd: &Path, path: Option<&str>, allow_outside: bool) -> Result<PathBuf, ToolError> {
    let root = paths::resolve(cwd, path.unwrap_or("."));
    check_access(cwd, &root, allow_outside)?;
    if !root.exists() {
        return Err(ToolError::new(
            "FILE_NOT_FOUND",
            format!(
                "search path {} does not exist; check the path or omit it to search the \
                 working directory",
                root.display()
            ),
        ));
    }
    Ok(root)
}

/// A gitignore-aware walk of `root` (also outside git repositories) in name order, including
/// hidden files but never descending into `.git`.
fn walker(root: &Path) -> Walk {
    let mut builder = WalkBuilder::new(root);
    builder
        .hidden(false)
        .require_git(false)
        .sort_by_file_name(|a, b| a.cmp(b))
        .filter_entry(|entry| entry.depth() == 0 || entry.file_name() != OsStr::new(".git"));
    builder.build()
}

fn is_file(entry: &DirEntry) -> bool {
    entry.file_type().is_some_and(|kind| kind.is_file())
}

/// `path` relative to `base` for display (the file name when they are the same file).
fn relative_display(path: &Path, base: &Path) -> String {
    match path.strip_prefix(base) {
        Ok(relative) if !relative.as_os_str().is_empty() => relative.display().to_string(),
        _ => path.display().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn ctx(cwd: &Path) -> ToolContext {
        ToolContext::detached(Some(cwd.to_path_buf()), CancellationToken::new())
    }

    fn text(output: ToolOutput) -> String {
        output.content[0]["text"].as_str().unwrap().to_string()
    }

    /// A workspace with sources, a gitignored file and a `.git` directory.
    fn workspace() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("src/nested")).unwrap();
        std::fs::create_dir_all(root.join(".git")).unwrap();
        std::fs::write(root.join(".gitignore"), "ignored.rs\nbuild/\n").unwrap();
        std::fs::write(root.join("src/main.rs"), "fn main() {\n    helper();\n}\n").unwrap();
        std::fs::write(root.join("src/nested/helper.rs"), "pub fn helper() {}\n").unwrap();
        std::fs::write(root.join("src/ignored.rs"), "fn hidden_from_search() {}\n").unwrap();
        std::fs::create_dir_all(root.join("build")).unwrap();
        std::fs::write(root.join("build/out.rs"), "fn built() {}\n").unwrap();
        std::fs::write(root.join(".git/config.rs"), "fn in_git() {}\n").unwrap();
        std::fs::write(root.join("notes.txt"), "fn is mentioned here\n").unwrap();
        dir
    }

    async fn glob(cwd: &Path, args: Value) -> Result<String, ToolError> {
        GlobTool.execute(args, ctx(cwd)).await.map(text)
    }

    async fn grep(cwd: &Path, args: Value) -> Result<String, ToolError> {
        GrepTool.execute(args, ctx(cwd)).await.map(text)
    }

    #[tokio::test]
    async fn glob_matches_names_at_any_depth_and_respects_gitignore() {
        let dir = workspace();
        let out = glob(dir.path(), json!({"pattern": "*.rs"})).await.unwrap();
        let mut lines: Vec<&str> = out.lines().collect();
        lines.sort_unstable();
        assert_eq!(lines, ["src/main.rs", "src/nested/helper.rs"]);
        let out = glob(dir.path(), json!({"pattern": "src/*.rs"})).await.unwrap();
        assert_eq!(out, "src/main.rs");
        let out = glob(dir.path(), json!({"pattern": "**/helper.rs", "path": "src"})).await.unwrap();
        assert_eq!(out, "nested/helper.rs");
        let out = glob(dir.path(), json!({"pattern": "*.zig"})).await.unwrap();
        assert!(out.starts_with("No files found") && !out.contains("give it as `path`"), "{out}");
        for outside in ["../*.txt", "/elsewhere/*.txt"] {
            let out = glob(dir.path(), json!({"pattern": outside})).await.unwrap();
            assert!(
                out.ends_with("to search another directory, give it as `path` and the pattern relative to it)"),
                "{out}"
            );
        }
    }

    #[tokio::test]
    async fn glob_lists_newest_first_and_caps_at_100() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..105 {
            std::fs::write(dir.path().join(format!("f{i:03}.txt")), "x").unwrap();
        }
        let file = std::fs::File::options().write(true).open(dir.path().join("f000.txt")).unwrap();
        file.set_modified(SystemTime::now() + Duration::from_secs(60)).unwrap();
        let out = glob(dir.path(), json!({"pattern": "*.txt"})).await.unwrap();
        assert!(out.starts_with("f000.txt\n"), "{out}");
        assert_eq!(out.lines().filter(|l| l.ends_with(".txt")).count(), 100);
        assert!(out.contains("5 more files omitted"), "{out}");
    }

    /// A directory the walk cannot read is named with why (this machine's tests run as root,
    /// whom permissions do not stop, so the walk's error is built here); other walk errors, such
    /// as a symlink loop, are not.
    #[test]
    fn an_unreadable_directory_is_named_not_skipped_silently() {
        let base = Path::new("/ws");
        let denied = || io::Error::from(io::ErrorKind::PermissionDenied);
        let error = ignore::Error::WithDepth {
            depth: 1,
            err: Box::new(ignore::Error::WithPath {
                path: base.join("locked"),
                err: Box::new(ignore::Error::Io(denied())),
            }),
        };
        assert_eq!(unreadable(&error, base), Some(("locked".to_string(), "permission denied")));
        assert_eq!(unreadable(&ignore::Error::Io(denied()), base).unwrap().0, "/ws", "the root itself");
        let looped = ignore::Error::Loop { ancestor: base.into(), child: base.join("a/loop") };
        assert_eq!(unreadable(&looped, base), None);
        let many: Vec<String> = (0..12).map(|i| format!("d{i}")).collect();
        assert!(named_briefly(&many).ends_with("d9; and 2 more"), "{}", named_briefly(&many));
    }

    #[test]
    fn glob_keeps_only_the_newest_while_walking() {
        let at = |secs: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(secs);
        let mut offered: Vec<(PathBuf, SystemTime)> =
            (0..1000u64).map(|i| (PathBuf::from(format!("f{:04}", (i * 7919) % 1000)), at(i % 37))).collect();
        let mut newest = Newest::new(MAX_GLOB_RESULTS);
        for (path, modified) in offered.clone() {
            newest.offer(path, modified);
            assert!(newest.heap.len() <= MAX_GLOB_RESULTS);
        }
        assert_eq!(newest.total, 1000);
        offered.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let expected: Vec<PathBuf> = offered.into_iter().take(MAX_GLOB_RESULTS).map(|(path, _)| path).collect();
        assert_eq!(newest.into_sorted(), expected, "newest first, then by path");
        let dir = Path::new("/w");
        let mut few = Newest::new(MAX_GLOB_RESULTS);
        few.offer(dir.join("old.rs"), at(1));
        few.offer(dir.join("new.rs"), at(2));
        assert_eq!(render_glob(dir, "*.rs", few), "new.rs\nold.rs");
    }

    #[test]
    fn grep_counts_failed_files_and_names_only_the_first() {
        let mut hits = Hits::default();
        for i in 0..10_000 {
            hits.skip(&format!("f{i}"), "unreadable");
        }
        assert_eq!((hits.skipped, hits.named_skips.len()), (10_000, MAX_NAMED_SKIPS));
        let out = render_grep("x", Path::new("/w"), &hits);
        assert!(
            out.contains("(10000 file(s) could not be searched to the end")
                && out.contains("f4: unreadable; and 9995 more."),
            "{out}"
        );
        assert!(!out.contains("f5:"), "{out}");
    }

    #[tokio::test]
    async fn glob_rejects_bad_patterns_and_outside_paths() {
        let dir = workspace();
        let err = glob(dir.path(), json!({"pattern": "src/[a"})).await.unwrap_err();
        assert_eq!(err.code, "INVALID_PATTERN");
        assert!(err.message.contains("src/[a"), "{}", err.message);
        let err = glob(dir.path(), json!({"pattern": "*", "path": ".."})).await.unwrap_err();
        assert_eq!(err.code, "OUTSIDE_WORKSPACE");
    }

    #[tokio::test]
    async fn grep_reports_path_line_and_text() {
        let dir = workspace();
        let out = grep(dir.path(), json!({"pattern": "helper\\(", "include": "*.rs"})).await.unwrap();
        assert_eq!(out, "src/main.rs:2:     helper();\nsrc/nested/helper.rs:1: pub fn helper() {}");
        let out = grep(dir.path(), json!({"pattern": "fn \\w+\\(", "path": "src/main.rs"})).await.unwrap();
        assert_eq!(out, "main.rs:1: fn main() {");
    }

    #[tokio::test]
    async fn grep_skips_gitignored_git_and_binary_files() {
        let dir = workspace();
        std::fs::write(dir.path().join("blob.bin"), b"fn in_binary\0\x01\x02").unwrap();
        let out = grep(dir.path(), json!({"pattern": "fn"})).await.unwrap();
        assert!(out.contains("src/main.rs:1:"), "{out}");
        assert!(out.contains("notes.txt:1:"), "{out}");
        assert!(!out.contains("hidden_from_search"), "{out}");
        assert!(!out.contains("built"), "{out}");
        assert!(!out.contains("in_git"), "{out}");
        assert!(!out.contains("in_binary"), "{out}");
        // Asked about that one file, grep says it is binary instead of "no matches".
        let out = grep(dir.path(), json!({"pattern": "in_binary", "path": "blob.bin"})).await.unwrap();
        assert!(out.ends_with("blob.bin is a binary file (it holds a NUL byte), which grep does not search; read it, or search it with a command"), "{out}");
    }

    #[tokio::test]
    async fn grep_caps_matches_and_counts_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let body: String = (0..300).map(|i| format!("match {i}\n")).collect();
        std::fs::write(dir.path().join("many.txt"), body).unwrap();
        let out = grep(dir.path(), json!({"pattern": "^match"})).await.unwrap();
        assert_eq!(out.lines().filter(|l| l.starts_with("many.txt:")).count(), 250);
        assert!(out.contains("Showing the first 250 of 300 matches"), "{out}");
    }

    #[tokio::test]
    async fn grep_caps_a_line_a_match_and_the_result() {
        let dir = tempfile::tempdir().unwrap();
        // One match on a 3 MB line: the shown line is cut and says how long it is.
        std::fs::write(dir.path().join("long.txt"), format!("needle{}\n", "x".repeat(3_000_000))).unwrap();
        let out = grep(dir.path(), json!({"pattern": "needle"})).await.unwrap();
        let expected = format!(
            "long.txt:1: needle{}... (line truncated to 2000 chars; it is 3000006 bytes long)",
            "x".repeat(1994)
        );
        assert_eq!(out, expected);
        // A line longer than the searcher's limit: the file is named as not searched to the end.
        std::fs::write(dir.path().join("huge.txt"), "y".repeat(MAX_GREP_LINE_BYTES + 10)).unwrap();
        let out = grep(dir.path(), json!({"pattern": "needle|y{3}"})).await.unwrap();
        assert!(out.starts_with("long.txt:1: needle"), "{}", &out[..200]);
        assert!(out.contains("(1 file(s) could not be searched to the end"), "{out:.3000}");
        assert!(out.contains("huge.txt: a line is longer than 8 MiB"), "{out:.3000}");
        // 250 lines of 1000 characters exceed 50 KB: the listing stops at the byte cap and says so.
        let body: String = (0..250).map(|i| format!("hit {i} {}\n", "z".repeat(1000))).collect();
        let many = tempfile::tempdir().unwrap();
        std::fs::write(many.path().join("many.txt"), body).unwrap();
        let out = grep(many.path(), json!({"pattern": "^hit"})).await.unwrap();
        assert!(out.len() < 52 * 1024, "{}", out.len());
        let shown = out.lines().filter(|l| l.starts_with("many.txt:")).count();
        assert!(shown < 60, "{shown}");
        assert!(
            out.contains(&format!("(Output capped at 50 KB. Showing the first {shown} of 250 matches.")),
            "{out:.200}"
        );
    }

    #[tokio::test]
    async fn grep_rejects_invalid_regex_naming_it() {
        let dir = workspace();
        let err = grep(dir.path(), json!({"pattern": "fn ("})).await.unwrap_err();
        assert_eq!(err.code, "INVALID_PATTERN");
        assert!(err.message.contains("`fn (`"), "{}", err.message);
        let out = grep(dir.path(), json!({"pattern": "zzz_nothing"})).await.unwrap();
        assert!(out.starts_with("No matches"), "{out}");
    }
}
