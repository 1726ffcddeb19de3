//! The inner stage as a program of its own. The server's executable is
//! large: re-executing it costs about 1.5 ms of page faults (its relocated
//! data alone is 160 pages) before `main` runs, on every sandboxed start.
//! `exec-server-inner`, built beside it from the same sandbox code, runs
//! only [`crate::inner`] and starts like a small C program. The server uses
//! it when it finds it next to itself and it reports the same source id
//! ([`SOURCE_ID`], a hash of this crate's sources made at build time);
//! otherwise it re-executes itself as before, so a missing, stale or foreign
//! file next to the server only costs that time, never a start.
//!
//! Two builds of it are looked for, in order: [`MUSL_PROGRAM`], the same
//! program built for `x86_64-unknown-linux-musl` (`scripts/build-inner.sh`),
//! then [`PROGRAM`], the workspace's own build. Under a hypervisor that traps
//! `cpuid`, glibc's start-up probing of the CPU's caches alone costs about
//! 0.75 ms of CPU before `main` (a static glibc `main(){}` took 0.77 ms, a
//! musl one 0.08 ms); musl's start-up does no such probing, so the musl
//! build starts in a tenth of the time on every sandboxed start.
//!
//! The program is trusted as the server is: it sits in the server's own
//! directory, which only the server's installer can write.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The inner-stage program's file name, looked for next to the server.
pub const PROGRAM: &str = "exec-server-inner";
/// The same program built for `x86_64-unknown-linux-musl`, looked for
/// first.
pub const MUSL_PROGRAM: &str = "exec-server-inner-musl";
/// The file names looked for next to the server, in order of preference.
pub const PROGRAMS: [&str; 2] = [MUSL_PROGRAM, PROGRAM];
/// The flag that makes the program print [`SOURCE_ID`] and exit.
pub const ID_FLAG: &str = "--sandbox-source-id";
/// A hash of this crate's sources and version, 16 hex digits.
pub const SOURCE_ID: &str = env!("EXEC_SERVER_SANDBOX_SOURCE_ID");
/// How long the program may take to say its id.
const ID_TIMEOUT: Duration = Duration::from_secs(2);

/// What was found next to the server.
#[derive(Debug, PartialEq, Eq)]
pub enum Beside {
    /// The program, built from the same sandbox sources: use it.
    Usable(PathBuf),
    /// A program of that name built from other sources (another version):
    /// not used.
    Foreign {
        /// Its path.
        program: PathBuf,
        /// The source id it reported.
        id: String,
    },
    /// No such program, or one that would not say its id.
    Absent,
}

/// Looks for the inner-stage programs ([`PROGRAMS`], in order) next to
/// `server` (the server's executable) and runs each that is there and
/// executable once with [`ID_FLAG`] to ask which sources it was built from.
/// The first of the same sources is [`Beside::Usable`]; when none is, the
/// first that answered with another id is [`Beside::Foreign`].
pub fn beside(server: &Path) -> Beside {
    let mut foreign = None;
    for name in PROGRAMS {
        let program = server.with_file_name(name);
        match ask_id(&program) {
            Some(id) if id == SOURCE_ID => return Beside::Usable(program),
            Some(id) => {
                foreign.get_or_insert(Beside::Foreign { program, id });
            }
            None => {}
        }
    }
    foreign.unwrap_or(Beside::Absent)
}

/// What `program --sandbox-source-id` prints, trimmed; `None` when it is
/// absent, prints nothing, or takes longer than [`ID_TIMEOUT`] (it is then
/// killed).
fn ask_id(program: &Path) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(program).ok()?;
    if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
        return None;
    }
    let mut child = std::process::Command::new(program)
        .arg(ID_FLAG)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .ok()?;
    let mut stdout = child.stdout.take()?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut out = String::new();
        let read = stdout.by_ref().take(256).read_to_string(&mut out);
        let _ = tx.send(read.map(|_| out));
    });
    let answer = rx.recv_timeout(ID_TIMEOUT);
    if answer.is_err() {
        let _ = child.kill();
    }
    // Its exit status is not asked for: a server that reaps every child
    // (`serve` does, as a subreaper) may have collected it already.
    let _ = child.wait();
    match answer {
        Ok(Ok(out)) if !out.trim().is_empty() => Some(out.trim().to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "es-inner-program-{}-{}",
            std::process::id(),
            SOURCE_ID
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn script(dir: &Path, body: &str) {
        script_named(dir, PROGRAM, body);
    }

    fn script_named(dir: &Path, name: &str, body: &str) {
        let p = dir.join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[test]
    fn the_musl_build_is_preferred_when_it_is_of_the_same_sources() {
        let d = dir().join("musl");
        std::fs::create_dir_all(&d).unwrap();
        let server = d.join("exec-server");
        let same = format!("[ \"$1\" = {ID_FLAG} ] && echo {SOURCE_ID}");
        script_named(&d, PROGRAM, &same);
        script_named(&d, MUSL_PROGRAM, &same);
        assert_eq!(beside(&server), Beside::Usable(d.join(MUSL_PROGRAM)));
        // A stale musl build is passed over for the glibc one of this build.
        script_named(&d, MUSL_PROGRAM, "echo 0123456789abcdef");
        assert_eq!(beside(&server), Beside::Usable(d.join(PROGRAM)));
        // Neither usable: the first that answered is named.
        script_named(&d, PROGRAM, "echo fedcba9876543210");
        assert_eq!(
            beside(&server),
            Beside::Foreign {
                program: d.join(MUSL_PROGRAM),
                id: "0123456789abcdef".into()
            }
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn only_a_program_of_the_same_sources_is_used() {
        let d = dir();
        let server = d.join("exec-server");
        let _ = std::fs::remove_file(d.join(PROGRAM));
        assert_eq!(beside(&server), Beside::Absent, "absent");
        script(&d, &format!("[ \"$1\" = {ID_FLAG} ] && echo {SOURCE_ID}"));
        assert_eq!(beside(&server), Beside::Usable(d.join(PROGRAM)));
        script(&d, "echo 0123456789abcdef");
        assert_eq!(
            beside(&server),
            Beside::Foreign {
                program: d.join(PROGRAM),
                id: "0123456789abcdef".into()
            }
        );
        script(&d, "exit 3");
        assert_eq!(beside(&server), Beside::Absent, "says nothing");
        script(&d, &format!("sleep 30; echo {SOURCE_ID}"));
        let t = std::time::Instant::now();
        assert_eq!(beside(&server), Beside::Absent, "too slow");
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
        std::fs::set_permissions(d.join(PROGRAM), std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(beside(&server), Beside::Absent, "not executable");
        let _ = std::fs::remove_dir_all(&d);
    }
}
