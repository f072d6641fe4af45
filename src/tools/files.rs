//! Where the file tools read and write whole text files when they do not use the disk directly:
//! `FileAccess`, implemented by the editor over ACP (`fs/read_text_file`, `fs/write_text_file`,
//! so unsaved buffers are seen and edits land in the editor) and by `DiskFiles`. A call whose
//! `ToolContext::file_access` is `None` uses the file tools' own disk code (streamed reads with
//! binary detection).

use std::fmt;
use std::io;
use std::path::Path;

use futures::FutureExt;
use futures::future::BoxFuture;

use super::fs::MAX_WHOLE_FILE_BYTES;

/// Reads and writes whole UTF-8 text files for a session.
pub trait FileAccess: Send + Sync + fmt::Debug {
    /// The text of `path` (absolute), as the session's editor sees it.
    fn read_text(&self, session_id: &str, path: &Path) -> BoxFuture<'static, io::Result<String>>;

    /// Replaces the text of `path` (absolute), creating the file if needed.
    fn write_text(&self, session_id: &str, path: &Path, content: String) -> BoxFuture<'static, io::Result<()>>;
}

/// The local filesystem.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct DiskFiles;

impl FileAccess for DiskFiles {
    /// Only a regular file is read (a FIFO or device is refused without blocking), and at most
    /// `MAX_WHOLE_FILE_BYTES` of it.
    fn read_text(&self, _session_id: &str, path: &Path) -> BoxFuture<'static, io::Result<String>> {
        let path = path.to_path_buf();
        async move {
            let read = move || super::regular::read_text(&path, MAX_WHOLE_FILE_BYTES);
            tokio::task::spawn_blocking(read).await.map_err(io::Error::other)?
        }
        .boxed()
    }

    fn write_text(&self, _session_id: &str, path: &Path, content: String) -> BoxFuture<'static, io::Result<()>> {
        let path = path.to_path_buf();
        async move {
            let write = move || super::regular::write_regular(&path, content.as_bytes());
            tokio::task::spawn_blocking(write).await.map_err(io::Error::other)?
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn disk_files_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.txt");
        DiskFiles.write_text("s", &path, "hello\n".into()).await.unwrap();
        assert_eq!(DiskFiles.read_text("s", &path).await.unwrap(), "hello\n");
        let missing = DiskFiles.read_text("s", &dir.path().join("missing.txt")).await.unwrap_err();
        assert_eq!(missing.kind(), io::ErrorKind::NotFound);
    }
}
