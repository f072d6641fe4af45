//! The file tools `read`, `write` and `edit`. Paths resolve against the session directory and must
//! stay inside the workspace (`check_workspace`) unless the permission gate let the call go
//! outside (`ToolContext::allow_outside`). `read` returns numbered lines in dsh's format
//! (`<path>…</path>`, `<type>file</type>`, `<content>` with `N: text` lines and a footer);
//! `edit` and overwriting `write`s require the file to have been read first in the session
//! (`FileState`). Text goes through the editor when the call has a `FileAccess` (ACP `fs/*`),
//! else to the disk, where all IO runs on the blocking pool. Only regular files are opened
//! (`regular`: a FIFO or device is refused, never blocked on). Memory is bounded for any file:
//! `read` keeps at most `MAX_LINE_BYTES` of a line and 50 KB of a page, `edit` holds at most
//! 64 MiB, read or edited (an edit whose result would be larger is refused before it is built).
//! `read` shows a PNG, JPEG, GIF or WebP file as an image (up to 3.75 MiB, from the disk).
//! Successful writes and edits carry a diff for the editor in the result's meta
//! (`{"diff": {path, oldText, newText}}`), and an edit the place it changed
//! (`{"location": {path, line}}`, the path absolute, the line where the first replacement starts).

use std::collections::HashSet;
use std::fmt::Write as _;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Cursor, Read};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::{Value, json};

use super::access::named_path;
use super::args::{call_cwd, invalid_args, optional_bool, optional_u64, required_str, run_blocking};
use super::files::FileAccess;
use super::{Access, Tool, ToolContext, ToolError, ToolOutput};
use super::{image, paths, regular};

/// Lines `read` returns when no `limit` is given.
const DEFAULT_READ_LIMIT: u64 = 2000;
/// Characters kept of one line in `read` (and `grep`) output.
pub(crate) const MAX_LINE_CHARS: usize = 2000;
/// Bytes kept of one line while reading it: enough for `MAX_LINE_CHARS` characters of any UTF-8
/// text (a character is at most 4 bytes, an invalid byte becomes one character), so the cut by
/// characters always falls inside what was kept, however long the line is.
pub(crate) const MAX_LINE_BYTES: usize = MAX_LINE_CHARS * 4 + 4;
/// Bytes `edit` (and a disk read of a whole text file) holds at most.
pub(crate) const MAX_WHOLE_FILE_BYTES: u64 = 64 * 1024 * 1024;
/// Bytes of numbered lines one `read` returns at most; the footer tells where to continue.
const MAX_READ_BYTES: usize = 50 * 1024;
/// Bytes inspected for a NUL to tell binary files from text.
const BINARY_SNIFF_BYTES: u64 = 8 * 1024;
/// Old plus new text a diff carries at most; a larger `edit` shows only the replaced text, a
/// larger `write` no diff.
const MAX_DIFF_BYTES: usize = 256 * 1024;
/// Follows the not-found message of `read`.
const READ_HINT: &str = "Check the path, or use glob to find the file.";
/// Follows the not-found message of `edit`.
const EDIT_HINT: &str = "Use write to create a new file.";

/// The files each session has read (or written), shared by the file tools: `edit` and
/// overwriting `write`s are refused for files the calling session has not read.
#[derive(Debug, Clone, Default)]
pub struct FileState {
    read: Arc<Mutex<HashSet<(String, PathBuf)>>>,
    /// The session this view records for (see `scoped`).
    session: String,
}

impl FileState {
    pub fn new() -> Self {
        Self::default()
    }

    /// The same record, viewed as `session`'s.
    pub fn scoped(&self, session: &str) -> FileState {
        FileState { read: self.read.clone(), session: session.to_string() }
    }

    /// Records that the session has seen the current content of `path`.
    pub fn mark_read(&self, path: &Path) {
        self.lock().insert((self.session.clone(), path.to_path_buf()));
    }

    /// Marks read, for `session`, the file a successful `read`, `write` or `edit` call with
    /// `arguments` touched (its `file_path` resolved against the session's `cwd`), as the call
    /// did: a session loaded from its log has seen what its calls read and wrote.
    fn restore(&self, session: &str, cwd: &Path, arguments: &Value) {
        if let Some(path) = arguments["file_path"].as_str() {
            self.scoped(session).mark_read(&paths::resolve(cwd, path));
        }
    }

    pub fn was_read(&self, path: &Path) -> bool {
        self.lock().contains(&(self.session.clone(), path.to_path_buf()))
    }

    fn lock(&self) -> MutexGuard<'_, HashSet<(String, PathBuf)>> {
        self.read.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The workspace rule of the file tools: `path` must lie inside the session directory `cwd`
/// (symlinks followed). The permission gate decides outside access; see `check_access`.
pub(crate) fn check_workspace(cwd: &Path, path: &Path) -> Result<(), ToolError> {
    if paths::inside_workspace(&[cwd.to_path_buf()], path) {
        return Ok(());
    }
    let root = if cwd.as_os_str().is_empty() { Path::new(".") } else { cwd };
    Err(ToolError::new(
        "OUTSIDE_WORKSPACE",
        format!(
            "{} is outside the workspace {}; only paths inside the workspace can be used",
            path.display(),
            root.display()
        ),
    ))
}

/// `check_workspace`, skipped when the permission gate allowed this call outside the workspace.
pub(crate) fn check_access(cwd: &Path, path: &Path, allow_outside: bool) -> Result<(), ToolError> {
    if allow_outside {
        return Ok(());
    }
    check_workspace(cwd, path)
}

/// One line as shown: the first `MAX_LINE_CHARS` characters of `kept` (the line's first bytes,
/// without its line ending), with a note when it was longer; `full_bytes` is the whole line's
/// length without the line ending.
pub(crate) fn shown_line(kept: &[u8], full_bytes: u64) -> Shown {
    let line = String::from_utf8_lossy(kept);
    match line.char_indices().nth(MAX_LINE_CHARS) {
        Some((cut, _)) => Shown {
            text: format!(
                "{}... (line truncated to {MAX_LINE_CHARS} chars; it is {full_bytes} bytes long)",
                &line[..cut]
            ),
            cut: true,
        },
        None => Shown { text: line.into_owned(), cut: false },
    }
}

/// A line ready for output, and whether it was cut.
pub(crate) struct Shown {
    pub text: String,
    pub cut: bool,
}

/// The length of one line read by [`read_line_capped`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LineLength {
    /// Bytes read, the line ending included (0 at the end of the input).
    pub read: u64,
    /// Bytes of the line without its `\n` or `\r\n`.
    pub text: u64,
}

