//! Stored API keys (`kin login` writes them, `kin logout` removes them): the OS credential store
//! (the `keyring` crate: Keychain, Windows Credential Manager, the Secret Service), or, where none
//! is reachable, a 0600 JSON file under the config dir. Keys are stored under the name of the
//! variable they stand for (`DEEPSEEK_API_KEY`), service `kin`. kin reads a key from the
//! environment first and from this store second ([`lookup`]). No key ever reaches a message or
//! a log line from here.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// The keyring service every key is stored under.
const SERVICE: &str = "kin";
/// The credentials file never grows past this (a handful of keys); a larger one is refused.
const FILE_LIMIT: u64 = 64 * 1024;

/// Where keys are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backend {
    /// The OS credential store when one answers, else the file.
    #[default]
    Auto,
    /// Only the OS credential store.
    Keyring,
    /// Only the file (what tests and headless machines use).
    File,
}

impl Backend {
    /// `auto`, `keyring` or `file` (`$KIN_KEY_STORE`, config `key_store`).
    pub fn parse(text: &str) -> Result<Backend, String> {
        match text {
            "auto" => Ok(Backend::Auto),
            "keyring" => Ok(Backend::Keyring),
            "file" => Ok(Backend::File),
            other => Err(format!("unknown key store {other:?}; valid values are auto, keyring, file")),
        }
    }
}

/// The configured key store: the backend and the file it falls back to (None when neither
/// `$XDG_CONFIG_HOME` nor `$HOME` is set).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KeyStore {
    pub backend: Backend,
    pub file: Option<PathBuf>,
}

/// Where `set` put a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stored {
    Keyring,
    File(PathBuf),
}

impl std::fmt::Display for Stored {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stored::Keyring => write!(f, "the OS credential store (service \"{SERVICE}\")"),
            Stored::File(path) => write!(f, "{} (readable only by you)", path.display()),
        }
    }
}

/// The file-name of the credentials file in the config dir.
pub(crate) const FILE_NAME: &str = "credentials.json";

impl KeyStore {
    /// The key stored for `variable`, if any.
    pub fn get(&self, variable: &str) -> Result<Option<String>, String> {
        if self.backend != Backend::File {
            match keyring_entry(variable).and_then(|e| read_entry(&e)) {
                Ok(Some(key)) => return Ok(Some(key)),
                Ok(None) => {}
                Err(e) if self.backend == Backend::Keyring => return Err(e),
                Err(e) => tracing::debug!("no OS credential store, reading the credentials file: {e}"),
            }
            if self.backend == Backend::Keyring {
                return Ok(None);
            }
        }
        match &self.file {
            Some(path) => Ok(read_file(path)?.remove(variable)),
            None => Ok(None),
        }
    }

    /// Stores `key` for `variable`: in the OS credential store, or in the file where none
    /// answers (auto) or the file is chosen. Durable when it returns.
    pub fn set(&self, variable: &str, key: &str) -> Result<Stored, String> {
        if self.backend != Backend::File {
            match keyring_entry(variable).and_then(|e| e.set_password(key).map_err(keyring_error)) {
                Ok(()) => {
                    // A key left in the file from before would only confuse a later logout.
                    if let Some(path) = &self.file {
                        let _ = remove_from_file(path, variable);
                    }
                    return Ok(Stored::Keyring);
                }
                Err(e) if self.backend == Backend::Keyring => return Err(e),
                Err(e) => tracing::debug!("no OS credential store, using the credentials file: {e}"),
            }
        }
        let path = self.file_path()?;
        let mut keys = read_file(path)?;
        keys.insert(variable.to_string(), key.to_string());
        write_file(path, &keys)?;
        Ok(Stored::File(path.to_path_buf()))
    }

