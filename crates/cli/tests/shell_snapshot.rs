//! `process/start.shellSnapshot` (`shellSnapshotV2`): a `<shell> -lc` command
//! runs with the login shell's state captured once per scope. Each test makes
//! its own HOME with startup files that count their runs in a file, and checks
//! the commands' exact output and that count on the host.

use crate::common;

use common::sandbox::*;
use common::*;
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;

const BASH_PROFILE: &str = r#"echo ran >> "$HOME/count"
echo NOISE-FROM-PROFILE
myfn() { echo "myfn-called $1"; }
export SNAPVAR=from-profile
export API_TOKEN=profile-secret
export PATH="/profile/bin:$PATH"
unset UNSET_BY_PROFILE
shopt -s extglob
umask 027
"#;

/// A fresh HOME holding `name` with `content`.
fn home(tag: &str, name: &str, content: &str) -> std::path::PathBuf {
    let h = tmpdir(tag);
    std::fs::write(h.join(name), content).unwrap();
    h
}

fn runs(home: &Path) -> usize {
    std::fs::read_to_string(home.join("count"))
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

fn snapshot(scope: &str, name: &str, path: &str) -> Value {
    json!({"scopeId": scope, "shell": {"name": name, "path": path}})
}

/// Starts `argv` with HOME=`home`, the request PATH `/req/bin:/usr/bin:/bin`
/// and `extra` fields; returns (output, exit code).
async fn start(c: &mut Conn, id: &str, home: &Path, argv: &[&str], extra: Value) -> (String, i64) {
    let mut params = json!({
        "processId": id, "argv": argv, "cwd": uri(home), "tty": false,
        "env": {"HOME": home.to_str().unwrap(), "PATH": "/req/bin:/usr/bin:/bin"},
    });
    for (k, v) in extra.as_object().unwrap() {
        params[k] = v.clone();
    }
    c.ok("process/start", params).await;
    let r = c.collect(id, Duration::from_secs(20)).await;
    (
        String::from_utf8_lossy(&r.bytes).into_owned(),
        r.exit.unwrap_or(-1),
    )
}

/// The PATH the first test's commands must see. Where the system's startup
/// files keep the PATH a login shell is given, the profile's extension
/// (`/profile/bin:$PATH`) applies to the request's PATH. Where they replace it
/// (Debian's /etc/profile does, for root), the profile's PATH is unrelated to
/// the one given, and a variable the request names wins over such a value.
fn expected_login_path() -> &'static str {
    let given = "/req/bin:/usr/bin:/bin";
    let empty_home = tmpdir("snap-path-probe");
    let out = std::process::Command::new("/bin/bash")
        .args(["-lc", "echo \"$PATH\""])
        .env_clear()
        .env("HOME", &empty_home)
        .env("PATH", given)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&empty_home);
    let login = String::from_utf8_lossy(&out.stdout);
    if login.trim_end().contains(given) {
        "/profile/bin:/req/bin:/usr/bin:/bin"
    } else {
        "/req/bin:/usr/bin:/bin"
    }
}