/// Reads one line (through its `\n`), keeping at most `keep` of its bytes in `buf`. Memory stays
/// bounded however long the line is: the rest of it is read and dropped.
pub(crate) fn read_line_capped(reader: &mut impl BufRead, keep: usize, buf: &mut Vec<u8>) -> io::Result<LineLength> {
    buf.clear();
    let mut read = 0u64;
    let mut last = None;
    loop {
        let available = match reader.fill_buf() {
            Ok(available) => available,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if available.is_empty() {
            return Ok(LineLength { read, text: read });
        }
        let newline = available.iter().position(|&b| b == b'\n');
        let used = newline.map_or(available.len(), |end| end + 1);
        let before_newline = match newline {
            Some(0) => last,
            Some(end) => Some(available[end - 1]),
            None => None,
        };
        last = available[..used].last().copied();
        let room = keep.saturating_sub(buf.len()).min(used);
        buf.extend_from_slice(&available[..room]);
        reader.consume(used);
        read += used as u64;
        if newline.is_some() {
            let ending = if before_newline == Some(b'\r') { 2 } else { 1 };
            return Ok(LineLength { read, text: read - ending });
        }
    }
}

// ---------------------------------------------------------------------------------------------
// read

/// `read`: numbered lines of a text file.
#[derive(Debug, Clone)]
pub(crate) struct ReadTool {
    files: FileState,
}

impl ReadTool {
    pub(crate) fn new(files: FileState) -> Self {
        ReadTool { files }
    }
}

struct ReadRequest {
    file_path: String,
    /// 1-based first line.
    offset: u64,
    limit: u64,
}

impl ReadRequest {
    fn parse(args: &Value) -> Result<Self, ToolError> {
        let file_path = required_str(args, "file_path", "read")?;
        let offset = optional_u64(args, "offset", "read")?.unwrap_or(1).max(1);
        let limit = optional_u64(args, "limit", "read")?.unwrap_or(DEFAULT_READ_LIMIT);
        if limit == 0 {
            return Err(invalid_args("read", "`limit` must be at least 1 (omit it to read up to 2000 lines)"));
        }
        Ok(ReadRequest { file_path, offset, limit })
    }
}

impl Tool for ReadTool {
    fn name(&self) -> &str {
        "read"
    }

    /// The line is the one the read starts at: `offset`, which counts from 1 (0 reads from 1).
    fn access(&self, arguments: &Value) -> Access {
        Access::Read { paths: named_path(arguments, "file_path"), line: arguments["offset"].as_u64().map(|o| o.max(1)) }
    }

    fn title(&self, arguments: &Value) -> String {
        format!("Read {}", arguments["file_path"].as_str().unwrap_or_default())
    }

    fn guidance(&self) -> Option<&'static str> {
        Some(
            "read a file before you edit it; use `offset`/`limit` for long files, and read several \
             files in one step when you need them.",
        )
    }

    fn check(&self, arguments: &Value) -> Result<(), ToolError> {
        ReadRequest::parse(arguments).map(drop)
    }

    fn description(&self) -> String {
        "Read a UTF-8 text file and return line-numbered content (`N: text`). Use this instead \
         of cat, head or tail. The path may be absolute or relative to the working directory. \
         Returns up to `limit` lines (default 2000) starting at line `offset` (1-based, default \
         1); when the file has more, the result ends with the offset to continue from. Lines \
         longer than 2000 characters are cut. A PNG, JPEG, GIF or WebP image (up to 3.75 MiB) is \
         returned as the image itself; other binary files are refused. A file must be read \
         before it is edited or overwritten. Read several files in parallel when you need them."
            .to_string()
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "file_path": {
                    "type": "string",
                    "description": "Path of the file to read, absolute or relative to the working directory."
                },
                "offset": {
                    "type": "number",
                    "description": "1-based first line to return. Defaults to 1."
                },
                "limit": {
                    "type": "number",
                    "description": "Maximum number of lines to return. Defaults to 2000."
                }
            },
            "required": ["file_path"]
        })
    }

    fn parallel_safe(&self) -> bool {
        true
    }

    fn restore(&self, session: &str, cwd: &Path, arguments: &Value) {
        self.files.restore(session, cwd, arguments);
    }

    fn execute(&self, arguments: Value, ctx: ToolContext) -> BoxFuture<'static, Result<ToolOutput, ToolError>> {
        let files = self.files.scoped(&ctx.session_id);
        async move {
            let request = ReadRequest::parse(&arguments)?;
            let cwd = call_cwd(&ctx);
            let allow = ctx.allow_outside;
            // An image is shown as one, from the disk (an editor serves only text).
            let (image_cwd, image_path) = (cwd.clone(), request.file_path.clone());
            if let Some(shown) = run_blocking("read", move || read_image(&image_cwd, &image_path, allow)).await? {
                return Ok(shown);
            }
            let text = match ctx.file_access.clone() {
                None => run_blocking("read", move || read_file(&cwd, &request, &files, allow)).await?,
                Some(access) => read_via(&*access, &ctx.session_id, &cwd, &request, &files, allow).await?,
            };
            Ok(ToolOutput::text(text))
        }
        .boxed()
    }
}

/// A PNG, JPEG, GIF or WebP file as an image for the model (up to `image::MAX_IMAGE_BYTES`), with
/// a line that says what it is; `None` for any other file (or one that cannot be opened: the text
/// read reports why).
fn read_image(cwd: &Path, file_path: &str, allow_outside: bool) -> Result<Option<ToolOutput>, ToolError> {
    let path = paths::resolve(cwd, file_path);
    check_access(cwd, &path, allow_outside)?;
    let Ok(file) = regular::open_regular(&path) else {
        return Ok(None);
    };
    let mut bytes = Vec::new();
    let read = |bytes: &mut Vec<u8>, limit: u64, file: &File| {
        let reader = file;
        reader.take(limit).read_to_end(bytes).map_err(|e| io_error("read", &path, &e))
    };
    read(&mut bytes, 12, &file)?;
    let Some(format) = image::Format::sniff(&bytes) else {
        return Ok(None);
    };
    let limit = image::MAX_IMAGE_BYTES as u64;
    let rest = limit + 1 - bytes.len() as u64;
    read(&mut bytes, rest, &file)?;
    if bytes.len() as u64 > limit {
        return Err(ToolError::new(
            "IMAGE_TOO_LARGE",
            format!(
                "{} is an image larger than the {} kin shows a model; make a smaller copy (e.g. with \
                 `convert`) and read that",
                path.display(),
                image::MAX_IMAGE_SHOWN
            ),
        ));
    }
    let text = format!("Image {} ({}, {} bytes)", path.display(), format.media_type(), bytes.len());
    let content = vec![json!({"type": "text", "text": text}), image::block(format, &bytes)];
    Ok(Some(ToolOutput { content, events: Vec::new(), meta: None }))
}

/// The lines one `read` returns, and what it saw of the rest of the file.
#[derive(Debug, Default)]
struct Page {
    lines: Vec<(u64, String)>,
    total_lines: u64,
    /// True when the byte cap stopped the page before `limit` lines.
    capped: bool,
    /// The first shown line that was cut at `MAX_LINE_CHARS`.
    first_cut: Option<u64>,
}

fn read_file(cwd: &Path, request: &ReadRequest, files: &FileState, allow_outside: bool) -> Result<String, ToolError> {
    let path = paths::resolve(cwd, &request.file_path);
    check_access(cwd, &path, allow_outside)?;
    let mut file = open_existing(&path, READ_HINT)?;
    let head = sniff_text(&mut file, &path)?;
    let reader = BufReader::new(Cursor::new(head).chain(file));
    finish_read(&path, reader, request, files)
}

/// `read` through the editor: the whole text, then the same page as from the disk.
async fn read_via(
    access: &dyn FileAccess,
    session_id: &str,
    cwd: &Path,
    request: &ReadRequest,
    files: &FileState,
    allow_outside: bool,
) -> Result<String, ToolError> {
    let path = paths::resolve(cwd, &request.file_path);
    check_access(cwd, &path, allow_outside)?;
    // The editor may hold an unsaved buffer of a file not on disk yet; what is on disk must be a
    // regular file.
    existing_regular(&path)?;
    let text = editor_read(access, session_id, &path, READ_HINT).await?;
    finish_read(&path, Cursor::new(text.as_bytes()), request, files)
}

/// Numbers the requested lines of `reader` and marks the file read.
fn finish_read(
    path: &Path,
    reader: impl BufRead,
    request: &ReadRequest,
    files: &FileState,
) -> Result<String, ToolError> {
    let page = read_page(reader, request.offset, request.limit).map_err(|e| io_error("read", path, &e))?;
    if request.offset > page.total_lines.max(1) {
        return Err(invalid_args(
            "read",
            format!(
                "offset {} is past the end of {}, which has {} lines",
                request.offset,
                path.display(),
                page.total_lines
            ),
        ));
    }
    files.mark_read(path);
    Ok(render_page(path, &page, request.offset))
}

/// Reads the numbered lines `offset..offset+limit` (capped at `MAX_READ_BYTES` of output) and
/// counts all lines of the file.
/// Lines longer than `MAX_LINE_BYTES` are kept only that far (the rest is read and dropped), so
/// memory stays bounded for any file, a single huge line included.
fn read_page(mut reader: impl BufRead, offset: u64, limit: u64) -> io::Result<Page> {
    let mut page = Page::default();
    let mut bytes = 0usize;
    let mut buf = Vec::new();
    let mut number = 0u64;
    loop {
        let wanted = number + 1 >= offset && (page.lines.len() as u64) < limit && !page.capped;
        let length = read_line_capped(&mut reader, if wanted { MAX_LINE_BYTES } else { 0 }, &mut buf)?;
        if length.read == 0 {
            break;
        }
        number += 1;
        if !wanted {
            continue;
        }
        let line = display_line(&buf, length);
        bytes += line.text.len() + number.to_string().len() + 3;
        if bytes > MAX_READ_BYTES && !page.lines.is_empty() {
            page.capped = true;
            continue;
        }
        if line.cut && page.first_cut.is_none() {
            page.first_cut = Some(number);
        }
        page.lines.push((number, line.text));
    }
    page.total_lines = number;
    Ok(page)
}

