//! `environmentConfig/read`, `capabilities/discoverV2` and
//! `capabilityRoots/discoverV1`: reading configuration and manifests from disk.

use crate::error::{ErrorKind, ExecError, ExecResult};
use exec_server_protocol::types::*;
use exec_server_protocol::PathUri;
use std::path::{Path, PathBuf};

/// Plugin manifest locations inside a root, in the order they are tried.
pub const PLUGIN_MANIFESTS: &[&str] = &[
    ".codex-plugin/plugin.json",
    ".claude-plugin/plugin.json",
    ".cursor-plugin/plugin.json",
];

/// Requirements file read by `environmentConfig/read`.
pub const SYSTEM_REQUIREMENTS_FILE: &str = "/etc/codex/requirements.toml";

fn codex_home() -> Option<PathBuf> {
    std::env::var_os("CODEX_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".codex")))
}

fn select_keys(doc: &toml::Table, paths: &[Vec<String>]) -> toml::Table {
    let mut out = toml::Table::new();
    for path in paths {
        let mut src = doc;
        let mut found = None;
        for (i, key) in path.iter().enumerate() {
            match src.get(key) {
                Some(v) if i + 1 == path.len() => found = Some(v.clone()),
                Some(toml::Value::Table(t)) => src = t,
                _ => break,
            }
        }
        let Some(value) = found else { continue };
        insert_at(&mut out, path, value);
    }
    out
}

fn insert_at(table: &mut toml::Table, path: &[String], value: toml::Value) {
    match path {
        [] => {}
        [last] => {
            table.insert(last.clone(), value);
        }
        [first, rest @ ..] => {
            let entry = table
                .entry(first.clone())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            if let toml::Value::Table(t) = entry {
                insert_at(t, rest, value);
            }
        }
    }
}

fn layer(kind: &str, file: &Path, paths: &[Vec<String>]) -> ExecResult<Option<ConfigLayer>> {
    if paths.is_empty() {
        return Ok(None);
    }
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(
                ExecError::new(ErrorKind::Io, format!("{}: {e}", file.display())).with_source(e),
            )
        }
    };
    let doc: toml::Table = text.parse().map_err(|e| {
        ExecError::failed(format!("{} is not valid TOML: {e}", file.display())).with_source(e)
    })?;
    let selected = select_keys(&doc, paths);
    let toml =
        toml::to_string(&selected).map_err(|e| ExecError::failed(e.to_string()).with_source(e))?;
    let dir = file.parent().unwrap_or(Path::new("/"));
    Ok(Some(ConfigLayer {
        source: format!("{kind} ({})", file.display()),
        base_dir: PathUri::from_path(dir)
            .ok_or_else(|| ExecError::failed("config dir has no URI"))?,
        toml,
    }))
}

/// `environmentConfig/read`.
pub fn environment_config_read(
    p: &EnvironmentConfigReadParams,
) -> ExecResult<EnvironmentConfigReadResponse> {
    if p.config_paths.is_empty() && p.requirements_paths.is_empty() {
        return Err(ExecError::invalid_params(
            "at least one config or requirements path is required",
        ));
    }
    if p.config_paths
        .iter()
        .chain(&p.requirements_paths)
        .any(|k| k.is_empty())
    {
        return Err(ExecError::invalid_params(
            "TOML paths must contain at least one key segment",
        ));
    }
    let home = codex_home();
    let config = match &home {
        Some(h) => layer("user", &h.join("config.toml"), &p.config_paths)?,
        None => None,
    };
    let requirements = layer(
        "system",
        Path::new(SYSTEM_REQUIREMENTS_FILE),
        &p.requirements_paths,
    )?;
    Ok(EnvironmentConfigReadResponse {
        user_home_dir: std::env::var_os("HOME").and_then(|h| PathUri::from_path(Path::new(&h))),
        codex_home_dir: home.as_deref().and_then(PathUri::from_path),
        hostname: nix::unistd::gethostname()
            .map(|h| h.to_string_lossy().into_owned())
            .unwrap_or_default(),
        config: ConfigLayers {
            layers: config.into_iter().collect(),
            cloud_insertion_index: 0,
        },
        requirements: ConfigLayers {
            layers: requirements.into_iter().collect(),
            cloud_insertion_index: 0,
        },
    })
}