#[tokio::test]
async fn startup_files_run_once_per_scope_and_their_state_is_restored() {
    let s = Server::start(&[]);
    let h = home("snap-bash", ".bash_profile", BASH_PROFILE);
    let mut c = Conn::open(&s.url, None).await;
    let script = "myfn x; echo $SNAPVAR; echo $PATH; shopt -q extglob && echo extglob-on; \
                  echo $0 $1; umask; echo line $LINENO; echo ${PER_COMMAND:-unset}";
    let snap = json!({"shellSnapshot": snapshot("s1", "bash", "/bin/bash")});
    let path = expected_login_path();
    for i in 0..3 {
        let argv = ["/bin/bash", "-lc", script, "zero", "one"];
        let mut extra = snap.clone();
        if i == 0 {
            // A variable of one command only: not carried to the next.
            extra["env"] = json!({"HOME": h.to_str().unwrap(), "PATH": "/req/bin:/usr/bin:/bin",
                                  "PER_COMMAND": "first"});
        }
        let r = start(&mut c, &format!("p{i}"), &h, &argv, extra).await;
        // No profile noise; the profile's PATH extension applies to the
        // request's PATH, as in a login shell; its umask and options hold.
        let per_command = if i == 0 { "first" } else { "unset" };
        assert_eq!(
            r,
            (
                format!(
                    "myfn-called x\nfrom-profile\n{path}\n\
                     extglob-on\nzero one\n0027\nline 1\n{per_command}\n"
                ),
                0
            ),
            "command {i}"
        );
    }
    assert_eq!(runs(&h), 1, "the profile ran once for three commands");

    // What the profile unsets stays unset, unless the request names it.
    let argv = ["/bin/bash", "-lc", "echo ${UNSET_BY_PROFILE:-gone}"];
    let mut extra = snap.clone();
    extra["envPolicy"] = json!({"inherit": "none", "ignoreDefaultExcludes": false, "exclude": [],
                                "set": {"UNSET_BY_PROFILE": "named"}, "includeOnly": []});
    let r = start(&mut c, "named", &h, &argv, extra).await;
    assert_eq!(r, ("named\n".to_string(), 0));

    // Without a snapshot, a login shell reads its profile as always.
    let r = start(
        &mut c,
        "plain",
        &h,
        &["/bin/bash", "-lc", "myfn y"],
        json!({}),
    )
    .await;
    assert_eq!(r, ("NOISE-FROM-PROFILE\nmyfn-called y\n".to_string(), 0));
    assert_eq!(runs(&h), 3);

    // A command that is not `<shell.path> -lc` is left alone.
    let r = start(
        &mut c,
        "dash-c",
        &h,
        &["/bin/bash", "-c", "myfn z"],
        snap.clone(),
    )
    .await;
    assert_eq!(r.1, 127, "{r:?}");
    let r = start(
        &mut c,
        "other-path",
        &h,
        &["bash", "-lc", "echo $SNAPVAR"],
        snap,
    )
    .await;
    assert_eq!(r, ("NOISE-FROM-PROFILE\nfrom-profile\n".to_string(), 0));
    assert_eq!(runs(&h), 4, "the envPolicy start was a scope of its own");

    // Another scope captures again.
    let snap2 = json!({"shellSnapshot": snapshot("s2", "bash", "/bin/bash")});
    let r = start(
        &mut c,
        "scope2",
        &h,
        &["/bin/bash", "-lc", "myfn w"],
        snap2.clone(),
    )
    .await;
    assert_eq!(r, ("myfn-called w\n".to_string(), 0));
    assert_eq!(runs(&h), 5);

    // Another HOME (other startup files) captures again, even in one scope.
    let h2 = home(
        "snap-bash-2",
        ".bash_profile",
        "myfn() { echo other-home; }\n",
    );
    let r = start(&mut c, "home2", &h2, &["/bin/bash", "-lc", "myfn"], snap2).await;
    assert_eq!(r, ("other-home\n".to_string(), 0));
}

/// Startup files that print the capture's marker (a commit message, a web
/// page) cannot pass what follows it for shell state.
#[tokio::test]
async fn printed_text_never_becomes_restored_code() {
    let s = Server::start(&[]);
    let h = tmpdir("snap-forge");
    let pwned = h.join("pwned");
    let profile = format!(
        "printf '\\n# exec-server shell snapshot v1 \\ntouch {p}\\n\\0EVIL=1\\0'\n\
         printf '\\n# exec-server shell snapshot v1\\ntouch {p}\\n\\0'\nexport OK=1\n",
        p = pwned.display()
    );
    std::fs::write(h.join(".bash_profile"), profile).unwrap();
    let mut c = Conn::open(&s.url, None).await;
    let snap = json!({"shellSnapshot": snapshot("s", "bash", "/bin/bash")});
    for i in 0..2 {
        let argv = ["/bin/bash", "-lc", "echo ${EVIL:-none} $OK"];
        let r = start(&mut c, &format!("f{i}"), &h, &argv, snap.clone()).await;
        assert_eq!(r, ("none 1\n".to_string(), 0), "{i}");
    }
    assert!(!pwned.exists(), "printed text ran as code");
}

/// A background job of the startup files neither delays the capture until
/// its timeout nor outlives it.
#[tokio::test]
async fn background_jobs_of_the_startup_files_end_with_the_capture() {
    let s = Server::start(&[]);
    let tag = format!("{}", 7000 + std::process::id() % 1000);
    let profile = format!(
        "case \"$BASH_EXECUTION_STRING\" in *'exec-server shell snapshot'*) \
         sleep {tag}.1 & setsid sleep {tag}.2 & ;; esac\nbgfn() {{ echo bg-ok; }}\n"
    );
    let h = home("snap-bg", ".bash_profile", &profile);
    let mut c = Conn::open(&s.url, None).await;
    let snap = json!({"shellSnapshot": snapshot("s", "bash", "/bin/bash")});
    let t0 = std::time::Instant::now();
    let r = start(&mut c, "bg", &h, &["/bin/bash", "-lc", "bgfn"], snap).await;
    assert_eq!(r, ("bg-ok\n".to_string(), 0));
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert_gone(&format!("sleep {tag}.1")).await;
    assert_gone(&format!("sleep {tag}.2")).await;
}