    /// Removes the key stored for `variable` from both places; whether there was one.
    pub fn delete(&self, variable: &str) -> Result<bool, String> {
        let mut removed = false;
        if self.backend != Backend::File {
            match keyring_entry(variable).and_then(|e| match e.delete_credential() {
                Ok(()) => Ok(true),
                Err(keyring::Error::NoEntry) => Ok(false),
                Err(e) => Err(keyring_error(e)),
            }) {
                Ok(found) => removed |= found,
                Err(e) if self.backend == Backend::Keyring => return Err(e),
                Err(e) => tracing::debug!("no OS credential store to remove a key from: {e}"),
            }
        }
        if self.backend != Backend::Keyring
            && let Some(path) = &self.file
        {
            removed |= remove_from_file(path, variable)?;
        }
        Ok(removed)
    }

    fn file_path(&self) -> Result<&Path, String> {
        self.file
            .as_deref()
            .ok_or_else(|| "cannot choose a credentials file: neither XDG_CONFIG_HOME nor HOME is set".to_string())
    }
}

/// The key for `variable`: the environment's (`env`) first, then the store's. A store that
/// cannot be read counts as holding none (logged without the key).
pub(crate) fn lookup(env: &dyn Fn(&str) -> Option<String>, store: &KeyStore, variable: &str) -> Option<String> {
    if let Some(key) = env(variable).filter(|v| !v.trim().is_empty()) {
        return Some(key);
    }
    match store.get(variable) {
        Ok(key) => key.filter(|k| !k.trim().is_empty()),
        Err(e) => {
            tracing::warn!(variable, "cannot read the stored API key: {e}");
            None
        }
    }
}

fn keyring_entry(variable: &str) -> Result<keyring::Entry, String> {
    keyring::Entry::new(SERVICE, variable).map_err(keyring_error)
}

fn read_entry(entry: &keyring::Entry) -> Result<Option<String>, String> {
    match entry.get_password() {
        Ok(key) => Ok(Some(key)),
        Err(keyring::Error::NoEntry) => Ok(None),
        Err(e) => Err(keyring_error(e)),
    }
}

/// A credential-store error as text; the variants that carry secret bytes are not shown.
fn keyring_error(e: keyring::Error) -> String {
    match e {
        keyring::Error::BadEncoding(_) | keyring::Error::BadDataFormat(..) => {
            "the OS credential store holds a key kin cannot read".into()
        }
        other => format!("OS credential store: {other}"),
    }
}

/// The keys in the credentials file (none when it does not exist). A file others may read, one
/// over the size limit, or one that is not a JSON object of strings is refused, naming the file.
fn read_file(path: &Path) -> Result<BTreeMap<String, String>, String> {
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let meta = file.metadata().map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(format!(
                "{} is readable by others (mode {mode:o}); kin ignores it until you run `chmod 600 {}`",
                path.display(),
                path.display()
            ));
        }
    }
    if meta.len() > FILE_LIMIT {
        return Err(format!("{} is larger than {FILE_LIMIT} bytes; it is not a kin credentials file", path.display()));
    }
    let mut text = String::new();
    file.take(FILE_LIMIT).read_to_string(&mut text).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if text.trim().is_empty() {
        return Ok(BTreeMap::new());
    }
    // The parse error is not shown: it could quote part of a key.
    serde_json::from_str(&text)
        .map_err(|_| format!("{} is not a JSON object of variable names to keys; remove it or fix it", path.display()))
}

