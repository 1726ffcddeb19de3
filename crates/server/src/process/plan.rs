//! The launch plan: what `process/start` decided, in one typed value that the
//! process module carries out. The handler turns the wire params into a plan
//! (the child's environment built once, the sandbox decided, the network
//! proxy started, the shell snapshot applied); [`super::Process::spawn`]
//! and [`super::spawn::start`] only execute it.

use crate::sandbox::StartSandbox;
use exec_server_protocol::types::{EnvPolicy, ExecParams, ProcessLimits, PtySize};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

/// How the child's standard streams are connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Io {
    /// stdout and stderr on pipes; stdin on a pipe when `stdin`, else
    /// `/dev/null`.
    Pipes {
        /// `pipeStdin`.
        stdin: bool,
    },
    /// All three on a new PTY of this size (the child leads a new session
    /// with it as its controlling terminal).
    Pty(PtySize),
}

/// What is executed: program, arguments, directory, environment, streams.
/// Cheap to derive from (a shell snapshot's capture runs a variant of it).
#[derive(Debug, Clone)]
pub struct Exec {
    /// The command; `argv[0]` is looked up in `env`'s `PATH` (then the
    /// default path) unless it contains a `/`. Never empty.
    pub argv: Vec<String>,
    /// What the program sees as its `argv[0]`, when not `argv[0]`.
    pub arg0: Option<String>,
    /// The native working directory.
    pub cwd: PathBuf,
    /// The child's whole environment: the request's `env` over its
    /// `envPolicy` applied to the server's, with the proxy's variables,
    /// masking and a snapshot's state already in.
    pub env: BTreeMap<String, String>,
    /// Pipes or a PTY.
    pub io: Io,
}

impl Exec {
    /// The plan's executable part for wire params `p`, in `cwd`, with the
    /// environment `env` (built by [`super::spawn::build_env`]).
    pub fn of(p: &ExecParams, cwd: PathBuf, env: BTreeMap<String, String>) -> Exec {
        Exec {
            argv: p.argv.clone(),
            arg0: p.arg0.clone(),
            cwd,
            env,
            io: match p.tty {
                true => Io::Pty(p.pty_size.unwrap_or(super::spawn::DEFAULT_PTY_SIZE)),
                false => Io::Pipes {
                    stdin: p.pipe_stdin,
                },
            },
        }
    }

    /// True on a PTY.
    pub fn tty(&self) -> bool {
        matches!(self.io, Io::Pty(_))
    }
}

/// Everything one `process/start` runs with.
pub struct LaunchPlan {
    /// `processId`.
    pub process_id: String,
    /// What is executed.
    pub exec: Exec,
    /// The sandbox, when the start is confined.
    pub confinement: Option<StartSandbox>,
    /// The effective limits (the request's over the server's defaults,
    /// under its maxima).
    pub limits: Option<ProcessLimits>,
    /// `ackOutput`: output is kept until acknowledged.
    pub ack_output: bool,
    /// `outputWindowBytes`: with `ack_output`, the window the client asked
    /// for (brought within the server's bounds by the output log).
    pub output_window_bytes: Option<u64>,
    /// Kept alive until the process closes (its network proxy).
    pub kept: Vec<super::KeptUntilClosed>,
    /// What `process/list` shows: the request as the client sent it.
    pub shown: super::list::StartedWith,
}

/// Adds the network proxy's variables `vars` to a built environment `env`
/// as the request would have had them: over everything when the
/// environment is masked (`masked`) or has no policy; otherwise as members
/// of the policy's `set` (so the request's own `env` still wins, and an
/// `includeOnly` list still filters them).
pub fn add_proxy_vars(
    env: &mut BTreeMap<String, String>,
    vars: Vec<(String, String)>,
    request_env: &BTreeMap<String, String>,
    policy: Option<&EnvPolicy>,
    masked: bool,
) {
    for (k, v) in vars {
        let kept_by_policy = match policy {
            Some(_) if masked => true,
            None => true,
            Some(policy) => {
                !request_env.contains_key(&k)
                    && (policy.include_only.is_empty()
                        || policy
                            .include_only
                            .iter()
                            .any(|p| super::spawn::wildcard_match(p, &k)))
            }
        };
        if kept_by_policy {
            env.insert(k, v);
        }
    }
}

/// The variables a shell snapshot leaves as they are (it may still extend
/// them): those the request names (its `env` and its policy's `set`), the
/// server's own per-process ones (`volatile`), and, when the environment is
/// masked, every variable it had, so a startup file cannot put a secret
/// back over its placeholder.
pub fn named_by_request(
    p: &ExecParams,
    env: &BTreeMap<String, String>,
    volatile: &BTreeSet<String>,
    masked: bool,
) -> BTreeSet<String> {
    let mut named: BTreeSet<String> = p
        .env
        .keys()
        .chain(p.env_policy.iter().flat_map(|p| p.set.keys()))
        .chain(volatile)
        .cloned()
        .collect();
    if masked {
        named.extend(env.keys().cloned());
    }
    named
}

#[cfg(test)]
mod tests {
    use super::*;
    use exec_server_protocol::types::EnvInherit;

    fn policy(include_only: &[&str]) -> EnvPolicy {
        EnvPolicy {
            inherit: EnvInherit::None,
            ignore_default_excludes: false,
            exclude: Vec::new(),
            set: BTreeMap::new(),
            include_only: include_only.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn vars() -> Vec<(String, String)> {
        vec![
            ("HTTP_PROXY".into(), "http://proxy".into()),
            ("OWN".into(), "proxy".into()),
        ]
    }

    #[test]
    fn proxy_variables_join_as_the_request_would_have_had_them() {
        let request = BTreeMap::from([("OWN".to_string(), "request".to_string())]);
        // No policy: the proxy's values win.
        let mut env = request.clone();
        add_proxy_vars(&mut env, vars(), &request, None, false);
        assert_eq!(env["OWN"], "proxy");
        assert_eq!(env["HTTP_PROXY"], "http://proxy");
        // A policy: as members of its `set`, under the request's `env` and
        // filtered by `includeOnly`.
        let mut env = request.clone();
        add_proxy_vars(&mut env, vars(), &request, Some(&policy(&["OWN"])), false);
        assert_eq!(env["OWN"], "request");
        assert!(!env.contains_key("HTTP_PROXY"));
        let mut env = request.clone();
        add_proxy_vars(&mut env, vars(), &request, Some(&policy(&[])), false);
        assert_eq!(env["HTTP_PROXY"], "http://proxy");
        // Masked: over everything.
        let mut env = request.clone();
        add_proxy_vars(&mut env, vars(), &request, Some(&policy(&["X"])), true);
        assert_eq!(env["OWN"], "proxy");
        assert_eq!(env["HTTP_PROXY"], "http://proxy");
    }
}
