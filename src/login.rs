//! `kin login` and `kin logout`: storing a provider's API key so the editor needs no
//! environment variable. Login asks which provider (the built-ins and each `[providers.NAME]`
//! with an `api_key_env`), reads the key without echo from the terminal (or a line from stdin
//! when it is piped, as tests and scripts do), checks it with one cheap call to the provider
//! (`model::keycheck`, at the base URL kin would use) and stores it (`keys`). An editor runs it
//! as the ACP terminal auth method (`kin acp login`). Prompts and results go to stderr; the key
//! is never printed or logged.

use std::io::{BufRead, IsTerminal, Read, Write};

use crate::config::{Config, process_env};
use crate::model::keycheck::{KeyCheckError, check_key};
use crate::model::router::{endpoint, key_providers};

/// The longest key accepted (and the most read of a piped line).
const KEY_LIMIT: usize = 4096;

/// Why a login or logout did not happen; the message says what to do.
#[derive(Debug)]
pub struct LoginError(pub String);

impl std::fmt::Display for LoginError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn fail(message: impl Into<String>) -> LoginError {
    LoginError(message.into())
}

/// `kin login [PROVIDER] [--no-check]`.
pub async fn login(config: &Config, provider: Option<&str>, check: bool) -> Result<(), LoginError> {
    let providers = key_providers(&config.models);
    let mut err = std::io::stderr();
    let name = match provider {
        Some(name) => name.to_string(),
        None => ask_provider(&providers, &config.model.provider, &mut err)?,
    };
    let variable = variable_of(config, &providers, &name)?;
    let prompt = format!("API key for {name} (input hidden): ");
    let key = read_key(&prompt, &mut err)?;
    if check {
        let (api, server) = endpoint(&name, &config.models, &process_env).map_err(fail)?;
        let _ = writeln!(err, "Checking the key with {} ...", server.base_url.trim_end_matches('/'));
        check_key(api, &server, &key).await.map_err(|e| match e {
            KeyCheckError::Rejected(m) => fail(format!("the key was not stored: {m}")),
            KeyCheckError::Unchecked(m) => fail(format!(
                "the key was not stored: {m} (run `kin login {name} --no-check` to store it without the check)"
            )),
        })?;
    }
    let stored = config.keys.set(&variable, &key).map_err(|e| fail(format!("the key was not stored: {e}")))?;
    let _ = writeln!(err, "Stored the key for {name} ({variable}) in {stored}.");
    if process_env(&variable).is_some() {
        let _ = writeln!(err, "Note: {variable} is set in this environment; kin uses it before the stored key.");
    }
    Ok(())
}

/// `kin logout [PROVIDER]`: removes the provider's stored key, or every provider's.
pub fn logout(config: &Config, provider: Option<&str>) -> Result<(), LoginError> {
    let providers = key_providers(&config.models);
    let targets: Vec<(String, String)> = match provider {
        Some(name) => vec![(name.to_string(), variable_of(config, &providers, name)?)],
        None => providers,
    };
    let mut err = std::io::stderr();
    for (name, variable) in targets {
        let removed =
            config.keys.delete(&variable).map_err(|e| fail(format!("cannot remove the key for {name}: {e}")))?;
        let _ = match removed {
            true => writeln!(err, "Removed the stored key for {name} ({variable})."),
            false => writeln!(err, "No stored key for {name} ({variable})."),
        };
    }
    Ok(())
}

/// The variable a provider's key is read from, or why it takes none.
fn variable_of(config: &Config, providers: &[(String, String)], name: &str) -> Result<String, LoginError> {
    if let Some((_, variable)) = providers.iter().find(|(n, _)| n == name) {
        return Ok(variable.clone());
    }
    if config.models.providers.iter().any(|p| p.name == name) {
        return Err(fail(format!(
            "provider {name} takes no key: [providers.{name}] has no api_key_env (add one to give it a key)"
        )));
    }
    let names: Vec<&str> = providers.iter().map(|(n, _)| n.as_str()).collect();
    Err(fail(format!("unknown provider {name:?}; choose one of: {}", names.join(", "))))
}

/// Asks which provider on stderr and reads the answer (a number or a name; empty picks the
/// configured route's provider) from stdin.
fn ask_provider(providers: &[(String, String)], default: &str, err: &mut impl Write) -> Result<String, LoginError> {
    let _ = writeln!(err, "Which provider is the key for?");
    for (i, (name, variable)) in providers.iter().enumerate() {
        let _ = writeln!(err, "  {}) {name} ({variable})", i + 1);
    }
    let fallback = providers.iter().any(|(n, _)| n == default).then_some(default);
    let _ = match fallback {
        Some(name) => write!(err, "Provider [{name}]: "),
        None => write!(err, "Provider: "),
    };
    let _ = err.flush();
    let line = read_line()?.ok_or_else(|| fail("no provider given: stdin closed before an answer"))?;
    let answer = line.trim();
    if answer.is_empty() {
        return fallback.map(str::to_string).ok_or_else(|| fail("no provider given"));
    }
    if let Ok(n) = answer.parse::<usize>() {
        return providers
            .get(n.wrapping_sub(1))
            .map(|(name, _)| name.clone())
            .ok_or_else(|| fail(format!("no provider number {n}; choose 1 to {}", providers.len())));
    }
    Ok(answer.to_string())
}

/// The key: typed without echo on the terminal, else one line of stdin. Blank, overlong or
/// control-character keys are refused (without showing them).
fn read_key(prompt: &str, err: &mut impl Write) -> Result<String, LoginError> {
    let text = if std::io::stdin().is_terminal() {
        rpassword::prompt_password(prompt).map_err(|e| fail(format!("cannot read the key from the terminal: {e}")))?
    } else {
        let _ = write!(err, "{prompt}");
        let _ = writeln!(err);
        read_line()?.ok_or_else(|| fail("no key given: stdin closed before a key"))?
    };
    let key = text.trim();
    if key.is_empty() {
        return Err(fail("no key given: the key is empty"));
    }
    if key.len() > KEY_LIMIT {
        return Err(fail(format!("the key is longer than {KEY_LIMIT} bytes; check what was pasted")));
    }
    if key.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(fail("the key contains spaces or control characters; check what was pasted"));
    }
    Ok(key.to_string())
}

/// One line of stdin, at most `KEY_LIMIT` + 1 bytes of it; None at EOF.
fn read_line() -> Result<Option<String>, LoginError> {
    let mut line = String::new();
    let read = std::io::stdin()
        .lock()
        .take(KEY_LIMIT as u64 + 1)
        .read_line(&mut line)
        .map_err(|e| fail(format!("cannot read stdin: {e}")))?;
    Ok((read > 0).then_some(line))
}
