//! The `Environment` abstraction: where a harness's tools run. Each environment
//! offers processes, files and HTTP through one [`ExecServerClient`]; `local` runs
//! them on this machine with an in-process server (no socket, no network: the same
//! code and semantics as a remote server), `remote` through a server by URL or a
//! `program` spoken to over stdio.
//!
//! Configuration, in priority order (the Codex CLI's own order):
//! 1. `environments.toml` at `$EXEC_SERVER_ENVIRONMENTS`, or `$CODEX_HOME/environments.toml`
//!    (default `~/.codex/environments.toml`) when that file exists;
//! 2. else `EXEC_SERVER_URL` (or `CODEX_EXEC_SERVER_URL`): a `ws://`/`wss://`/`unix://`
//!    URL gives one `remote` environment and no local one; `none` gives none;
//! 3. else one `local` environment.

use crate::client::{ClientOptions, ExecServerClient};
use crate::connect::Source;
use crate::error::ConfigError;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Reserved id of the local environment.
pub const LOCAL_ID: &str = "local";

/// One environment.
#[derive(Clone)]
pub struct Environment {
    /// Its id (`local` for the local one).
    pub id: String,
    /// The client its tools go through.
    pub client: ExecServerClient,
}

impl Environment {
    /// This machine, through an in-process server. Errors: the server cannot
    /// start, (`Other`) no Tokio runtime is running on this thread, or
    /// (`Unsupported`) this build lacks the `embedded` feature. Never panics.
    pub fn local() -> std::io::Result<Environment> {
        Ok(Environment {
            id: LOCAL_ID.into(),
            client: ExecServerClient::new(ClientOptions::new(local_source()?)),
        })
    }

    /// A remote server at `url` (`ws://`, `wss://` or `unix://`). Errors:
    /// any other scheme.
    pub fn remote(id: &str, url: &str, token: Option<String>) -> Result<Environment, ConfigError> {
        Ok(Environment {
            id: id.into(),
            client: ExecServerClient::new(ClientOptions::new(source_from_url(url, token)?)),
        })
    }

    /// True for the local environment.
    pub fn is_local(&self) -> bool {
        self.id == LOCAL_ID
    }
}

fn source_from_url(url: &str, token: Option<String>) -> Result<Source, ConfigError> {
    Source::from_url(url, token).map_err(|e| ConfigError::new(e.to_string()).with_source(e))
}

/// The local environment, for a configuration that includes it.
fn local_for_config() -> Result<Environment, ConfigError> {
    Environment::local().map_err(|e| {
        ConfigError::new(format!("the local environment cannot start: {e}")).with_source(e)
    })
}

#[cfg(feature = "embedded")]
fn local_source() -> std::io::Result<Source> {
    Source::embedded()
}

#[cfg(not(feature = "embedded"))]
fn local_source() -> std::io::Result<Source> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "no local environment: exec-server-client was built without the `embedded` feature",
    ))
}

/// The configured environments and the default one.
pub struct Environments {
    /// All environments, `local` first when included.
    pub all: Vec<Environment>,
    /// Id of the default environment (`None`: tools disabled).
    pub default: Option<String>,
}

impl Environments {
    /// The default environment.
    pub fn default_environment(&self) -> Option<&Environment> {
        let id = self.default.as_deref()?;
        self.all.iter().find(|e| e.id == id)
    }

