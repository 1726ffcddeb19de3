//! `Environment`: one exec-server (embedded, at a URL, or behind a
//! registry) and the calls that are not about one process: starting
//! processes and file operations.

use crate::errors;
use crate::in_runtime;
use crate::process::Process;
use exec_server_client::{ClientOptions, Command, ExecServerClient, PathUri, Source};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

/// The environments of a configuration, by id, and the default id.
type Configured = (Vec<(String, Environment)>, Option<String>);

/// One environment: a client of one exec-server session, connected on
/// first use and recovered after a dropped connection.
#[pyclass(module = "exec_server._native", frozen)]
pub struct Environment {
    id: String,
    client: ExecServerClient,
}

/// A path on the server as the wire names it (`file:///…`); it must be
/// absolute.
fn uri(path: &str) -> PyResult<PathUri> {
    PathUri::from_path(Path::new(path))
        .ok_or_else(|| errors::value(format!("not an absolute path: {path:?}")))
}

/// Seconds (Python `float`) as a duration; negative, NaN or absurd values
/// are refused.
fn seconds(what: &str, s: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(s)
        .map_err(|_| errors::value(format!("{what} must be a non-negative number of seconds")))
}

fn made(id: &str, opts: ClientOptions) -> Environment {
    Environment {
        id: id.into(),
        client: in_runtime(|| ExecServerClient::new(opts)),
    }
}

#[pymethods]
impl Environment {
    /// This machine, through a server embedded in this process.
    #[staticmethod]
    fn local() -> PyResult<Environment> {
        let source = in_runtime(Source::embedded)
            .map_err(|e| errors::local("the embedded exec-server cannot start", e))?;
        Ok(made("local", ClientOptions::new(source)))
    }

    /// A server at `url` (`ws://`, `wss://`, `unix://`), with an optional
    /// bearer `token` and network `policy` (an `async def (request) ->
    /// bool`-like object the Python side wraps).
    #[staticmethod]
    #[pyo3(signature = (url, token=None, policy=None))]
    fn connect(
        url: &str,
        token: Option<String>,
        policy: Option<Py<PyAny>>,
    ) -> PyResult<Environment> {
        let source =
            Source::from_url(url, token).map_err(|e| errors::configuration(e.to_string()))?;
        let mut opts = ClientOptions::new(source);
        if let Some(p) = policy {
            opts.network_policy = Some(crate::network::python_policy(p)?);
        }
        Ok(made(url, opts))
    }

    /// The environment `environment_id` behind the registry at
    /// `registry_url`, reached through its relay with the harness bearer
    /// `token` (end-to-end encrypted, Noise).
    #[staticmethod]
    #[pyo3(signature = (registry_url, environment_id, token, account_id=None))]
    fn remote(
        registry_url: &str,
        environment_id: &str,
        token: &str,
        account_id: Option<String>,
    ) -> PyResult<Environment> {
        let relay = exec_server_client::relay::RelaySource::new(
            registry_url,
            environment_id,
            token,
            account_id,
        )
        .map_err(errors::config)?;
        Ok(made(
            environment_id,
            ClientOptions::new(Source::relay(relay)),
        ))
    }

    /// The environments of an `environments.toml` text (paths in it
    /// relative to `base`), as `(id, Environment)` pairs, and the default
    /// id when it names one.
    #[staticmethod]
    fn from_toml(text: &str, base: &str) -> PyResult<Configured> {
        let envs =
            in_runtime(|| exec_server_client::Environments::from_toml(text, Path::new(base)))
                .map_err(errors::config)?;
        let default = envs.default.clone();
        let all = envs
            .all
            .iter()
            .map(|e| {
                (
                    e.id.clone(),
                    Environment {
                        id: e.id.clone(),
                        client: e.client.clone(),
                    },
                )
            })
            .collect();
        Ok((all, default))
    }

    /// Its id (`local`, the URL, or the environment id).
    #[getter]
    fn id(&self) -> String {
        self.id.clone()
    }

    /// The session id, once connected.
    fn session_id(&self) -> Option<String> {
        self.client.session_id()
    }

    /// How many times a dropped connection was recovered.
    fn recoveries(&self) -> u64 {
        self.client.recoveries()
    }

