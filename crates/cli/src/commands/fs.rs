//! `fs`: files on the server: ls, cat, put, get, stat, rm, mkdir, cp. Remote
//! paths are absolute, file: URIs, or relative to the server's working directory.

use super::{explain, fail, remote_path, ConnectArgs};
use clap::{Args, Subcommand};
use exec_server_client::{ClientError, ExecServerClient};
use std::io::Write;
use std::path::{Path, PathBuf};

/// `fs` subcommands.
#[derive(Subcommand, Debug)]
pub enum FsCommand {
    /// List a directory (directories end with /).
    Ls { path: String },
    /// Print a file to stdout (streamed in 1 MiB blocks).
    Cat { path: String },
    /// Upload a local file (streamed; the remote file appears whole or not at
    /// all; a regular file starts over, at most 3 times, if the connection is
    /// lost part-way).
    Put { local: PathBuf, remote: String },
    /// Download a remote file (streamed; `-` writes to stdout; an existing local
    /// file is replaced only once the download succeeded).
    Get { remote: String, local: PathBuf },
    /// Show metadata as JSON.
    Stat { path: String },
    /// Remove a file or directory (directories need -r).
    Rm {
        /// Remove directories and their content.
        #[arg(short, long)]
        recursive: bool,
        /// A missing path is not an error.
        #[arg(short, long)]
        force: bool,
        path: String,
    },
    /// Create a directory (-p: with parents, existing is fine).
    Mkdir {
        #[arg(short, long)]
        parents: bool,
        path: String,
    },
    /// Copy on the server (-r for directories).
    Cp {
        #[arg(short, long)]
        recursive: bool,
        from: String,
        to: String,
    },
}

/// `fs` flags.
#[derive(Args, Debug)]
pub struct FsArgs {
    #[command(flatten)]
    pub conn: ConnectArgs,
    #[command(subcommand)]
    pub command: FsCommand,
}

/// Runs `fs …`; returns the exit code.
pub async fn fs(args: FsArgs) -> i32 {
    let client = match args.conn.client("exec-server fs") {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let c = &client;
    let r = match args.command {
        FsCommand::Ls { path } => ls(c, &path).await,
        FsCommand::Cat { path } => cat(c, &path).await,
        FsCommand::Get { remote, local } => get(c, &remote, &local).await,
        FsCommand::Put { local, remote } => put(c, &local, &remote).await,
        FsCommand::Stat { path } => stat(c, &path).await,
        FsCommand::Rm {
            recursive,
            force,
            path,
        } => rm(c, &path, recursive, force).await,
        FsCommand::Mkdir { parents, path } => mkdir(c, &path, parents).await,
        FsCommand::Cp {
            recursive,
            from,
            to,
        } => cp(c, &from, &to, recursive).await,
    };
    // As `run`: closed for good, so the runtime's end is no lost connection.
    client.close().await;
    match r {
        Ok(()) => 0,
        Err(e) => fail(e),
    }
}

fn s(e: ClientError) -> String {
    explain(&e)
}

async fn ls(c: &ExecServerClient, path: &str) -> Result<(), String> {
    let p = remote_path(c, path).await?;
    let mut entries = c.read_directory(&p).await.map_err(s)?;
    entries.sort_by(|a, b| a.file_name.cmp(&b.file_name));
    let mut out = std::io::stdout().lock();
    for e in entries {
        let slash = if e.is_directory { "/" } else { "" };
        let _ = writeln!(out, "{}{slash}", e.file_name);
    }
    Ok(())
}

async fn cat(c: &ExecServerClient, path: &str) -> Result<(), String> {
    let p = remote_path(c, path).await?;
    c.download(&p, &mut tokio::io::stdout()).await.map_err(s)?;
    Ok(())
}

/// Downloads beside the target and renames on success, so a failed download
/// never truncates an existing file.
async fn get(c: &ExecServerClient, remote: &str, local: &Path) -> Result<(), String> {
    if local.as_os_str() == "-" {
        return cat(c, remote).await;
    }
    let p = remote_path(c, remote).await?;
    let name = local
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "download".into());
    let partial = local.with_file_name(format!(".{name}.partial-{}", std::process::id()));
    let f = std::fs::File::create(&partial).map_err(|e| format!("{}: {e}", partial.display()))?;
    let r = c.download_to_file(&p, f, |_| {}).await;
    match r {
        Ok(n) => {
            std::fs::rename(&partial, local).map_err(|e| format!("{}: {e}", local.display()))?;
            eprintln!("{n} bytes");
            Ok(())
        }
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            Err(s(e))
        }
    }
}

async fn put(c: &ExecServerClient, local: &Path, remote: &str) -> Result<(), String> {
    let p = remote_path(c, remote).await?;
    let f = std::fs::File::open(local).map_err(|e| format!("{}: {e}", local.display()))?;
    // Positional reads need a regular file; a pipe or device is read in order.
    let regular = f.metadata().is_ok_and(|m| m.is_file());
    let n = if regular {
        c.upload_from_file(f, &p, |_| {}).await
    } else {
        c.upload(&mut tokio::fs::File::from_std(f), &p).await
    }
    .map_err(s)?;
    eprintln!("{n} bytes");
    Ok(())
}

async fn stat(c: &ExecServerClient, path: &str) -> Result<(), String> {
    let p = remote_path(c, path).await?;
    let m = c.metadata(&p).await.map_err(s)?;
    println!("{}", serde_json::to_string_pretty(&m).unwrap_or_default());
    Ok(())
}

/// True if `p` is a directory (not a link to one) on the server.
async fn is_directory(c: &ExecServerClient, p: &exec_server_protocol::PathUri) -> bool {
    c.metadata(p)
        .await
        .is_ok_and(|m| m.is_directory && !m.is_symlink)
}

async fn rm(c: &ExecServerClient, path: &str, recursive: bool, force: bool) -> Result<(), String> {
    let p = remote_path(c, path).await?;
    if !recursive && is_directory(c, &p).await {
        return Err(format!("{path} is a directory (use -r)"));
    }
    c.remove(&p, recursive, force).await.map_err(s)
}

async fn mkdir(c: &ExecServerClient, path: &str, parents: bool) -> Result<(), String> {
    let p = remote_path(c, path).await?;
    c.create_directory(&p, parents).await.map_err(|e| {
        if e.is_not_found() {
            format!("{path}: a parent directory does not exist (use -p to create parents)")
        } else {
            s(e)
        }
    })
}

async fn cp(c: &ExecServerClient, from: &str, to: &str, recursive: bool) -> Result<(), String> {
    let (f, t) = (remote_path(c, from).await?, remote_path(c, to).await?);
    if !recursive && is_directory(c, &f).await {
        return Err(format!("{from} is a directory (use -r)"));
    }
    c.copy(&f, &t, recursive).await.map_err(s)
}