/// `capabilities/discoverV2`: skills under `<cwd>/.codex/skills/*/SKILL.md`.
pub fn discover_v2(p: &DiscoverV2Params) -> ExecResult<DiscoverV2Response> {
    let cwd = p.cwd.to_path().map_err(ExecError::invalid_params)?;
    let mut warnings = Vec::new();
    let skills = skills_in(&cwd.join(".codex").join("skills"), true, &mut warnings)
        .into_iter()
        .filter_map(|s| serde_json::to_value(s).ok())
        .collect();
    Ok(DiscoverV2Response {
        plugins: Vec::new(),
        skills,
        warnings,
    })
}

/// Skills in the subdirectories of `dir`; `metadata`: parse their front matter
/// (`capabilities/discoverV2`) or leave it `null` (`capabilityRoots/discoverV1`,
/// as the reference).
fn skills_in(dir: &Path, metadata: bool, warnings: &mut Vec<String>) -> Vec<SkillFound> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    let mut dirs: Vec<_> = rd
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    for d in dirs {
        let f = d.join("SKILL.md");
        match std::fs::read_to_string(&f) {
            Ok(contents) => {
                if let Some(path) = PathUri::from_path(&f) {
                    out.push(SkillFound {
                        metadata: front_matter(&contents).filter(|_| metadata),
                        instructions: FileContents { path, contents },
                    });
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => warnings.push(format!("{}: {e}", f.display())),
        }
    }
    out
}

/// `---`-delimited front matter of a SKILL.md as simple `key: value` pairs.
fn front_matter(text: &str) -> Option<serde_json::Value> {
    let rest = text.strip_prefix("---\n")?;
    let end = rest.find("\n---")?;
    let mut map = serde_json::Map::new();
    for line in rest[..end].lines() {
        if let Some((k, v)) = line.split_once(':') {
            map.insert(
                k.trim().to_string(),
                serde_json::Value::String(v.trim().trim_matches('"').to_string()),
            );
        }
    }
    Some(serde_json::Value::Object(map))
}

fn read_json(path: &Path, warnings: &mut Vec<String>) -> Option<serde_json::Value> {
    let text = std::fs::read_to_string(path).ok()?;
    match serde_json::from_str(&text) {
        Ok(v) => Some(v),
        Err(e) => {
            warnings.push(format!("{}: {e}", path.display()));
            None
        }
    }
}

/// `capabilityRoots/discoverV1`: plugin manifests and skills in each root.
pub fn roots_discover_v1(p: &RootsDiscoverParams) -> ExecResult<RootsDiscoverResponse> {
    let mut roots = Vec::new();
    for r in &p.roots {
        let mut out = RootDiscovery {
            id: r.id.clone(),
            path: r.path.clone(),
            plugin: None,
            skills: Vec::new(),
            namespace_manifests: Vec::new(),
            warnings: Vec::new(),
            error: None,
        };
        let dir = match r.path.to_path() {
            Ok(d) => d,
            Err(e) => {
                out.error = Some(e);
                roots.push(out);
                continue;
            }
        };
        match std::fs::read_dir(&dir) {
            Ok(_) => {}
            // A root the sandbox (or the OS) keeps us out of is scanned as
            // empty with a warning, as the reference does under a deny policy.
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                out.warnings
                    .push(format!("failed to scan capability path {}: {e}", r.path));
                roots.push(out);
                continue;
            }
            Err(e) => {
                out.error = Some(e.to_string());
                roots.push(out);
                continue;
            }
        }
        for m in PLUGIN_MANIFESTS {
            let path = dir.join(m);
            if let Some(manifest) = read_json(&path, &mut out.warnings) {
                out.plugin = Some(PluginFound {
                    manifest,
                    mcp_config: read_json(&dir.join(".mcp.json"), &mut out.warnings),
                    apps_config: read_json(&dir.join(".app.json"), &mut out.warnings),
                });
                break;
            }
        }
        let root_skill = dir.join("SKILL.md");
        if let Ok(contents) = std::fs::read_to_string(&root_skill) {
            if let Some(path) = PathUri::from_path(&root_skill) {
                out.skills.push(SkillFound {
                    metadata: None,
                    instructions: FileContents { path, contents },
                });
            }
        }
        let mut warnings = std::mem::take(&mut out.warnings);
        out.skills
            .extend(skills_in(&dir.join("skills"), false, &mut warnings));
        out.warnings = warnings;
        roots.push(out);
    }
    Ok(RootsDiscoverResponse { roots })
}