/// One raw line as shown: without its line ending, lossily decoded, truncated. `kept` is the
/// start of the line.
fn display_line(kept: &[u8], length: LineLength) -> Shown {
    let text = &kept[..kept.len().min(length.text as usize)];
    shown_line(text, length.text)
}

/// dsh's read format: header, `N: text` lines, a blank line, then the footer.
fn render_page(path: &Path, page: &Page, offset: u64) -> String {
    let mut out = format!("<path>{}</path>\n<type>file</type>\n<content>\n", path.display());
    for (number, text) in &page.lines {
        let _ = writeln!(out, "{number}: {text}");
    }
    let last = page.lines.last().map_or(offset.saturating_sub(1), |(n, _)| *n);
    let total = page.total_lines;
    let footer = if last < total {
        let why = if page.capped { "Output capped at 50 KB" } else { "File has more lines" };
        format!("({why}. Showing lines {offset}-{last} of {total}; use offset={} to continue.)", last + 1)
    } else {
        format!("(End of file - total {total} lines)")
    };
    let _ = write!(out, "\n{footer}");
    if let Some(line) = page.first_cut {
        let _ = write!(
            out,
            // In characters, as the cut was made (`cut -c` counts bytes: wrong past ASCII).
            "\n(Lines longer than {MAX_LINE_CHARS} characters were cut. To see more of one, use bash, \
             e.g. `sed -n '{line}p' {} | perl -CSD -ne 'print substr($_, {MAX_LINE_CHARS}, {})'`.)",
            path.display(),
            MAX_LINE_CHARS * 2
        );
    }
    out.push_str("\n</content>");
    out
}

// ---------------------------------------------------------------------------------------------
// write

/// `write`: creates or replaces a whole file.
#[derive(Debug, Clone)]
pub(crate) struct WriteTool {
    files: FileState,
}

impl WriteTool {
    pub(crate) fn new(files: FileState) -> Self {
        WriteTool { files }
    }
}

/// `write`'s `file_path`: a string that names a file (a trailing slash names a directory, and
/// writing there made a file of that name instead).
fn write_path(arguments: &Value) -> Result<String, ToolError> {
    let path = required_str(arguments, "file_path", "write")?;
    if path.ends_with('/') {
        return Err(ToolError::new(
            "INVALID_ARGUMENTS",
            format!("file_path {path:?} ends with '/', which names a directory; give the path of the file to write"),
        ));
    }
    Ok(path)
}

impl Tool for WriteTool {
    fn name(&self) -> &str {
        "write"
    }

    fn access(&self, arguments: &Value) -> Access {
        Access::Edit { paths: named_path(arguments, "file_path") }
    }

    fn title(&self, arguments: &Value) -> String {
        format!("Write {}", arguments["file_path"].as_str().unwrap_or_default())
    }

    fn guidance(&self) -> Option<&'static str> {
        Some("create a new file or replace one completely; prefer edit for changes to existing files.")
    }

    fn check(&self, arguments: &Value) -> Result<(), ToolError> {
        write_path(arguments)?;
        required_str(arguments, "content", "write").map(drop)
    }

    fn description(&self) -> String {
        "Create a UTF-8 text file, or completely replace an existing file's content with \
         `content`. Parent directories are created as needed. Overwriting an existing file \
         requires having read it in this session first; for targeted changes to an existing \
         file prefer `edit`, which does not resend the whole file."
            .to_string()
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "file_path": {
                    "type": "string",
                    "description": "Path of the file to write, absolute or relative to the working directory."
                },
                "content": {
                    "type": "string",
                    "description": "Full UTF-8 text content to write."
                }
            },
            "required": ["file_path", "content"]
        })
    }

    fn parallel_safe(&self) -> bool {
        false
    }

    fn restore(&self, session: &str, cwd: &Path, arguments: &Value) {
        self.files.restore(session, cwd, arguments);
    }

    fn execute(&self, arguments: Value, ctx: ToolContext) -> BoxFuture<'static, Result<ToolOutput, ToolError>> {
        let files = self.files.scoped(&ctx.session_id);
        async move {
            let file_path = write_path(&arguments)?;
            let content = required_str(&arguments, "content", "write")?;
            let cwd = call_cwd(&ctx);
            let allow = ctx.allow_outside;
            let written = match ctx.file_access.clone() {
                None => run_blocking("write", move || write_file(&cwd, &file_path, &content, &files, allow)).await?,
                Some(access) => {
                    let target = (cwd.as_path(), file_path.as_str());
                    write_via(&*access, &ctx.session_id, target, content, &files, allow).await?
                }
            };
            Ok(written.into_output())
        }
        .boxed()
    }
}

fn write_file(
    cwd: &Path,
    file_path: &str,
    content: &str,
    files: &FileState,
    allow_outside: bool,
) -> Result<Written, ToolError> {
    let path = paths::resolve(cwd, file_path);
    check_access(cwd, &path, allow_outside)?;
    let before = match existing_regular(&path)? {
        Some(_) => {
            require_read(files, &path)?;
            // Read under the cap whatever the file became since it was checked.
            regular::read_text(&path, MAX_DIFF_BYTES as u64).map_or(Before::Unknown, Before::Text)
        }
        None => Before::Missing,
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| io_error("create directory", parent, &e))?;
    }
    regular::write_regular(&path, content.as_bytes()).map_err(|e| match e.kind() {
        io::ErrorKind::InvalidInput | io::ErrorKind::IsADirectory => open_error(&path, &e, ""),
        _ => io_error("write", &path, &e),
    })?;
    files.mark_read(&path);
    Ok(wrote(&path, content, before))
}

/// `write` through the editor. `target` is the session directory and the raw `file_path`.
async fn write_via(
    access: &dyn FileAccess,
    session_id: &str,
    target: (&Path, &str),
    content: String,
    files: &FileState,
    allow_outside: bool,
) -> Result<Written, ToolError> {
    let (cwd, file_path) = target;
    let path = paths::resolve(cwd, file_path);
    check_access(cwd, &path, allow_outside)?;
    let before = match existing_regular(&path)? {
        Some(meta) => {
            require_read(files, &path)?;
            if meta.len() as usize > MAX_DIFF_BYTES {
                Before::Unknown
            } else {
                access.read_text(session_id, &path).await.map_or(Before::Unknown, Before::Text)
            }
        }
        None => Before::Missing,
    };
    if let Some(parent) = path.parent() {
        tokio::fs::create_dir_all(parent).await.map_err(|e| io_error("create directory", parent, &e))?;
    }
    access.write_text(session_id, &path, content.clone()).await.map_err(|e| io_error("write", &path, &e))?;
    files.mark_read(&path);
    Ok(wrote(&path, &content, before))
}

/// What a file held before `write` replaced it.
enum Before {
    /// There was no file.
    Missing,
    Text(String),
    /// Too large, unreadable or not UTF-8: no diff.
    Unknown,
}

fn wrote(path: &Path, content: &str, before: Before) -> Written {
    let (diff, what) = match before {
        Before::Missing => (diff_meta(path, None, content), "Created file"),
        Before::Text(old) => (diff_meta(path, Some(old.as_str()), content), "Updated file"),
        Before::Unknown => (None, "Updated file"),
    };
    Written { text: written_text(path, what), diff, location: None }
}

/// dsh's text for a `write` (dsh-design.md §4.1): the path, the type and what happened, as
/// `read` frames a file. dsh records `Created file`; `Updated file` (over an existing file) is
/// kin's own.
fn written_text(path: &Path, what: &str) -> String {
    format!("<path>{}</path>\n<type>file</type>\n<content>\n{what}\n</content>", path.display())
}

// ---------------------------------------------------------------------------------------------
// edit

/// `edit`: replaces literal text in an existing file.
#[derive(Debug, Clone)]
pub(crate) struct EditTool {
    files: FileState,
}