    /// Starts a process; resolves to a `Process`. Durations are seconds.
    #[pyo3(signature = (argv, cwd, env, inherit_env, pty, stdin, process_id=None,
        timeout=None, idle_timeout=None, max_output=None, memory=None, max_tasks=None,
        cpu_percent=None, kill_on_drop=false, network_proxy=None))]
    #[allow(clippy::too_many_arguments)]
    fn start<'py>(
        &self,
        py: Python<'py>,
        argv: Vec<String>,
        cwd: String,
        env: BTreeMap<String, String>,
        inherit_env: bool,
        pty: Option<(u16, u16)>,
        stdin: bool,
        process_id: Option<String>,
        timeout: Option<f64>,
        idle_timeout: Option<f64>,
        max_output: Option<u64>,
        memory: Option<u64>,
        max_tasks: Option<u64>,
        cpu_percent: Option<u64>,
        kill_on_drop: bool,
        network_proxy: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let Some((program, args)) = argv.split_first() else {
            return Err(errors::value("argv must not be empty"));
        };
        let mut cmd = Command::new(program.clone())
            .args(args.iter().cloned())
            .cwd(&cwd)
            .envs(env)
            .kill_on_drop(kill_on_drop);
        if inherit_env {
            cmd = cmd.inherit_env();
        }
        if let Some((rows, cols)) = pty {
            cmd = cmd.pty(cols, rows);
        }
        if stdin {
            cmd = cmd.stdin_piped();
        }
        if let Some(id) = process_id {
            cmd = cmd.process_id(id);
        }
        if let Some(s) = timeout {
            cmd = cmd.timeout(seconds("timeout", s)?);
        }
        if let Some(s) = idle_timeout {
            cmd = cmd.idle_timeout(seconds("idle_timeout", s)?);
        }
        if let Some(n) = max_output {
            cmd = cmd.max_output(n);
        }
        if let Some(n) = memory {
            cmd = cmd.memory(n);
        }
        if let Some(n) = max_tasks {
            cmd = cmd.max_tasks(n);
        }
        if let Some(n) = cpu_percent {
            cmd = cmd.cpu_percent(n);
        }
        if let Some(text) = network_proxy {
            let config = serde_json::from_str(&text)
                .map_err(|e| errors::value(format!("network_proxy: {e}")))?;
            cmd = cmd.network_proxy(config);
        }
        let client = self.client.clone();
        crate::awaitable(py, async move {
            let handle = cmd.spawn(&client).await.map_err(errors::client)?;
            Ok(Process::new(handle))
        })
    }

    /// A whole file's bytes.
    fn read_file<'py>(&self, py: Python<'py>, path: &str) -> PyResult<Bound<'py, PyAny>> {
        let (client, path) = (self.client.clone(), uri(path)?);
        crate::awaitable(py, async move {
            let data = client.read_file(&path).await.map_err(errors::client)?;
            Ok(crate::attach(|py| PyBytes::new(py, &data).unbind()).await)
        })
    }

    /// Writes a whole file (replaced atomically).
    fn write_file<'py>(
        &self,
        py: Python<'py>,
        path: &str,
        data: Vec<u8>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (client, path) = (self.client.clone(), uri(path)?);
        crate::awaitable(py, async move {
            client.write_file(&path, data).await.map_err(errors::client)
        })
    }

    /// A path's metadata, as JSON text (`isDirectory`, `isFile`,
    /// `isSymlink`, `size`, `createdAtMs`, `modifiedAtMs`).
    fn metadata<'py>(&self, py: Python<'py>, path: &str) -> PyResult<Bound<'py, PyAny>> {
        let (client, path) = (self.client.clone(), uri(path)?);
        crate::awaitable(py, async move {
            let m = client.metadata(&path).await.map_err(errors::client)?;
            serde_json::to_string(&m).map_err(|e| errors::value(e.to_string()))
        })
    }

    /// A directory's entries, as JSON text (a list of `fileName`,
    /// `isDirectory`, `isFile`).
    fn list_dir<'py>(&self, py: Python<'py>, path: &str) -> PyResult<Bound<'py, PyAny>> {
        let (client, path) = (self.client.clone(), uri(path)?);
        crate::awaitable(py, async move {
            let entries = client.read_directory(&path).await.map_err(errors::client)?;
            serde_json::to_string(&entries).map_err(|e| errors::value(e.to_string()))
        })
    }

    /// Makes a directory (and its parents when `parents`).
    fn mkdir<'py>(
        &self,
        py: Python<'py>,
        path: &str,
        parents: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (client, path) = (self.client.clone(), uri(path)?);
        crate::awaitable(py, async move {
            client
                .create_directory(&path, parents)
                .await
                .map_err(errors::client)
        })
    }

    /// Removes a file or (with `recursive`) a tree; `force` ignores a
    /// missing path.
    fn remove<'py>(
        &self,
        py: Python<'py>,
        path: &str,
        recursive: bool,
        force: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (client, path) = (self.client.clone(), uri(path)?);
        crate::awaitable(py, async move {
            client
                .remove(&path, recursive, force)
                .await
                .map_err(errors::client)
        })
    }

    /// Copies a file or (with `recursive`) a tree on the server.
    fn copy<'py>(
        &self,
        py: Python<'py>,
        src: &str,
        dst: &str,
        recursive: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (client, src, dst) = (self.client.clone(), uri(src)?, uri(dst)?);
        crate::awaitable(py, async move {
            client
                .copy(&src, &dst, recursive)
                .await
                .map_err(errors::client)
        })
    }

    /// Uploads the local file `local` to `remote`; resolves to the bytes sent.
    fn upload<'py>(
        &self,
        py: Python<'py>,
        local: String,
        remote: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (client, remote) = (self.client.clone(), uri(remote)?);
        crate::awaitable(py, async move {
            let file = std::fs::File::open(&local).map_err(|e| errors::local(&local, e))?;
            client
                .upload_from_file(file, &remote, |_| {})
                .await
                .map_err(errors::client)
        })
    }

    /// Downloads `remote` into the local file `local` (created or
    /// truncated); resolves to the bytes written.
    fn download<'py>(
        &self,
        py: Python<'py>,
        remote: &str,
        local: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (client, remote) = (self.client.clone(), uri(remote)?);
        crate::awaitable(py, async move {
            let file = std::fs::File::create(&local).map_err(|e| errors::local(&local, e))?;
            client
                .download_to_file(&remote, file, |_| {})
                .await
                .map_err(errors::client)
        })
    }

    /// `http/request` made by the server: resolves to `(status, headers,
    /// body, stream)`: the whole body, or (with `stream`) an empty body and
    /// an `HttpBody` to read it from as it arrives.
    #[pyo3(signature = (method, url, headers, body=None, timeout=None, stream=false, follow_redirects=true))]
    #[allow(clippy::too_many_arguments)]
    fn http_request<'py>(
        &self,
        py: Python<'py>,
        method: String,
        url: String,
        headers: Vec<(String, String)>,
        body: Option<Vec<u8>>,
        timeout: Option<f64>,
        stream: bool,
        follow_redirects: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let timeout_ms = match timeout {
            Some(s) => Some(u64::try_from(seconds("timeout", s)?.as_millis()).unwrap_or(u64::MAX)),
            None => None,
        };
        let client = self.client.clone();
        let params = exec_server_client::protocol::HttpRequestParams {
            method,
            url,
            request_id: format!("py-{}", client.next_process_id()),
            headers: headers
                .into_iter()
                .map(|(name, value)| exec_server_client::protocol::HttpHeader {
                    name,
                    value,
                    value_env_var: None,
                })
                .collect(),
            body_base64: body.map(|b| exec_server_client::protocol::ByteChunk(b.into())),
            timeout_ms,
            redirect_policy: match follow_redirects {
                true => exec_server_client::protocol::RedirectPolicy::Follow,
                false => exec_server_client::protocol::RedirectPolicy::Stop,
            },
            stream_response: stream,
        };
        crate::awaitable(py, async move {
            let (response, deltas) = client.http_request(params).await.map_err(errors::client)?;
            let headers: Vec<(String, String)> = response
                .headers
                .into_iter()
                .map(|h| (h.name, h.value))
                .collect();
            crate::attach(|py| {
                let body = PyBytes::new(py, &response.body_base64.0).unbind();
                let stream = deltas.map(crate::process::HttpBody::new);
                Ok((response.status, headers, body, stream))
            })
            .await
        })
    }

    /// Watches `path` (a tree with `recursive`); resolves to a `FileWatch`.
    fn watch<'py>(
        &self,
        py: Python<'py>,
        path: &str,
        recursive: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (client, path) = (self.client.clone(), uri(path)?);
        crate::awaitable(py, async move {
            let w = client
                .watch(&path, recursive)
                .await
                .map_err(errors::client)?;
            Ok(crate::process::FileWatch::new(w))
        })
    }

    /// The server's `environment/info`, as JSON text.
    fn info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let client = self.client.clone();
        crate::awaitable(py, async move {
            let info = client.environment_info().await.map_err(errors::client)?;
            serde_json::to_string(&info).map_err(|e| errors::value(e.to_string()))
        })
    }

    /// Drops the current connection (the session stays on the server and
    /// is resumed by the next call): for tests of recovery.
    fn drop_connection<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let client = self.client.clone();
        crate::awaitable(py, async move {
            client.drop_connection().await;
            Ok(())
        })
    }

    /// Closes the client: its session ends on the server.
    fn close<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let client = self.client.clone();
        crate::awaitable(py, async move {
            client.close().await;
            Ok(())
        })
    }
}
