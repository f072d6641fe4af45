//! The one gate in front of every file kin opens for a tool or for an external agent's `fs/*`
//! request: only regular files are read or written. A FIFO, a socket or a device inside the
//! workspace is refused with an error that names it, before anything could block on it: the path
//! is checked with `stat` first (opening some devices has effects of its own), then opened
//! non-blocking, and the open file is checked again (the path may have changed in between).
//! The readers here read at most one byte past the limit they are given, whatever the file is or
//! becomes meanwhile, and say when there was more.

use std::fs::{File, Metadata, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The metadata of `path` (symlinks followed) when it is a regular file. A missing path is
/// `NotFound`, a directory `IsADirectory`, anything else that is not a regular file
/// `InvalidInput` with a message naming the path and what it is.
pub(crate) fn regular(path: &Path) -> io::Result<Metadata> {
    let meta = std::fs::metadata(path)?;
    check(path, &meta)?;
    Ok(meta)
}

/// `path` with its symlinks resolved, when that stays inside `root` (resolved too): a file the
/// workspace itself offers kin (its instructions, its command files) is read only from inside
/// it, so a cloned repository's `AGENTS.md -> ~/.ssh/id_rsa` is `PermissionDenied`, its message
/// naming where the link leads. A missing path is `NotFound`.
pub(crate) fn resolved_within(path: &Path, root: &Path) -> io::Result<PathBuf> {
    let resolved = std::fs::canonicalize(path)?;
    if !resolved.starts_with(std::fs::canonicalize(root)?) {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} links to {}, outside the workspace, which kin does not follow",
                path.display(),
                resolved.display()
            ),
        ));
    }
    Ok(resolved)
}

/// Opens `path` for reading when it is a regular file (see [`regular`]), without ever blocking
/// in `open`.
pub(crate) fn open_regular(path: &Path) -> io::Result<File> {
    regular(path)?;
    let file = OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY).open(path)?;
    check(path, &file.metadata()?)?;
    Ok(file)
}

/// The start of a regular file, as [`read_head`] read it.
#[derive(Debug)]
pub(crate) struct Head {
    /// At most the limit asked for.
    pub(crate) bytes: Vec<u8>,
    /// The file's size in bytes (its metadata's, or more when it grew while read): larger than
    /// `bytes.len()` when the file was cut.
    pub(crate) size: u64,
}

impl Head {
    /// Whether the file holds more than `bytes`.
    pub(crate) fn is_cut(&self) -> bool {
        self.size > self.bytes.len() as u64
    }
}

/// At most `limit` bytes from the start of the regular file `path` (opened by [`open_regular`])
/// and its size, so that a caller can say it was cut.
pub(crate) fn read_head(path: &Path, limit: u64) -> io::Result<Head> {
    let file = open_regular(path)?;
    let size = file.metadata()?.len();
    let (bytes, cut) = read_at_most(file, limit)?;
    // What was read wins over the metadata: the file may have changed in between.
    let size = if cut { size.max(limit.saturating_add(1)) } else { bytes.len() as u64 };
    Ok(Head { bytes, size })
}

/// The whole text of the regular file `path` (opened by [`open_regular`]), refused with an error
/// naming it when it is larger than `limit` bytes or not UTF-8.
pub(crate) fn read_text(path: &Path, limit: u64) -> io::Result<String> {
    text_within(open_regular(path)?, limit, &path.display().to_string())
}

/// The whole of `reader` as UTF-8 text, refused with an error naming it (`what`) when it holds
/// more than `limit` bytes (at most `limit + 1` are read) or is not UTF-8.
pub fn text_within(reader: impl Read, limit: u64, what: &str) -> io::Result<String> {
    let (bytes, cut) = read_at_most(reader, limit)?;
    if cut {
        return Err(io::Error::new(
            io::ErrorKind::FileTooLarge,
            format!("{what} is larger than {limit} bytes, the most kin reads of it"),
        ));
    }
    String::from_utf8(bytes)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, format!("{what} is not UTF-8 text")))
}

/// At most `limit` bytes of `reader`, and whether it held more: never more than `limit + 1`
/// bytes are read.
pub(crate) fn read_at_most(reader: impl Read, limit: u64) -> io::Result<(Vec<u8>, bool)> {
    let mut bytes = Vec::new();
    reader.take(limit.saturating_add(1)).read_to_end(&mut bytes)?;
    let cut = bytes.len() as u64 > limit;
    if cut {
        bytes.truncate(bytes.len() - 1);
    }
    Ok((bytes, cut))
}

/// Writes `bytes` as the whole content of `path` (created when missing, else truncated) unless
/// it exists and is not a regular file; never blocks in `open` (a FIFO without a reader fails,
/// one with a reader is refused before anything is written).
pub(crate) fn write_regular(path: &Path, bytes: &[u8]) -> io::Result<()> {
    match regular(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        other => {
            other?;
        }
    }
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    check(path, &file.metadata()?)?;
    (&file).write_all(bytes)
}

fn check(path: &Path, meta: &Metadata) -> io::Result<()> {
    let kind = meta.file_type();
    if kind.is_file() {
        return Ok(());
    }
    if kind.is_dir() {
        return Err(io::Error::new(io::ErrorKind::IsADirectory, format!("{} is a directory", path.display())));
    }
    let what = if kind.is_fifo() {
        "a FIFO (named pipe)"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else {
        "not a regular file"
    };
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{} is {what}, not a regular file; kin reads and writes only regular files", path.display()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_open() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.txt");
        std::fs::write(&file, "x").unwrap();
        assert!(open_regular(&file).is_ok());
        let fifo = dir.path().join("pipe");
        let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo with a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        let err = open_regular(&fifo).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert!(err.to_string().contains("is a FIFO (named pipe), not a regular file"), "{err}");
        let socket = dir.path().join("sock");
        let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        assert!(open_regular(&socket).unwrap_err().to_string().contains("is a socket"));
        assert!(open_regular(Path::new("/dev/null")).unwrap_err().to_string().contains("character device"));
        assert_eq!(open_regular(dir.path()).unwrap_err().kind(), io::ErrorKind::IsADirectory);
        assert_eq!(regular(&dir.path().join("missing")).unwrap_err().kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn bounded_reads_stop_one_byte_past_the_limit_and_say_so() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.txt");
        std::fs::write(&file, "0123456789").unwrap();
        let head = read_head(&file, 4).unwrap();
        assert_eq!((head.bytes.as_slice(), head.size, head.is_cut()), (&b"0123"[..], 10, true));
        let head = read_head(&file, 10).unwrap();
        assert_eq!((head.bytes.len(), head.size, head.is_cut()), (10, 10, false));
        assert_eq!(read_text(&file, 10).unwrap(), "0123456789");
        let err = read_text(&file, 9).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::FileTooLarge);
        assert!(err.to_string().contains("a.txt is larger than 9 bytes"), "{err}");
        std::fs::write(&file, b"\xff\xfe").unwrap();
        assert!(read_text(&file, 10).unwrap_err().to_string().contains("a.txt is not UTF-8 text"));
        // An endless stream is read one byte past the limit, no more.
        assert_eq!(read_at_most(io::repeat(b'x'), 3).unwrap(), (b"xxx".to_vec(), true));
        let err = text_within(io::repeat(b'x'), 3, "stdin").unwrap_err();
        assert_eq!(err.to_string(), "stdin is larger than 3 bytes, the most kin reads of it");
        // A symlink to an endless device is refused before anything is read.
        let zero = dir.path().join("zero");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        assert!(read_head(&zero, 4).unwrap_err().to_string().contains("character device"));
    }
}
