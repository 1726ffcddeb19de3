//! `fs/*` params and results. Every path is a [`PathUri`].

use crate::bytes::ByteChunk;
use crate::path::PathUri;
use crate::types::sandbox::FileSystemSandboxContext;
use serde::{Deserialize, Serialize};

fn yes() -> bool {
    true
}

/// Params of `fs/readFile`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadFileParams {
    /// File to read.
    pub path: PathUri,
    /// Follow a final symlink (default true for reads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub follow_symlinks: Option<bool>,
    /// Sandbox context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<FileSystemSandboxContext>,
}

/// Result of `fs/readFile`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadFileResponse {
    /// The whole content.
    pub data_base64: ByteChunk,
}

/// Params of `fs/writeFile`: creates or truncates.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WriteFileParams {
    /// File to write.
    pub path: PathUri,
    /// The whole content; a string that is not base64 is refused by the
    /// method after its other checks (see [`crate::bytes::LenientChunk`]).
    pub data_base64: crate::bytes::LenientChunk,
    /// Follow a final symlink.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub follow_symlinks: Option<bool>,
    /// Sandbox context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<FileSystemSandboxContext>,
}

/// Params of `fs/createDirectory`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateDirectoryParams {
    /// Directory to create.
    pub path: PathUri,
    /// Create parents; existing directory is fine (default true).
    #[serde(default = "yes")]
    pub recursive: bool,
    /// Follow symlinks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub follow_symlinks: Option<bool>,
    /// Sandbox context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<FileSystemSandboxContext>,
}

/// Params of `fs/getMetadata`, `fs/canonicalize`, `fs/readDirectory`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PathParams {
    /// The path.
    pub path: PathUri,
    /// Follow a final symlink (`fs/getMetadata` default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub follow_symlinks: Option<bool>,
    /// Sandbox context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<FileSystemSandboxContext>,
}

/// Result of `fs/getMetadata`. Times in ms since the Unix epoch (0 = unknown).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MetadataResponse {
    /// Is a directory.
    pub is_directory: bool,
    /// Is a regular file.
    pub is_file: bool,
    /// Is a symlink (final component not followed).
    pub is_symlink: bool,
    /// Size in bytes.
    pub size: u64,
    /// Birth time in ms, 0 when unavailable.
    pub created_at_ms: i64,
    /// Modification time in ms.
    pub modified_at_ms: i64,
}

/// Result of `fs/canonicalize`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CanonicalizeResponse {
    /// Absolute path with `..` and symlinks resolved.
    pub path: PathUri,
}

/// One entry of `fs/readDirectory`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DirectoryEntry {
    /// Name within the directory.
    pub file_name: String,
    /// Is a directory (symlinks followed).
    pub is_directory: bool,
    /// Is a file (symlinks followed).
    pub is_file: bool,
}

/// Result of `fs/readDirectory` (directory order, unsorted).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReadDirectoryResponse {
    /// Entries.
    pub entries: Vec<DirectoryEntry>,
}

/// Limits of `fs/walk` (all required).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WalkOptions {
    /// Deepest level listed (1 = direct children).
    pub max_depth: u64,
    /// Most directories descended into.
    pub max_directories: u64,
    /// Most entries returned.
    pub max_entries: u64,
    /// Descend into symlinks to directories.
    pub follow_directory_symlinks: bool,
}

/// Params of `fs/walk`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WalkParams {
    /// Root (not listed itself).
    pub path: PathUri,
    /// Limits.
    pub options: WalkOptions,
    /// Sandbox context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<FileSystemSandboxContext>,
}

/// Kind of a walk entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum WalkEntryKind {
    /// Regular file.
    File,
    /// Directory.
    Directory,
    /// Symlink to a file.
    SymlinkFile,
    /// Symlink to a directory.
    SymlinkDirectory,
    /// Anything else (dangling symlink, socket, device).
    Other,
}

/// One entry of `fs/walk`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WalkEntry {
    /// Entry path.
    pub path: PathUri,
    /// Kind.
    pub kind: WalkEntryKind,
}

/// A per-entry error of `fs/walk`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WalkError {
    /// Where it happened.
    pub path: PathUri,
    /// OS text.
    pub message: String,
}

/// Result of `fs/walk`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WalkResponse {
    /// Entries in walk order.
    pub entries: Vec<WalkEntry>,
    /// Errors met on the way.
    pub errors: Vec<WalkError>,
    /// A limit cut the walk.
    pub truncated: bool,
}

