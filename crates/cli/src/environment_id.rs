//! `--environment-id` / `--environment` values: trimmed (as the reference
//! trims), then held to the environment id rule (`[A-Za-z0-9_-]{1,256}`,
//! `exec_server_relay::environment_id`). A bad id is refused while the
//! arguments are parsed, with a message that does not repeat it (it may hold
//! control or bidirectional characters).

use clap::builder::TypedValueParser;
use exec_server_relay::environment_id::validate;

/// Parses an environment id argument.
#[derive(Clone, Copy, Debug, Default)]
pub struct EnvironmentIdParser;

impl TypedValueParser for EnvironmentIdParser {
    type Value = String;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<String, clap::Error> {
        let text = value.to_string_lossy();
        let id = text.trim();
        validate(id).map(|()| id.to_string()).map_err(|e| {
            let flag = arg.map_or_else(|| "the environment id".to_string(), |a| a.to_string());
            clap::Error::raw(
                clap::error::ErrorKind::ValueValidation,
                format!("invalid value for '{flag}': {e}\n"),
            )
            .with_cmd(cmd)
        })
    }
}