/// Writes the keys through a 0600 temp file in the same directory, `fsync`ed and renamed over
/// the old file, then syncs the directory: the old file or the new one, never a torn one.
fn write_file(path: &Path, keys: &BTreeMap<String, String>) -> Result<(), String> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let fail = |what: &str, e: std::io::Error| format!("cannot {what} {}: {e}", path.display());
    std::fs::create_dir_all(dir).map_err(|e| fail("create the directory of", e))?;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let temp = dir.join(format!(".{FILE_NAME}.{}.tmp", uuid::Uuid::new_v4()));
    let result = (|| {
        let mut file = options.open(&temp)?;
        let mut text = serde_json::to_string_pretty(keys).map_err(std::io::Error::other)?;
        text.push('\n');
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&temp, path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    result.map_err(|e| fail("write", e))
}

/// Removes one key from the file (the file goes when it holds no key); whether it was there.
fn remove_from_file(path: &Path, variable: &str) -> Result<bool, String> {
    let mut keys = read_file(path)?;
    if keys.remove(variable).is_none() {
        return Ok(false);
    }
    if keys.is_empty() {
        std::fs::remove_file(path).map_err(|e| format!("cannot remove {}: {e}", path.display()))?;
    } else {
        write_file(path, &keys)?;
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_store(dir: &Path) -> KeyStore {
        KeyStore { backend: Backend::File, file: Some(dir.join("kin").join(FILE_NAME)) }
    }

    #[test]
    fn the_file_store_keeps_keys_readable_only_by_the_owner() {
        let dir = tempfile::tempdir().unwrap();
        let store = file_store(dir.path());
        assert_eq!(store.get("DEEPSEEK_API_KEY").unwrap(), None);
        let stored = store.set("DEEPSEEK_API_KEY", "sk-one").unwrap();
        assert_eq!(stored, Stored::File(dir.path().join("kin").join(FILE_NAME)));
        store.set("OPENAI_API_KEY", "sk-two").unwrap();
        assert_eq!(store.get("DEEPSEEK_API_KEY").unwrap().as_deref(), Some("sk-one"));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(store.file.as_ref().unwrap()).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600);
        }
        assert!(store.delete("DEEPSEEK_API_KEY").unwrap());
        assert!(!store.delete("DEEPSEEK_API_KEY").unwrap());
        assert_eq!(store.get("OPENAI_API_KEY").unwrap().as_deref(), Some("sk-two"));
        assert!(store.delete("OPENAI_API_KEY").unwrap());
        assert!(!store.file.as_ref().unwrap().exists(), "an empty store leaves no file");
    }

    #[cfg(unix)]
    #[test]
    fn a_file_others_can_read_is_refused_without_showing_the_key() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let store = file_store(dir.path());
        store.set("DEEPSEEK_API_KEY", "sk-secret").unwrap();
        let path = store.file.clone().unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = store.get("DEEPSEEK_API_KEY").unwrap_err();
        assert!(err.contains("chmod 600") && !err.contains("sk-secret"), "{err}");
        assert_eq!(lookup(&|_| None, &store, "DEEPSEEK_API_KEY"), None);
    }

    #[test]
    fn a_garbled_file_is_named_and_its_text_not_shown() {
        let dir = tempfile::tempdir().unwrap();
        let store = file_store(dir.path());
        store.set("X", "1").unwrap();
        let path = store.file.clone().unwrap();
        std::fs::write(&path, "{\"DEEPSEEK_API_KEY\": sk-unquoted}").unwrap();
        let err = store.get("DEEPSEEK_API_KEY").unwrap_err();
        assert!(err.contains(FILE_NAME) && !err.contains("sk-unquoted"), "{err}");
    }

    #[test]
    fn the_environment_wins_over_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let store = file_store(dir.path());
        store.set("DEEPSEEK_API_KEY", "sk-stored").unwrap();
        let env = |name: &str| (name == "DEEPSEEK_API_KEY").then(|| "sk-env".to_string());
        assert_eq!(lookup(&env, &store, "DEEPSEEK_API_KEY").as_deref(), Some("sk-env"));
        assert_eq!(lookup(&|_| None, &store, "DEEPSEEK_API_KEY").as_deref(), Some("sk-stored"));
        assert_eq!(lookup(&|_| Some("  ".into()), &store, "DEEPSEEK_API_KEY").as_deref(), Some("sk-stored"));
    }

    #[test]
    fn backends_parse_and_unknown_ones_are_named() {
        assert_eq!(Backend::parse("file"), Ok(Backend::File));
        assert!(Backend::parse("vault").unwrap_err().contains("\"vault\""));
    }
}
