//! The integration tests that start the real binary (one program; see
//! `autotests` in Cargo.toml). Each module is one area; `common` holds the
//! shared helpers (servers on loopback, connections, temporary directories).

mod common;

mod caps;
mod chaos;
mod cli;
mod client;
mod client_scripted;
mod daemons;
mod field_cases;
mod field_cases_exit;
mod fleet;
mod fs_fuzz;
mod fs_http;
mod fs_safety;
mod hostile;
mod limits;
mod managed_network;
mod net_safety;
mod ops;
mod reliability;
mod remote_mode;
mod sandbox;
mod sandbox_deny;
mod sandbox_env;
mod sandbox_escapes;
mod sandbox_fs;
mod sandbox_links;
mod sandbox_terminal;
mod sandbox_warm;
mod shell_snapshot;
mod tracing_otlp;
mod transports;
mod upgrade;