impl EditTool {
    pub(crate) fn new(files: FileState) -> Self {
        EditTool { files }
    }
}

struct EditRequest {
    file_path: String,
    old_string: String,
    new_string: String,
    replace_all: bool,
}

impl EditRequest {
    fn parse(args: &Value) -> Result<Self, ToolError> {
        let request = EditRequest {
            file_path: required_str(args, "file_path", "edit")?,
            old_string: required_str(args, "old_string", "edit")?,
            new_string: required_str(args, "new_string", "edit")?,
            replace_all: optional_bool(args, "replace_all", "edit")?.unwrap_or(false),
        };
        if request.old_string.is_empty() {
            return Err(invalid_args(
                "edit",
                "`old_string` is empty; pass the exact text to replace (use write to create or \
                 replace a whole file)",
            ));
        }
        if request.old_string == request.new_string {
            return Err(ToolError::new(
                "EDIT_NO_CHANGE",
                "edit: `old_string` and `new_string` are identical, so the edit would change \
                 nothing; put the replacement text in `new_string`",
            ));
        }
        Ok(request)
    }
}

impl Tool for EditTool {
    fn name(&self) -> &str {
        "edit"
    }

    fn access(&self, arguments: &Value) -> Access {
        Access::Edit { paths: named_path(arguments, "file_path") }
    }

    fn title(&self, arguments: &Value) -> String {
        format!("Edit {}", arguments["file_path"].as_str().unwrap_or_default())
    }

    fn guidance(&self) -> Option<&'static str> {
        Some(
            "replace an exact, unique piece of text; copy `old_string` from a read result without \
             the line-number prefix, and include enough context to make it unique.",
        )
    }

    fn check(&self, arguments: &Value) -> Result<(), ToolError> {
        EditRequest::parse(arguments).map(drop)
    }

    fn description(&self) -> String {
        "Edit an existing UTF-8 text file by replacing literal text. `old_string` must match the \
         file exactly, including whitespace and indentation: copy it from a `read` result \
         without the `N: ` line-number prefix. By default `old_string` must occur exactly once; \
         if it occurs several times, include more surrounding lines to make it unique, or set \
         `replace_all` to true to replace every occurrence. An empty `new_string` deletes the \
         text. The file must have been read in this session first (files you created or edited \
         count). Use `write` to create new files."
            .to_string()
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "file_path": {
                    "type": "string",
                    "description": "Path of the file to edit, absolute or relative to the working directory."
                },
                "old_string": {
                    "type": "string",
                    "description": "Literal text to replace. Must match exactly."
                },
                "new_string": {
                    "type": "string",
                    "description": "Literal replacement text. Use an empty string to delete the match."
                },
                "replace_all": {
                    "type": "boolean",
                    "description": "Replace all matches. Defaults to false; when false, old_string must appear exactly once."
                }
            },
            "required": ["file_path", "old_string", "new_string"]
        })
    }

    fn parallel_safe(&self) -> bool {
        false
    }

    fn restore(&self, session: &str, cwd: &Path, arguments: &Value) {
        self.files.restore(session, cwd, arguments);
    }

    fn execute(&self, arguments: Value, ctx: ToolContext) -> BoxFuture<'static, Result<ToolOutput, ToolError>> {
        let files = self.files.scoped(&ctx.session_id);
        async move {
            let request = EditRequest::parse(&arguments)?;
            let cwd = call_cwd(&ctx);
            let allow = ctx.allow_outside;
            let edited = match ctx.file_access.clone() {
                None => run_blocking("edit", move || edit_file(&cwd, &request, &files, allow)).await?,
                Some(access) => edit_via(&*access, &ctx.session_id, &cwd, &request, &files, allow).await?,
            };
            Ok(edited.into_output())
        }
        .boxed()
    }
}

fn edit_file(cwd: &Path, request: &EditRequest, files: &FileState, allow_outside: bool) -> Result<Written, ToolError> {
    let path = paths::resolve(cwd, &request.file_path);
    check_access(cwd, &path, allow_outside)?;
    let file = open_existing(&path, EDIT_HINT)?;
    require_read(files, &path)?;
    let content = read_text(file, &path)?;
    let (updated, count) = apply_edit(&path, &content, request)?;
    regular::write_regular(&path, updated.as_bytes()).map_err(|e| io_error("write", &path, &e))?;
    files.mark_read(&path);
    Ok(edited(&path, count, &content, &updated, request))
}

/// `edit` through the editor (the buffer's text is what gets edited).
async fn edit_via(
    access: &dyn FileAccess,
    session_id: &str,
    cwd: &Path,
    request: &EditRequest,
    files: &FileState,
    allow_outside: bool,
) -> Result<Written, ToolError> {
    let path = paths::resolve(cwd, &request.file_path);
    check_access(cwd, &path, allow_outside)?;
    regular::regular(&path).map_err(|e| open_error(&path, &e, EDIT_HINT))?;
    require_read(files, &path)?;
    let content = editor_read(access, session_id, &path, EDIT_HINT).await?;
    let (updated, count) = apply_edit(&path, &content, request)?;
    access.write_text(session_id, &path, updated.clone()).await.map_err(|e| io_error("write", &path, &e))?;
    files.mark_read(&path);
    Ok(edited(&path, count, &content, &updated, request))
}

/// The edited text and the number of replacements, or why the edit cannot be made.
fn apply_edit(path: &Path, content: &str, request: &EditRequest) -> Result<(String, usize), ToolError> {
    let crlf = in_line_endings_of(content, request);
    let request = crlf.as_ref().unwrap_or(request);
    let count = content.matches(request.old_string.as_str()).count();
    if count == 0 {
        return Err(ToolError::new(
            "EDIT_NO_MATCH",
            format!(
                "old_string was not found in {}. It must match the file exactly, including \
                 whitespace and indentation; read the file again and copy the text from it \
                 (without the line-number prefixes).",
                path.display()
            ),
        ));
    }
    if count > 1 && !request.replace_all {
        return Err(ToolError::new(
            "EDIT_AMBIGUOUS",
            format!(
                "old_string matches {count} times in {}. Include more surrounding lines in \
                 old_string so it matches exactly once, or set replace_all to true to replace \
                 all {count} occurrences.",
                path.display()
            ),
        ));
    }
    check_edited_size(path, content, count, request)?;
    let updated = if request.replace_all {
        content.replace(&request.old_string, &request.new_string)
    } else {
        content.replacen(&request.old_string, &request.new_string, 1)
    };
    Ok((updated, count))
}

/// The edit in a CRLF file's line endings, when it needs them: `read` shows lines without
/// their `\r`, so a model's `old_string` spanning lines has bare `\n`s and would never match,
/// and its `new_string` would put LF lines into a CRLF file. `None`: the edit as it came (the
/// file has no CRLF, the strings already carry `\r`, or only the text as given matches).
fn in_line_endings_of(content: &str, request: &EditRequest) -> Option<EditRequest> {
    let to_crlf = |text: &str| text.replace("\r\n", "\n").replace('\n', "\r\n");
    if !content.contains("\r\n") || request.old_string.contains('\r') || request.new_string.contains('\r') {
        return None;
    }
    if !request.old_string.contains('\n') && !request.new_string.contains('\n') {
        return None;
    }
    let old_string = to_crlf(&request.old_string);
    if old_string.is_empty() || !content.contains(old_string.as_str()) {
        return None;
    }
    Some(EditRequest {
        file_path: request.file_path.clone(),
        old_string,
        new_string: to_crlf(&request.new_string),
        replace_all: request.replace_all,
    })
}