/// Params of `fs/remove`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RemoveParams {
    /// Path to remove.
    pub path: PathUri,
    /// Remove directories with their content (default true).
    #[serde(default = "yes")]
    pub recursive: bool,
    /// A missing path is not an error (default true).
    #[serde(default = "yes")]
    pub force: bool,
    /// Follow a final symlink.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub follow_symlinks: Option<bool>,
    /// Sandbox context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<FileSystemSandboxContext>,
}

/// Params of `fs/copy`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CopyParams {
    /// Source.
    pub source_path: PathUri,
    /// Destination.
    pub destination_path: PathUri,
    /// Required; must be true for a directory source.
    pub recursive: bool,
    /// Sandbox context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<FileSystemSandboxContext>,
}

/// Params of `fs/open`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OpenParams {
    /// Client-chosen handle id, unique in the session.
    pub handle_id: String,
    /// File to open.
    pub path: PathUri,
    /// `read` (default) or `replace` (create or truncate, for `fs/writeBlock`).
    #[serde(default)]
    pub mode: OpenMode,
    /// Sandbox context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<FileSystemSandboxContext>,
}

/// How `fs/open` opens a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum OpenMode {
    /// Read only (default).
    #[default]
    Read,
    /// Create or truncate, write only.
    Replace,
}

/// Result of `fs/open`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OpenResponse {
    /// The handle id given.
    pub handle_id: String,
}

/// Params of `fs/readBlock`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadBlockParams {
    /// Handle.
    pub handle_id: String,
    /// Byte offset.
    pub offset: u64,
    /// Bytes wanted, 1..=1048576.
    pub len: u64,
}

/// Result of `fs/readBlock`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReadBlockResponse {
    /// Up to `len` bytes.
    pub chunk: ByteChunk,
    /// The read reached end of file.
    pub eof: bool,
}

/// Params of `fs/writeBlock`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WriteBlockParams {
    /// Handle.
    pub handle_id: String,
    /// Byte offset.
    pub offset: u64,
    /// Bytes to write.
    pub chunk: ByteChunk,
}

/// Params of `fs/close`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HandleParams {
    /// Handle.
    pub handle_id: String,
}

/// Params of `fs/watch` (ours): watch `path` for changes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WatchParams {
    /// Client-chosen id, unique in the session.
    pub watch_id: String,
    /// File or directory to watch.
    pub path: PathUri,
    /// Watch a directory's whole tree (default false).
    #[serde(default)]
    pub recursive: bool,
}

/// Params of `fs/unwatch` (ours).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UnwatchParams {
    /// The watch to remove (unknown ids are fine).
    pub watch_id: String,
}

/// `fs/changed` notification (ours): something changed under a watched path.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FsChangedNotification {
    /// The watch.
    pub watch_id: String,
    /// `create`, `modify`, `remove`, `rename` or `other` (`other` with the
    /// watched path itself: changes may have been lost, look again).
    pub kind: String,
    /// Paths affected.
    pub paths: Vec<PathUri>,
}

/// `fs/watchEnded` notification (ours): the watch stopped on its own, because
/// the directory holding the watched path was removed or moved, or its file
/// system unmounted (replacing the path itself does not end a watch). Sent once,
/// after the watch's last `fs/changed`; the id is free again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FsWatchEndedNotification {
    /// The watch.
    pub watch_id: String,
    /// Why it ended, in words.
    pub reason: String,
}

/// Params of `fs/watchMissing`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FsWatchMissingParams {
    /// `watchId`: the caller's id, an integer, unique in the session for good
    /// (it stays taken after the watch fired).
    pub watch_id: u64,
    /// `missing`: paths that do not exist; the watch fires when one of them, or
    /// one of their missing ancestors, comes into existence. 1 to 64 paths.
    pub missing: Vec<PathUri>,
    /// `present`: a path that exists; the watch also fires when it goes away.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub present: Option<PathUri>,
}

/// Result of `fs/watchMissing`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FsWatchMissingResponse {
    /// `watching`: false when nothing was armed (id taken, a `missing` path
    /// exists, `missing` empty or over 64 paths, `present` absent, a path under
    /// a non-directory or in an unwatchable place).
    pub watching: bool,
}

/// `fs/missingChanged`: a `fs/watchMissing` watch fired; sent once per watch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FsMissingChangedNotification {
    /// The watch.
    pub watch_id: u64,
}