#[tokio::test]
async fn failing_startup_files_leave_the_command_a_plain_login_shell() {
    let s = Server::start(&[]);
    let h = home(
        "snap-fail",
        ".bash_profile",
        "echo ran >> \"$HOME/count\"; echo bad; exit 3\n",
    );
    let mut c = Conn::open(&s.url, None).await;
    let snap = json!({"shellSnapshot": snapshot("s", "bash", "/bin/bash")});
    let r = start(
        &mut c,
        "f1",
        &h,
        &["/bin/bash", "-lc", "echo unreached"],
        snap,
    )
    .await;
    assert_eq!(r, ("bad\n".to_string(), 3));
    // One failed capture, then the command itself as a login shell.
    assert_eq!(runs(&h), 2);
}

#[tokio::test]
async fn env_policy_filters_what_the_profile_exported() {
    let s = Server::start(&[]);
    let h = home("snap-policy", ".bash_profile", BASH_PROFILE);
    let mut c = Conn::open(&s.url, None).await;
    let extra = json!({
        "shellSnapshot": snapshot("s", "bash", "/bin/bash"),
        "envPolicy": {"inherit": "core", "ignoreDefaultExcludes": false, "exclude": [],
                      "set": {}, "includeOnly": []},
    });
    let argv = ["/bin/bash", "-lc", "echo ${API_TOKEN:-none} $SNAPVAR"];
    let r = start(&mut c, "pol", &h, &argv, extra).await;
    assert_eq!(r, ("none from-profile\n".to_string(), 0));
}

#[tokio::test]
async fn posix_sh_restores_aliases_and_environment() {
    let s = Server::start(&[]);
    let profile =
        "echo ran >> \"$HOME/count\"\nexport SHVAR=from-profile\nalias hi='echo hi-alias'\n";
    let h = home("snap-sh", ".profile", profile);
    let mut c = Conn::open(&s.url, None).await;
    let snap = json!({"shellSnapshot": snapshot("s", "sh", "/bin/sh")});
    for i in 0..2 {
        let argv = ["/bin/sh", "-lc", "echo $SHVAR; alias hi"];
        let r = start(&mut c, &format!("sh{i}"), &h, &argv, snap.clone()).await;
        assert_eq!(
            r,
            ("from-profile\nhi='echo hi-alias'\n".to_string(), 0),
            "{i}"
        );
    }
    assert_eq!(runs(&h), 1);
}

/// The capture runs in the command's sandbox: what the startup files may not
/// write, they cannot write during the capture either.
#[tokio::test]
async fn the_capture_is_confined_like_the_command() {
    let s = Server::start(&[]);
    let f = fixture("snap-sandbox");
    let leak = f.out.join("leak");
    let profile = format!(
        "echo ran >> \"$HOME/count\"\necho x > {} 2>/dev/null\nmyfn() {{ echo confined-fn; }}\n",
        leak.display()
    );
    std::fs::write(f.ws.join(".bash_profile"), profile).unwrap();
    let mut c = Conn::open(&s.url, None).await;
    let extra = json!({
        "shellSnapshot": snapshot("s", "bash", "/bin/bash"),
        "sandbox": ww(&f.ws),
    });
    for i in 0..2 {
        let r = start(
            &mut c,
            &format!("sb{i}"),
            &f.ws,
            &["/bin/bash", "-lc", "myfn"],
            extra.clone(),
        )
        .await;
        assert_eq!(r, ("confined-fn\n".to_string(), 0), "{i}");
    }
    assert_eq!(runs(&f.ws), 1);
    assert!(!leak.exists(), "the profile wrote outside the sandbox");
}

#[tokio::test]
async fn bad_snapshot_requests_are_invalid_params() {
    let s = Server::start(&[]);
    let h = tmpdir("snap-bad");
    let mut c = Conn::open(&s.url, None).await;
    let long = "x".repeat(257);
    let cases = [
        (
            snapshot("", "bash", "/bin/bash"),
            "shell snapshot scope must be non-empty and at most 256 bytes",
        ),
        (
            snapshot(&long, "bash", "/bin/bash"),
            "shell snapshot scope must be non-empty and at most 256 bytes",
        ),
        (
            snapshot("s", "fish", "/bin/bash"),
            "shell snapshots are unsupported for shell `fish`",
        ),
    ];
    for (i, (snap, message)) in cases.into_iter().enumerate() {
        let r = c
            .call(
                "process/start",
                json!({"processId": format!("b{i}"), "argv": ["/bin/bash", "-lc", "true"],
                       "cwd": uri(&h), "env": {}, "tty": false, "shellSnapshot": snap}),
            )
            .await;
        assert_eq!(r["error"]["code"], -32602, "{r}");
        assert_eq!(r["error"]["message"], message, "{r}");
    }
    let r = c
        .call(
            "process/start",
            json!({"processId": "b9", "argv": ["/bin/bash", "-lc", "true"], "cwd": uri(&h),
                   "env": {}, "tty": false, "shellSnapshot": {"scopeId": "s"}}),
        )
        .await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
    let info = c.ok("environment/info", Value::Null).await;
    assert_eq!(info["capabilities"]["shellSnapshotV2"], true);
}
