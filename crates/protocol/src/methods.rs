//! Method names, exactly as they appear on the wire.

/// Request, client→server: open or resume a session.
pub const INITIALIZE: &str = "initialize";
/// Notification, client→server: the handshake is complete.
pub const INITIALIZED: &str = "initialized";
/// Request: describe the executor (shell, version, directories, capabilities).
pub const ENVIRONMENT_INFO: &str = "environment/info";
/// Request: `{"status":"ready"}`.
pub const ENVIRONMENT_STATUS: &str = "environment/status";
/// Request: start a process.
pub const PROCESS_START: &str = "process/start";
/// Request: read retained output, optionally long-polling.
pub const PROCESS_READ: &str = "process/read";
/// Request: write bytes to a process's stdin.
pub const PROCESS_WRITE: &str = "process/write";
/// Request: send a signal to a process group.
pub const PROCESS_SIGNAL: &str = "process/signal";
/// Request: kill a process tree.
pub const PROCESS_TERMINATE: &str = "process/terminate";
/// Request (ours): resize a PTY. Reference answers -32601.
pub const PROCESS_RESIZE: &str = "process/resize";
/// Request (ours): close a process's stdin (end of file).
pub const PROCESS_CLOSE_STDIN: &str = "process/closeStdin";
/// Request (ours): acknowledge output through a seq (flow control).
pub const PROCESS_ACK: &str = "process/ack";
/// Ours: the caller's session's processes (`processList` capability).
pub const PROCESS_LIST: &str = "process/list";
/// Ours: signal or end a process of any session, with the operator
/// credential (`processList` capability).
pub const PROCESS_OPERATOR_SIGNAL: &str = "process/operatorSignal";
/// Notification, server→client: a chunk of output.
pub const PROCESS_OUTPUT: &str = "process/output";
/// Notification, server→client: the process exited.
pub const PROCESS_EXITED: &str = "process/exited";
/// Notification, server→client: all output streams are drained.
pub const PROCESS_CLOSED: &str = "process/closed";
/// Request, server→client: ask for a network policy decision (proxy only).
pub const NETWORK_POLICY_REQUEST: &str = "network/policyRequest";
/// Notification name reserved by the reference for policy decisions.
pub const NETWORK_POLICY_DECISION: &str = "network/policyDecision";
/// Request: read a whole file.
pub const FS_READ_FILE: &str = "fs/readFile";
/// Request: write a whole file.
pub const FS_WRITE_FILE: &str = "fs/writeFile";
/// Request: create a directory.
pub const FS_CREATE_DIRECTORY: &str = "fs/createDirectory";
/// Request: stat a path.
pub const FS_GET_METADATA: &str = "fs/getMetadata";
/// Request: resolve `..` and symlinks.
pub const FS_CANONICALIZE: &str = "fs/canonicalize";
/// Request: list a directory.
pub const FS_READ_DIRECTORY: &str = "fs/readDirectory";
/// Request: walk a tree with limits.
pub const FS_WALK: &str = "fs/walk";
/// Request: remove a path.
pub const FS_REMOVE: &str = "fs/remove";
/// Request: copy a path.
pub const FS_COPY: &str = "fs/copy";
/// Request: open a file handle.
pub const FS_OPEN: &str = "fs/open";
/// Request: read a block from a handle.
pub const FS_READ_BLOCK: &str = "fs/readBlock";
/// Request: write a block to a handle.
pub const FS_WRITE_BLOCK: &str = "fs/writeBlock";
/// Request: close a handle.
pub const FS_CLOSE: &str = "fs/close";
/// Request (ours): watch a path for changes.
pub const FS_WATCH: &str = "fs/watch";
/// Notification (ours), server→client: a watched path changed.
pub const FS_CHANGED: &str = "fs/changed";
/// Notification (ours), server→client: a watch ended on its own (the directory
/// holding its path went away); its id is free again. Not sent after `fs/unwatch`.
pub const FS_WATCH_ENDED: &str = "fs/watchEnded";
/// Request (ours): stop a watch.
pub const FS_UNWATCH: &str = "fs/unwatch";
/// Request: a one-shot watch for paths to appear or a path to go
/// (the reference's `fsWatchMissing` capability).
pub const FS_WATCH_MISSING: &str = "fs/watchMissing";
/// Notification: a `fs/watchMissing` watch fired (once).
pub const FS_MISSING_CHANGED: &str = "fs/missingChanged";
/// Not implemented by the reference nor by us (-32601).
pub const FS_RENAME: &str = "fs/rename";
/// Not implemented by the reference nor by us (-32601).
pub const FS_SYMLINK: &str = "fs/symlink";
/// Request: read environment configuration files.
pub const ENVIRONMENT_CONFIG_READ: &str = "environmentConfig/read";
/// Request: discover plugins and skills under a cwd.
pub const CAPABILITIES_DISCOVER_V2: &str = "capabilities/discoverV2";
/// Request: discover manifests under given roots.
pub const CAPABILITY_ROOTS_DISCOVER_V1: &str = "capabilityRoots/discoverV1";
/// Not implemented by the reference nor by us (-32601).
pub const CAPABILITY_ROOTS_DISCOVER_V2: &str = "capabilityRoots/discoverV2";
/// Request: perform an HTTP request on the executor.
pub const HTTP_REQUEST: &str = "http/request";
/// Notification, server→client: a piece of a streamed HTTP body.
pub const HTTP_REQUEST_BODY_DELTA: &str = "http/request/bodyDelta";
