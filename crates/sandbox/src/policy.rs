//! The policy as this crate sees it: plain paths and kinds, no wire types.
//! The server converts the protocol's `FileSystemSandboxContext` into a
//! [`Policy`] (URIs to paths, `none` to [`Access::Deny`], `current_working_directory`
//! to [`Target::WorkspaceRoots`]).

use std::path::PathBuf;

/// What an entry grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Readable.
    Read,
    /// Readable and writable.
    Write,
    /// Neither (reads fail with `Permission denied`).
    Deny,
}

/// What an entry names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// One absolute path.
    Path(PathBuf),
    /// A glob (`*`, `?`, `[..]`, `**`); relative patterns are relative to the policy cwd.
    /// Expanded once when the view is built, at most [`crate::MAX_GLOB_MATCHES`] matches.
    Glob(String),
    /// The whole file system.
    Root,
    /// Platform basics: [`crate::MINIMAL_ROOTS`].
    Minimal,
    /// Each workspace root, with `subpath` appended when given.
    WorkspaceRoots {
        /// Relative path appended to each root.
        subpath: Option<PathBuf>,
    },
    /// The child's `TMPDIR`.
    Tmpdir,
    /// `/tmp`.
    SlashTmp,
    /// A kind this crate does not know: grants nothing.
    Ignored,
}

/// One entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// What it names.
    pub target: Target,
    /// What it grants.
    pub access: Access,
}

/// The file-system part of a managed profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileSystem {
    /// Full disk write.
    Unrestricted,
    /// Only what the rules grant.
    Restricted(Vec<Rule>),
}

/// The permission profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Profile {
    /// No restriction at all.
    Disabled,
    /// The caller is sandboxed already: only the network applies.
    External {
        /// True: no network.
        network_restricted: bool,
    },
    /// Confine the file system and the network.
    Managed {
        /// File system.
        fs: FileSystem,
        /// True: no network.
        network_restricted: bool,
    },
}

/// A complete policy for one child.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// The profile.
    pub profile: Profile,
    /// `useLegacyLandlock`: refused with a restricted file system (as the reference).
    pub legacy_landlock: bool,
    /// The policy cwd (base of relative globs).
    pub cwd: PathBuf,
    /// What [`Target::WorkspaceRoots`] expands to.
    pub workspace_roots: Vec<PathBuf>,
    /// The child's `TMPDIR`, if any.
    pub tmpdir: Option<PathBuf>,
}

impl Policy {
    /// True when the whole file system is readable and nothing is denied, so a
    /// read needs no confinement.
    pub fn reads_everything(&self) -> bool {
        self.root_grants(|a| a != Access::Deny)
    }

    /// True when every path is writable and nothing is denied, so no operation
    /// needs file-system confinement.
    pub fn writes_everything(&self) -> bool {
        self.root_grants(|a| a == Access::Write)
    }

    /// True when the profile confines nothing, or when a root entry's access
    /// satisfies `enough` and no entry denies anything.
    fn root_grants(&self, enough: impl Fn(Access) -> bool) -> bool {
        match &self.profile {
            Profile::Disabled | Profile::External { .. } => true,
            Profile::Managed {
                fs: FileSystem::Unrestricted,
                ..
            } => true,
            Profile::Managed {
                fs: FileSystem::Restricted(rules),
                ..
            } => {
                rules
                    .iter()
                    .any(|r| r.target == Target::Root && enough(r.access))
                    && !rules.iter().any(|r| r.access == Access::Deny)
            }
        }
    }

    /// True when the network is restricted.
    pub fn network_restricted(&self) -> bool {
        match &self.profile {
            Profile::Disabled => false,
            Profile::External { network_restricted }
            | Profile::Managed {
                network_restricted, ..
            } => *network_restricted,
        }
    }
}