/// Refuses an edit whose result would be larger than `MAX_WHOLE_FILE_BYTES`, before it is built:
/// the result's length follows from the `count` matches, so a short `old_string` matching
/// millions of times with a long `new_string` costs nothing.
fn check_edited_size(path: &Path, content: &str, count: usize, request: &EditRequest) -> Result<(), ToolError> {
    let replaced = if request.replace_all { count } else { 1 };
    // The matches do not overlap, so they are at most the whole content.
    let kept = content.len() - replaced * request.old_string.len();
    let size = (replaced as u64)
        .checked_mul(request.new_string.len() as u64)
        .and_then(|added| (kept as u64).checked_add(added));
    if size.is_some_and(|size| size <= MAX_WHOLE_FILE_BYTES) {
        return Ok(());
    }
    let size = size.map_or_else(|| "more than 2^64 bytes".to_string(), |size| format!("{size} bytes"));
    Err(ToolError::new(
        "EDIT_TOO_LARGE",
        format!(
            "replacing {replaced} occurrence(s) of old_string in {} would make it {size}, more than \
             the {} MiB edit holds in memory; the file is unchanged. Change it with bash (e.g. \
             `sed -i`) instead.",
            path.display(),
            MAX_WHOLE_FILE_BYTES >> 20
        ),
    ))
}

fn edited(path: &Path, count: usize, old: &str, new: &str, request: &EditRequest) -> Written {
    let diff = diff_meta(path, Some(old), new)
        .or_else(|| diff_meta(path, Some(request.old_string.as_str()), &request.new_string));
    // The line the first replacement starts on (1-based), for the editor's location.
    let line = old.find(request.old_string.as_str()).map(|at| old[..at].matches('\n').count() as u64 + 1);
    let location = Some(json!({"path": path.display().to_string(), "line": line}));
    Written { text: edited_text(path, count, request.replace_all), diff, location }
}

/// dsh's text for an applied `edit` (dsh-design.md §4.1). With `replace_all` and more than one
/// match it also says how many were replaced (kin's own: dsh recorded no such call).
fn edited_text(path: &Path, count: usize, replace_all: bool) -> String {
    let done = format!("The file {} has been updated successfully", path.display());
    if replace_all && count > 1 { format!("{done} ({count} occurrences replaced).") } else { format!("{done}.") }
}

/// What `write` and `edit` report: the model's text, the editor's diff and, for an edit, where
/// it changed the file (`{path, line}`, the path absolute).
struct Written {
    text: String,
    diff: Option<Value>,
    location: Option<Value>,
}

impl Written {
    fn into_output(self) -> ToolOutput {
        let output = ToolOutput::text(self.text);
        let mut meta = serde_json::Map::new();
        if let Some(diff) = self.diff {
            meta.insert("diff".into(), diff);
        }
        if let Some(location) = self.location {
            meta.insert("location".into(), location);
        }
        if meta.is_empty() { output } else { output.with_meta(Value::Object(meta)) }
    }
}

/// `{path, oldText, newText}` (ACP `Diff`; `oldText` null for a new file), or `None` when the
/// texts are larger than `MAX_DIFF_BYTES`.
fn diff_meta(path: &Path, old: Option<&str>, new: &str) -> Option<Value> {
    if old.map_or(0, str::len) + new.len() > MAX_DIFF_BYTES {
        return None;
    }
    Some(json!({"path": path.display().to_string(), "oldText": old, "newText": new}))
}

// ---------------------------------------------------------------------------------------------
// shared file helpers

/// Opens an existing regular file (never blocking on a FIFO or device); `hint` follows the
/// not-found message.
fn open_existing(path: &Path, hint: &str) -> Result<File, ToolError> {
    regular::open_regular(path).map_err(|e| open_error(path, &e, hint))
}

/// The metadata of `path` when it is an existing regular file, `None` when nothing is there.
fn existing_regular(path: &Path) -> Result<Option<std::fs::Metadata>, ToolError> {
    match regular::regular(path) {
        Ok(meta) => Ok(Some(meta)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(open_error(path, &e, "")),
    }
}

/// Why `path` cannot be opened: missing (`hint` follows), a directory, not a regular file
/// (a FIFO, socket or device), or another IO error.
fn open_error(path: &Path, error: &io::Error, hint: &str) -> ToolError {
    match error.kind() {
        io::ErrorKind::NotFound => not_found(path, hint),
        io::ErrorKind::IsADirectory => is_a_directory(path),
        io::ErrorKind::InvalidInput => ToolError::new("NOT_A_REGULAR_FILE", error.to_string()),
        _ => io_error("open", path, error),
    }
}

fn not_found(path: &Path, hint: &str) -> ToolError {
    ToolError::new("FILE_NOT_FOUND", format!("file not found: {}. {hint}", path.display()))
}

/// Reads the first bytes of `file`, refusing binary content (a NUL byte); returns them so the
/// caller can chain them before the rest.
fn sniff_text(file: &mut File, path: &Path) -> Result<Vec<u8>, ToolError> {
    let mut head = Vec::new();
    file.by_ref().take(BINARY_SNIFF_BYTES).read_to_end(&mut head).map_err(|e| io_error("read", path, &e))?;
    if head.contains(&0) {
        return Err(binary_file(path));
    }
    Ok(head)
}

fn binary_file(path: &Path) -> ToolError {
    ToolError::new(
        "BINARY_FILE",
        format!(
            "{} looks like a binary file (it contains NUL bytes), so it cannot be shown or \
             edited as text. Inspect it with bash instead (e.g. `file`, `xxd | head`).",
            path.display()
        ),
    )
}

/// The text of `path` through the editor; a NUL byte still means a binary file.
async fn editor_read(access: &dyn FileAccess, session_id: &str, path: &Path, hint: &str) -> Result<String, ToolError> {
    let text = access.read_text(session_id, path).await.map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => not_found(path, hint),
        _ => io_error("read", path, &e),
    })?;
    if text.contains('\0') {
        return Err(binary_file(path));
    }
    Ok(text)
}

/// The whole content of a text file as UTF-8 (at most `MAX_WHOLE_FILE_BYTES`).
fn read_text(mut file: File, path: &Path) -> Result<String, ToolError> {
    let mut bytes = sniff_text(&mut file, path)?;
    file.by_ref().take(MAX_WHOLE_FILE_BYTES + 1).read_to_end(&mut bytes).map_err(|e| io_error("read", path, &e))?;
    if bytes.len() as u64 > MAX_WHOLE_FILE_BYTES {
        return Err(ToolError::new(
            "FILE_TOO_LARGE",
            format!(
                "{} is larger than {} MiB, more than edit holds in memory; change it with bash \
                 (e.g. `sed -i`) instead",
                path.display(),
                MAX_WHOLE_FILE_BYTES >> 20
            ),
        ));
    }
    String::from_utf8(bytes).map_err(|_| {
        ToolError::new(
            "NOT_UTF8",
            format!(
                "{} is not valid UTF-8 text, so it cannot be edited with this tool; use bash \
                 to change it.",
                path.display()
            ),
        )
    })
}

fn require_read(files: &FileState, path: &Path) -> Result<(), ToolError> {
    if files.was_read(path) {
        return Ok(());
    }
    Err(ToolError::new(
        "READ_BEFORE_WRITE",
        format!("file {} must be read with the read tool before it is edited or overwritten", path.display()),
    ))
}

fn is_a_directory(path: &Path) -> ToolError {
    ToolError::new(
        "IS_A_DIRECTORY",
        format!("{} is a directory, not a file. Use glob to list the files in it.", path.display()),
    )
}