    /// Reads the configuration from the process environment and files.
    /// Errors: an unreadable or invalid `environments.toml` (named), a URL
    /// of an unknown scheme, or a local environment that cannot start.
    pub fn from_env() -> Result<Environments, ConfigError> {
        let file = std::env::var_os("EXEC_SERVER_ENVIRONMENTS")
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("CODEX_HOME")
                    .map(PathBuf::from)
                    .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".codex")))
                    .map(|h| h.join("environments.toml"))
            });
        if let Some(f) = file.filter(|f| f.exists()) {
            let text = std::fs::read_to_string(&f)
                .map_err(|e| ConfigError::new(format!("{}: {e}", f.display())).with_source(e))?;
            let base = f.parent().unwrap_or(Path::new("."));
            return Self::from_toml(&text, base).map_err(|e| e.context(f.display()));
        }
        let url = std::env::var("EXEC_SERVER_URL")
            .or_else(|_| std::env::var("CODEX_EXEC_SERVER_URL"))
            .ok();
        let token = std::env::var("EXEC_SERVER_TOKEN").ok();
        match url.as_deref().map(str::trim) {
            None | Some("") => Ok(Environments {
                all: vec![local_for_config()?],
                default: Some(LOCAL_ID.into()),
            }),
            Some(u) if u.eq_ignore_ascii_case("none") => Ok(Environments {
                all: vec![],
                default: None,
            }),
            Some(u) => Ok(Environments {
                all: vec![Environment::remote("remote", u, token)?],
                default: Some("remote".into()),
            }),
        }
    }

    /// Parses an `environments.toml` (unknown keys rejected); relative `cwd`s are
    /// taken from `base`. Errors name the entry and the key at fault.
    pub fn from_toml(text: &str, base: &Path) -> Result<Environments, ConfigError> {
        let file: TomlFile =
            toml::from_str(text).map_err(|e| ConfigError::new(e.to_string()).with_source(e))?;
        let mut all = Vec::new();
        if file.include_local.unwrap_or(true) {
            all.push(local_for_config()?);
        }
        for e in &file.environments {
            validate_id(&e.id)?;
            if all.iter().any(|x: &Environment| x.id == e.id) {
                return Err(ConfigError::new(format!(
                    "duplicate environment id `{}`",
                    e.id
                )));
            }
            let source = match (&e.url, &e.program) {
                (Some(url), None) => {
                    if e.args.is_some() || e.env.is_some() || e.cwd.is_some() {
                        return Err(ConfigError::new(format!(
                            "environment `{}`: args, env and cwd need `program`",
                            e.id
                        )));
                    }
                    let url = url.trim();
                    if !(url.starts_with("ws://") || url.starts_with("wss://")) {
                        return Err(ConfigError::new(format!(
                            "environment `{}`: url must start with ws:// or wss://",
                            e.id
                        )));
                    }
                    source_from_url(url, e.auth_bearer_token.clone())?
                }
                (None, Some(program)) => {
                    if e.connect_timeout_sec.is_some() {
                        return Err(ConfigError::new(format!(
                            "environment `{}`: connect_timeout_sec needs `url`",
                            e.id
                        )));
                    }
                    let program = program.trim();
                    if program.is_empty() {
                        return Err(ConfigError::new(format!(
                            "environment `{}`: program is empty",
                            e.id
                        )));
                    }
                    Source::Program {
                        program: program.into(),
                        args: e.args.clone().unwrap_or_default(),
                        env: e.env.clone().unwrap_or_default().into_iter().collect(),
                        cwd: e.cwd.as_ref().map(|c| base.join(c)),
                    }
                }
                _ => {
                    return Err(ConfigError::new(format!(
                        "environment `{}` needs exactly one of url and program",
                        e.id
                    )))
                }
            };
            let mut opts = ClientOptions::new(source);
            if let Some(s) = e.connect_timeout_sec {
                opts.connect_timeout = Duration::from_secs_f64(s.max(0.0));
            }
            if let Some(s) = e.initialize_timeout_sec {
                opts.connect_timeout = opts
                    .connect_timeout
                    .max(Duration::from_secs_f64(s.max(0.0)));
            }
            all.push(Environment {
                id: e.id.clone(),
                client: ExecServerClient::new(opts),
            });
        }
        let default = match file.default.as_deref() {
            Some(d) if d.eq_ignore_ascii_case("none") => None,
            Some(d) => {
                if !all.iter().any(|e| e.id == d) {
                    return Err(ConfigError::new(format!(
                        "default environment `{d}` is not configured"
                    )));
                }
                Some(d.to_string())
            }
            None if file.include_local.unwrap_or(true) => Some(LOCAL_ID.into()),
            None => None,
        };
        Ok(Environments { all, default })
    }
}

fn validate_id(id: &str) -> Result<(), ConfigError> {
    if id.is_empty() || id.len() > 64 || id.trim() != id {
        return Err(ConfigError::new(format!(
            "environment id `{id}` must be 1 to 64 characters without surrounding spaces"
        )));
    }
    if !id
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return Err(ConfigError::new(format!(
            "environment id `{id}` may only use A-Z, a-z, 0-9, _ and -"
        )));
    }
    if id.eq_ignore_ascii_case(LOCAL_ID) || id.eq_ignore_ascii_case("none") {
        return Err(ConfigError::new(format!(
            "environment id `{id}` is reserved"
        )));
    }
    Ok(())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TomlFile {
    default: Option<String>,
    include_local: Option<bool>,
    #[serde(default)]
    environments: Vec<TomlEnvironment>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TomlEnvironment {
    id: String,
    url: Option<String>,
    auth_bearer_token: Option<String>,
    connect_timeout_sec: Option<f64>,
    initialize_timeout_sec: Option<f64>,
    program: Option<String>,
    args: Option<Vec<String>>,
    env: Option<std::collections::BTreeMap<String, String>>,
    cwd: Option<PathBuf>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_outside_a_runtime_is_an_error() {
        let e = Environment::local()
            .err()
            .expect("no runtime, no local environment");
        assert!(
            matches!(
                e.kind(),
                std::io::ErrorKind::Other | std::io::ErrorKind::Unsupported
            ),
            "{e}"
        );
    }

    #[tokio::test]
    async fn toml_rules() {
        let ok = r#"
default = "devbox"
[[environments]]
id = "devbox"
url = "ws://127.0.0.1:8765"
[[environments]]
id = "ssh-dev"
program = "ssh"
args = ["dev", "exec-server --listen stdio"]
"#;
        let e = Environments::from_toml(ok, Path::new("/tmp")).unwrap();
        assert_eq!(
            e.all.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(),
            ["local", "devbox", "ssh-dev"]
        );
        assert_eq!(e.default.as_deref(), Some("devbox"));
        let bad = [
            "[[environments]]\nid = \"local\"\nurl = \"ws://x:1\"",
            "[[environments]]\nid = \"a b\"\nurl = \"ws://x:1\"",
            "[[environments]]\nid = \"a\"\nurl = \"http://x:1\"",
            "[[environments]]\nid = \"a\"\nurl = \"ws://x:1\"\nprogram = \"p\"",
            "[[environments]]\nid = \"a\"\nurl = \"ws://x:1\"\nargs = []",
            "[[environments]]\nid = \"a\"\nprogram = \"p\"\nconnect_timeout_sec = 1.0",
            "default = \"nope\"",
            "include_local = false\ndefault = \"local\"",
            "surprise = 1",
        ];
        for b in bad {
            assert!(
                Environments::from_toml(b, Path::new("/tmp")).is_err(),
                "accepted: {b}"
            );
        }
        let none = Environments::from_toml("default = \"NONE\"", Path::new("/tmp")).unwrap();
        assert!(none.default_environment().is_none());
    }
}
