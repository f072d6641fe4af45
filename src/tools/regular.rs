//! The one gate in front of every file kin opens for a tool or for an external agent's `fs/*`
//! request: only regular files are read or written. A FIFO, a socket or a device inside the
//! workspace is refused with an error that names it, before anything could block on it: the path
//! is checked with `stat` first (opening some devices has effects of its own), then opened
//! non-blocking, and the open file is checked again (the path may have changed in between).

use std::fs::{File, Metadata, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// The metadata of `path` (symlinks followed) when it is a regular file. A missing path is
/// `NotFound`, a directory `IsADirectory`, anything else that is not a regular file
/// `InvalidInput` with a message naming the path and what it is.
pub(crate) fn regular(path: &Path) -> io::Result<Metadata> {
    let meta = std::fs::metadata(path)?;
    check(path, &meta)?;
    Ok(meta)
}

/// Opens `path` for reading when it is a regular file (see [`regular`]), without ever blocking
/// in `open`.
pub(crate) fn open_regular(path: &Path) -> io::Result<File> {
    regular(path)?;
    let file = OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY).open(path)?;
    check(path, &file.metadata()?)?;
    Ok(file)
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
}