fn io_error(action: &str, path: &Path, error: &io::Error) -> ToolError {
    ToolError::new("IO_ERROR", format!("cannot {action} {}: {error}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;
    use tokio_util::sync::CancellationToken;

    struct Fixture {
        _dir: tempfile::TempDir,
        ws: PathBuf,
        outside: PathBuf,
        files: FileState,
    }

    fn fixture() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        let outside = dir.path().join("outside");
        std::fs::create_dir(&ws).unwrap();
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("secret.txt"), "secret\n").unwrap();
        Fixture { _dir: dir, ws, outside, files: FileState::new() }
    }

    impl Fixture {
        fn ctx(&self) -> ToolContext {
            ToolContext::detached(Some(self.ws.clone()), CancellationToken::new())
        }

        async fn read(&self, args: Value) -> Result<String, ToolError> {
            let tool = ReadTool::new(self.files.clone());
            tool.execute(args, self.ctx()).await.map(text)
        }

        async fn write(&self, args: Value) -> Result<String, ToolError> {
            let tool = WriteTool::new(self.files.clone());
            tool.execute(args, self.ctx()).await.map(text)
        }

        async fn edit(&self, args: Value) -> Result<String, ToolError> {
            let tool = EditTool::new(self.files.clone());
            tool.execute(args, self.ctx()).await.map(text)
        }
    }

    fn text(output: ToolOutput) -> String {
        output.content[0]["text"].as_str().unwrap().to_string()
    }

    fn numbered(n: usize) -> String {
        (1..=n).map(|i| format!("line{i}\n")).collect()
    }

    #[tokio::test]
    async fn read_matches_the_dsh_format() {
        let f = fixture();
        std::fs::write(f.ws.join("greeting.txt"), "hello\n").unwrap();
        let out = f.read(json!({"file_path": "greeting.txt"})).await.unwrap();
        let expected = format!(
            "<path>{}/greeting.txt</path>\n<type>file</type>\n<content>\n1: hello\n\n(End of file - total 1 lines)\n</content>",
            f.ws.display()
        );
        assert_eq!(out, expected);
    }

    #[tokio::test]
    async fn read_ranges_and_continuation_footer() {
        let f = fixture();
        std::fs::write(f.ws.join("ten.txt"), numbered(10)).unwrap();
        let out = f.read(json!({"file_path": "ten.txt", "offset": 3, "limit": 2})).await.unwrap();
        assert!(out.contains("<content>\n3: line3\n4: line4\n\n"), "{out}");
        assert!(!out.contains("5: line5"), "{out}");
        assert!(out.contains("Showing lines 3-4 of 10; use offset=5 to continue."), "{out}");
        let tail = f.read(json!({"file_path": "ten.txt", "offset": 9})).await.unwrap();
        assert!(tail.contains("9: line9\n10: line10\n\n(End of file - total 10 lines)"), "{tail}");
        let err = f.read(json!({"file_path": "ten.txt", "offset": 11})).await.unwrap_err();
        assert_eq!(err.code, "INVALID_ARGUMENTS");
        assert!(err.message.contains("10 lines"), "{}", err.message);
    }

    #[tokio::test]
    async fn read_default_limit_is_2000_lines() {
        let f = fixture();
        std::fs::write(f.ws.join("big.txt"), numbered(2500)).unwrap();
        let out = f.read(json!({"file_path": "big.txt"})).await.unwrap();
        assert!(out.contains("\n2000: line2000\n"), "missing line 2000");
        assert!(!out.contains("2001: line2001"));
        assert!(out.contains("use offset=2001 to continue"));
    }

    #[tokio::test]
    async fn read_shows_images_up_to_the_cap_and_stays_in_the_workspace() {
        let f = fixture();
        let png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR";
        std::fs::write(f.ws.join("shot.png"), png).unwrap();
        let tool = ReadTool::new(f.files.clone());
        let out = tool.execute(json!({"file_path": "shot.png"}), f.ctx()).await.unwrap();
        let path = f.ws.join("shot.png");
        assert_eq!(out.content[0]["text"], format!("Image {} (image/png, {} bytes)", path.display(), png.len()));
        assert_eq!(out.content[1], image::block(image::Format::Png, png));
        // Over the cap: a clear error, and the bytes are never held past the cap.
        let mut big = b"GIF89a".to_vec();
        big.resize(image::MAX_IMAGE_BYTES + 1, 0);
        std::fs::write(f.ws.join("big.gif"), &big).unwrap();
        let err = f.read(json!({"file_path": "big.gif"})).await.unwrap_err();
        assert_eq!(err.code, "IMAGE_TOO_LARGE");
        assert!(err.message.contains("3.75 MiB"), "{}", err.message);
        // Another binary is still refused, and an image outside the workspace too.
        std::fs::write(f.ws.join("blob.bin"), b"\0\x01\x02").unwrap();
        assert_eq!(f.read(json!({"file_path": "blob.bin"})).await.unwrap_err().code, "BINARY_FILE");
        std::fs::write(f.outside.join("out.png"), png).unwrap();
        let outside = f.outside.join("out.png").display().to_string();
        assert_eq!(f.read(json!({"file_path": outside})).await.unwrap_err().code, "OUTSIDE_WORKSPACE");
    }

    #[tokio::test]
    async fn read_errors_name_the_path() {
        let f = fixture();
        let err = f.read(json!({"file_path": "nope.txt"})).await.unwrap_err();
        assert_eq!(err.code, "FILE_NOT_FOUND");
        assert!(err.message.contains("nope.txt"), "{}", err.message);
        std::fs::create_dir(f.ws.join("dir")).unwrap();
        let err = f.read(json!({"file_path": "dir"})).await.unwrap_err();
        assert_eq!(err.code, "IS_A_DIRECTORY");
        let err = f.read(json!({})).await.unwrap_err();
        assert_eq!(err.code, "INVALID_ARGUMENTS");
    }

    #[tokio::test]
    async fn read_refuses_binary_files() {
        let f = fixture();
        std::fs::write(f.ws.join("blob.bin"), b"abc\0def").unwrap();
        let err = f.read(json!({"file_path": "blob.bin"})).await.unwrap_err();
        assert_eq!(err.code, "BINARY_FILE");
        assert!(err.message.contains("blob.bin"), "{}", err.message);
    }

    #[tokio::test]
    async fn read_truncates_long_lines() {
        let f = fixture();
        let long = "x".repeat(2500);
        std::fs::write(f.ws.join("long.txt"), format!("{long}\nshort\n")).unwrap();
        let out = f.read(json!({"file_path": "long.txt"})).await.unwrap();
        let expected =
            format!("1: {}... (line truncated to 2000 chars; it is 2500 bytes long)\n2: short\n", "x".repeat(2000));
        assert!(out.contains(&expected), "{out}");
        assert!(out.contains("(Lines longer than 2000 characters were cut. To see more of one, use bash"), "{out}");
        assert!(out.contains("sed -n '1p'"), "{out}");
        assert!(out.contains("| perl -CSD -ne 'print substr($_, 2000, 4000)'`"), "in characters: {out}");
    }

    #[test]
    fn a_read_from_offset_0_is_located_at_line_1() {
        let read = ReadTool::new(FileState::default());
        for (offset, line) in [(json!(0), Some(1)), (json!(7), Some(7)), (json!(null), None)] {
            let Access::Read { line: located, .. } = read.access(&json!({"file_path": "a", "offset": offset})) else {
                panic!("a read")
            };
            assert_eq!(located, line, "offset {offset}");
        }
    }

    #[test]
    fn a_line_is_kept_only_up_to_the_cap_however_long() {
        // 3 MB of one line with no newline, then a CRLF line: only the cap is kept of the first.
        let mut text = "é".repeat(1_500_000).into_bytes();
        text.extend_from_slice(b"\nnext\r\n");
        let mut reader = BufReader::with_capacity(64, Cursor::new(&text));
        let mut buf = Vec::new();
        let first = read_line_capped(&mut reader, MAX_LINE_BYTES, &mut buf).unwrap();
        assert_eq!(first, LineLength { read: 3_000_001, text: 3_000_000 });
        assert_eq!(buf.len(), MAX_LINE_BYTES);
        assert!(buf.capacity() < 2 * MAX_LINE_BYTES, "{}", buf.capacity());
        let shown = display_line(&buf, first);
        assert!(shown.cut);
        assert_eq!(
            shown.text,
            format!("{}... (line truncated to 2000 chars; it is 3000000 bytes long)", "é".repeat(2000))
        );
        let second = read_line_capped(&mut reader, MAX_LINE_BYTES, &mut buf).unwrap();
        assert_eq!((second, buf.as_slice()), (LineLength { read: 6, text: 4 }, &b"next\r\n"[..]));
        assert_eq!(display_line(&buf, second).text, "next");
        // A CR split from its LF by the reader's buffer still counts as the line ending.
        let mut reader = BufReader::with_capacity(3, Cursor::new(b"ab\r\nc"));
        assert_eq!(read_line_capped(&mut reader, 0, &mut buf).unwrap(), LineLength { read: 4, text: 2 });
        assert_eq!(read_line_capped(&mut reader, 0, &mut buf).unwrap(), LineLength { read: 1, text: 1 });
        assert_eq!(read_line_capped(&mut reader, 0, &mut buf).unwrap().read, 0);
    }

    #[tokio::test]
    async fn fifos_and_devices_are_refused_not_blocked_on() {
        let f = fixture();
        let fifo = f.ws.join("pipe");
        let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo with a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        let err = f.read(json!({"file_path": "pipe"})).await.unwrap_err();
        assert_eq!(err.code, "NOT_A_REGULAR_FILE");
        assert!(err.message.contains("pipe is a FIFO (named pipe), not a regular file"), "{}", err.message);
        // Writing and editing a FIFO the session "read" are refused the same way.
        f.files.mark_read(&fifo);
        let err = f.write(json!({"file_path": "pipe", "content": "x"})).await.unwrap_err();
        assert_eq!(err.code, "NOT_A_REGULAR_FILE");
        let err = f.edit(json!({"file_path": "pipe", "old_string": "a", "new_string": "b"})).await.unwrap_err();
        assert_eq!(err.code, "NOT_A_REGULAR_FILE");
        // Through an editor too: nothing on disk that is not a regular file is handed to it.
        let mut ctx = f.ctx();
        ctx.file_access = Some(Arc::new(Buffers::default()) as Arc<dyn FileAccess>);
        let err = ReadTool::new(f.files.clone()).execute(json!({"file_path": "pipe"}), ctx).await.unwrap_err();
        assert_eq!(err.code, "NOT_A_REGULAR_FILE");
    }

    #[tokio::test]
    async fn read_of_an_empty_file() {
        let f = fixture();
        std::fs::write(f.ws.join("empty.txt"), "").unwrap();
        let out = f.read(json!({"file_path": "empty.txt"})).await.unwrap();
        assert!(out.contains("(End of file - total 0 lines)"), "{out}");
    }

    #[tokio::test]
    async fn edit_requires_a_prior_read() {
        let f = fixture();
        std::fs::write(f.ws.join("a.txt"), "one two\n").unwrap();
        let args = json!({"file_path": "a.txt", "old_string": "one", "new_string": "1"});
        let err = f.edit(args.clone()).await.unwrap_err();
        assert_eq!(err.code, "READ_BEFORE_WRITE");
        assert!(err.message.contains("a.txt"), "{}", err.message);
        f.read(json!({"file_path": "a.txt"})).await.unwrap();
        let out = f.edit(args).await.unwrap();
        assert_eq!(out, format!("The file {} has been updated successfully.", f.ws.join("a.txt").display()));
        assert_eq!(std::fs::read_to_string(f.ws.join("a.txt")).unwrap(), "1 two\n");
    }

    #[tokio::test]
    async fn edit_reports_missing_and_ambiguous_matches() {
        let f = fixture();
        std::fs::write(f.ws.join("b.txt"), "x = 1;\nx = 1;\n").unwrap();
        f.read(json!({"file_path": "b.txt"})).await.unwrap();
        let err = f.edit(json!({"file_path": "b.txt", "old_string": "y = 2;", "new_string": "z"})).await.unwrap_err();
        assert_eq!(err.code, "EDIT_NO_MATCH");
        assert!(err.message.contains("not found"), "{}", err.message);
        let err =
            f.edit(json!({"file_path": "b.txt", "old_string": "x = 1;", "new_string": "x = 2;"})).await.unwrap_err();
        assert_eq!(err.code, "EDIT_AMBIGUOUS");
        assert!(err.message.contains("2 times"), "{}", err.message);
        assert!(err.message.contains("replace_all"), "{}", err.message);
        let out = f
            .edit(json!({"file_path": "b.txt", "old_string": "x = 1;", "new_string": "x = 2;", "replace_all": true}))
            .await
            .unwrap();
        let b = f.ws.join("b.txt");
        assert_eq!(out, format!("The file {} has been updated successfully (2 occurrences replaced).", b.display()));
        assert_eq!(std::fs::read_to_string(f.ws.join("b.txt")).unwrap(), "x = 2;\nx = 2;\n");
        let err = f.edit(json!({"file_path": "b.txt", "old_string": "x", "new_string": "x"})).await.unwrap_err();
        assert_eq!(err.code, "EDIT_NO_CHANGE");
        let err = f.edit(json!({"file_path": "missing.txt", "old_string": "a", "new_string": "b"})).await.unwrap_err();
        assert_eq!(err.code, "FILE_NOT_FOUND");
    }

    #[tokio::test]
    async fn a_write_to_a_path_ending_in_a_slash_is_refused() {
        let f = fixture();
        let err = f.write(json!({"file_path": "newdir/", "content": "x"})).await.unwrap_err();
        assert_eq!(err.code, "INVALID_ARGUMENTS");
        assert!(err.message.contains("names a directory"), "{}", err.message);
        assert!(!f.ws.join("newdir").exists(), "nothing was made");
    }

    /// A CRLF file is edited in its own line endings: `read` shows its lines without `\r`, so
    /// an `old_string` spanning lines (bare `\n`) matches, and a `new_string`'s lines end in
    /// `\r\n` too; an LF file is untouched by this.
    #[tokio::test]
    async fn a_crlf_file_is_edited_in_its_own_line_endings() {
        let f = fixture();
        std::fs::write(f.ws.join("main.rs"), "fn main() {\r\n    println!(\"hi\");\r\n}\r\n").unwrap();
        f.read(json!({"file_path": "main.rs"})).await.unwrap();
        let spanning = json!({"file_path": "main.rs", "old_string": "fn main() {\n    println!(\"hi\");", "new_string": "fn main() {\n    let x = 1;\n    println!(\"{x}\");"});
        f.edit(spanning).await.unwrap();
        assert_eq!(
            std::fs::read_to_string(f.ws.join("main.rs")).unwrap(),
            "fn main() {\r\n    let x = 1;\r\n    println!(\"{x}\");\r\n}\r\n"
        );
        let one_line =
            json!({"file_path": "main.rs", "old_string": "let x = 1;", "new_string": "let x = 1;\n    let y = 2;"});
        f.edit(one_line).await.unwrap();
        assert!(std::fs::read_to_string(f.ws.join("main.rs")).unwrap().contains("let x = 1;\r\n    let y = 2;\r\n"));
        std::fs::write(f.ws.join("lf.rs"), "a\nb\n").unwrap();
        f.read(json!({"file_path": "lf.rs"})).await.unwrap();
        f.edit(json!({"file_path": "lf.rs", "old_string": "a\nb", "new_string": "a\nc"})).await.unwrap();
        assert_eq!(std::fs::read_to_string(f.ws.join("lf.rs")).unwrap(), "a\nc\n");
    }

    /// A `replace_all` whose result would pass `MAX_WHOLE_FILE_BYTES` is refused before the
    /// result is built, and the file is left as it was; a smaller one on the same file runs.
    #[tokio::test]
    async fn an_edit_growing_past_the_whole_file_cap_is_refused() {
        let f = fixture();
        let path = f.ws.join("many.txt");
        let content = "a".repeat(1 << 20);
        std::fs::write(&path, &content).unwrap();
        f.read(json!({"file_path": "many.txt"})).await.unwrap();
        // 2^20 matches of 1 byte, each becoming 65 bytes: 65 MiB.
        let grown = "b".repeat(65);
        let args = json!({"file_path": "many.txt", "old_string": "a", "new_string": grown, "replace_all": true});
        let err = f.edit(args).await.unwrap_err();
        assert_eq!(err.code, "EDIT_TOO_LARGE");
        let size = 65u64 << 20;
        assert!(err.message.contains(&format!("{} would make it {size} bytes", path.display())), "{}", err.message);
        assert!(err.message.contains("more than the 64 MiB"), "{}", err.message);
        assert!(std::fs::read_to_string(&path).unwrap() == content, "the file is unchanged");
        let args = json!({"file_path": "many.txt", "old_string": "a", "new_string": "bb", "replace_all": true});
        let out = f.edit(args).await.unwrap();
        assert!(out.ends_with(&format!("({} occurrences replaced).", 1 << 20)), "{out}");
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 2 << 20);
    }

    #[tokio::test]
    async fn write_creates_parents_and_guards_overwrites() {
        let f = fixture();
        let out = f.write(json!({"file_path": "new/dir/c.txt", "content": "hi\n"})).await.unwrap();
        let path = f.ws.join("new/dir/c.txt");
        let created =
            format!("<path>{}</path>\n<type>file</type>\n<content>\nCreated file\n</content>", path.display());
        assert_eq!(out, created);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "hi\n");
        // A file this session wrote may be edited and overwritten without a read.
        let out = f.write(json!({"file_path": "new/dir/c.txt", "content": "again\n"})).await.unwrap();
        assert_eq!(out, created.replace("Created file", "Updated file"));
        std::fs::write(f.ws.join("d.txt"), "old\n").unwrap();
        let err = f.write(json!({"file_path": "d.txt", "content": "new\n"})).await.unwrap_err();
        assert_eq!(err.code, "READ_BEFORE_WRITE");
        f.read(json!({"file_path": "d.txt"})).await.unwrap();
        f.write(json!({"file_path": "d.txt", "content": "new\n"})).await.unwrap();
        assert_eq!(std::fs::read_to_string(f.ws.join("d.txt")).unwrap(), "new\n");
    }

    #[tokio::test]
    async fn paths_outside_the_workspace_are_refused() {
        let f = fixture();
        let err = f.read(json!({"file_path": "../outside/secret.txt"})).await.unwrap_err();
        assert_eq!(err.code, "OUTSIDE_WORKSPACE");
        assert!(err.message.contains("secret.txt"), "{}", err.message);
        let absolute = f.outside.join("secret.txt");
        let err = f.read(json!({"file_path": absolute.to_str().unwrap()})).await.unwrap_err();
        assert_eq!(err.code, "OUTSIDE_WORKSPACE");
        symlink(&f.outside, f.ws.join("link")).unwrap();
        let err = f.read(json!({"file_path": "link/secret.txt"})).await.unwrap_err();
        assert_eq!(err.code, "OUTSIDE_WORKSPACE");
        let err = f.write(json!({"file_path": "link/planted.txt", "content": "x"})).await.unwrap_err();
        assert_eq!(err.code, "OUTSIDE_WORKSPACE");
        assert!(!f.outside.join("planted.txt").exists());
    }

    #[tokio::test]
    async fn writes_and_edits_carry_a_diff_for_the_editor() {
        let f = fixture();
        let write = WriteTool::new(f.files.clone());
        let out = write.execute(json!({"file_path": "n.txt", "content": "one\n"}), f.ctx()).await.unwrap();
        let path = f.ws.join("n.txt").display().to_string();
        assert_eq!(out.meta, Some(json!({"diff": {"path": path, "oldText": null, "newText": "one\n"}})));
        let edit = EditTool::new(f.files.clone());
        let out = edit
            .execute(json!({"file_path": "n.txt", "old_string": "one", "new_string": "two"}), f.ctx())
            .await
            .unwrap();
        assert_eq!(
            out.meta,
            Some(
                json!({"diff": {"path": path, "oldText": "one\n", "newText": "two\n"}, "location": {"path": path, "line": 1}})
            )
        );
        std::fs::write(f.ws.join("m.txt"), "a\nb\nc\nb\n").unwrap();
        f.files.mark_read(&f.ws.join("m.txt"));
        let args = json!({"file_path": "m.txt", "old_string": "b", "new_string": "B", "replace_all": true});
        let out = edit.execute(args, f.ctx()).await.unwrap();
        assert_eq!(out.meta.unwrap()["location"]["line"], 2, "the line of the first replacement");
        let out = write.execute(json!({"file_path": "n.txt", "content": "three\n"}), f.ctx()).await.unwrap();
        assert_eq!(out.meta.unwrap()["diff"]["oldText"], "two\n");
        // Failures carry no meta: they are errors.
        let err = edit
            .execute(json!({"file_path": "n.txt", "old_string": "absent", "new_string": "x"}), f.ctx())
            .await
            .unwrap_err();
        assert_eq!(err.code, "EDIT_NO_MATCH");
    }

    #[tokio::test]
    async fn a_write_over_a_large_or_binary_file_carries_no_diff() {
        let f = fixture();
        let write = WriteTool::new(f.files.clone());
        let olds = [("big.txt", "x".repeat(MAX_DIFF_BYTES + 1).into_bytes()), ("bin.dat", vec![b'a', 0xff, 0xfe])];
        for (name, old) in olds {
            let path = f.ws.join(name);
            std::fs::write(&path, old).unwrap();
            f.files.mark_read(&path);
            let out = write.execute(json!({"file_path": name, "content": "small\n"}), f.ctx()).await.unwrap();
            assert_eq!(out.meta, None, "{name}");
            assert!(text(out).contains("Updated file"), "{name}");
            assert_eq!(std::fs::read_to_string(&path).unwrap(), "small\n");
        }
    }

    #[tokio::test]
    async fn an_outside_path_the_gate_allowed_can_be_used() {
        let f = fixture();
        let mut ctx = f.ctx();
        ctx.allow_outside = true;
        let read = ReadTool::new(f.files.clone());
        let out = read.execute(json!({"file_path": "../outside/secret.txt"}), ctx.clone()).await.map(text).unwrap();
        assert!(out.contains("1: secret"), "{out}");
        let edit = EditTool::new(f.files.clone());
        edit.execute(
            json!({"file_path": "../outside/secret.txt", "old_string": "secret", "new_string": "public"}),
            ctx,
        )
        .await
        .unwrap();
        assert_eq!(std::fs::read_to_string(f.outside.join("secret.txt")).unwrap(), "public\n");
        // Without the gate's approval the same path is refused.
        let err = f.read(json!({"file_path": "../outside/secret.txt"})).await.unwrap_err();
        assert_eq!(err.code, "OUTSIDE_WORKSPACE");
    }

    /// An editor with its own buffers: reads see them, writes land in them (not on disk).
    #[derive(Debug, Default)]
    struct Buffers(Mutex<std::collections::HashMap<PathBuf, String>>);

    impl FileAccess for Buffers {
        fn read_text(&self, _session_id: &str, path: &Path) -> BoxFuture<'static, io::Result<String>> {
            let text = self.0.lock().unwrap().get(path).cloned();
            async move { text.ok_or_else(|| io::Error::from(io::ErrorKind::NotFound)) }.boxed()
        }

        fn write_text(&self, _session_id: &str, path: &Path, content: String) -> BoxFuture<'static, io::Result<()>> {
            self.0.lock().unwrap().insert(path.to_path_buf(), content);
            async { Ok(()) }.boxed()
        }
    }

    #[tokio::test]
    async fn the_editor_is_used_when_the_call_has_file_access() {
        let f = fixture();
        let path = f.ws.join("a.txt");
        std::fs::write(&path, "on disk\n").unwrap();
        let buffers = Arc::new(Buffers::default());
        buffers.0.lock().unwrap().insert(path.clone(), "unsaved buffer\n".into());
        let mut ctx = f.ctx();
        ctx.file_access = Some(buffers.clone() as Arc<dyn FileAccess>);
        let out =
            ReadTool::new(f.files.clone()).execute(json!({"file_path": "a.txt"}), ctx.clone()).await.map(text).unwrap();
        assert!(out.contains("1: unsaved buffer"), "{out}");
        let out = EditTool::new(f.files.clone())
            .execute(json!({"file_path": "a.txt", "old_string": "unsaved", "new_string": "edited"}), ctx.clone())
            .await
            .unwrap();
        assert_eq!(out.meta.unwrap()["diff"]["oldText"], "unsaved buffer\n");
        assert_eq!(buffers.0.lock().unwrap().get(&path).map(String::as_str), Some("edited buffer\n"));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "on disk\n");
        // A NUL in the editor's text is still a binary file.
        buffers.0.lock().unwrap().insert(path.clone(), "a\0b".into());
        let err = ReadTool::new(f.files.clone()).execute(json!({"file_path": "a.txt"}), ctx.clone()).await.unwrap_err();
        assert_eq!(err.code, "BINARY_FILE");
        let out = WriteTool::new(f.files.clone())
            .execute(json!({"file_path": "new.txt", "content": "fresh\n"}), ctx)
            .await
            .unwrap();
        assert_eq!(out.meta.unwrap()["diff"]["oldText"], Value::Null);
        assert_eq!(buffers.0.lock().unwrap().get(&f.ws.join("new.txt")).map(String::as_str), Some("fresh\n"));
        assert!(!f.ws.join("new.txt").exists(), "the editor writes the file, not kin");
    }
}
