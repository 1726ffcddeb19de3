//! Double-forked daemons (`(setsid cmd &)`) leave their process group and
//! session and are re-parented to the server; they must still die with the
//! process that started them: on `process/terminate` and at session expiry
//! (issue 19, item 9). Needs a writable cgroup2 hierarchy (root here); where
//! there is none the server falls back to the process-group kill and these
//! tests say so and stop.

use crate::common;
use common::*;
use serde_json::json;
use std::time::Duration;

/// A sleep duration unique to this test run, to find its daemons in /proc.
fn marker(salt: u32) -> String {
    format!("{}.{salt}", 700_000 + std::process::id() % 100_000)
}

fn cgroups_writable() -> bool {
    let cg2 = std::fs::read_to_string("/proc/self/mountinfo")
        .map(|m| m.lines().any(|l| l.contains(" - cgroup2 ")))
        .unwrap_or(false);
    cg2 && nix::unistd::geteuid().is_root()
}

#[tokio::test]
async fn terminate_kills_double_forked_daemons() {
    if !cgroups_writable() {
        eprintln!("no writable cgroup2 here: daemons are only killed at shutdown");
        return;
    }
    let s = Server::start(&[]);
    let d = tmpdir("daemons");
    let m = marker(1);
    let mut c = Conn::open(&s.url, None).await;
    // 20 daemons, then the shell waits (still running when terminated).
    let script = format!("for i in $(seq 20); do (setsid sleep {m} >/dev/null 2>&1 &); done; echo started; exec sleep 3600");
    c.ok(
        "process/start",
        start_params("p", &["sh", "-c", &script], &d, false, false),
    )
    .await;
    c.expect(|v| v["method"] == "process/output", WAIT).await;
    assert!(
        eventually(WAIT, || pids_matching(&format!("sleep {m}")).len() == 20).await,
        "daemons seen: {:?}",
        pids_matching(&format!("sleep {m}"))
    );
    let r = c.ok("process/terminate", json!({"processId": "p"})).await;
    assert_eq!(r["running"], true);
    assert!(
        eventually(WAIT, || pids_matching(&format!("sleep {m}")).is_empty()).await,
        "daemons left: {:?}",
        pids_matching(&format!("sleep {m}"))
    );

    // A command that exited at once and left a daemon: terminate still
    // clears what it left.
    let m2 = marker(2);
    let script = format!("(setsid sleep {m2} >/dev/null 2>&1 &)");
    c.ok(
        "process/start",
        start_params("q", &["sh", "-c", &script], &d, false, false),
    )
    .await;
    c.collect("q", WAIT).await;
    assert!(eventually(WAIT, || pids_matching(&format!("sleep {m2}")).len() == 1).await);
    let r = c.ok("process/terminate", json!({"processId": "q"})).await;
    assert_eq!(r["running"], false, "it had exited");
    assert!(eventually(WAIT, || pids_matching(&format!("sleep {m2}")).is_empty()).await);
    std::fs::remove_dir_all(&d).unwrap();
}

#[tokio::test]
async fn session_expiry_kills_daemons_of_exited_processes() {
    if !cgroups_writable() {
        eprintln!("no writable cgroup2 here: daemons are only killed at shutdown");
        return;
    }
    let s = Server::start(&["--detached-session-ttl", "1"]);
    let d = tmpdir("daemons-ttl");
    let m = marker(3);
    let mut c = Conn::open(&s.url, None).await;
    let script =
        format!("(setsid sleep {m} >/dev/null 2>&1 &); (setsid sleep {m} >/dev/null 2>&1 &)");
    c.ok(
        "process/start",
        start_params("p", &["sh", "-c", &script], &d, false, false),
    )
    .await;
    c.collect("p", WAIT).await;
    assert!(eventually(WAIT, || pids_matching(&format!("sleep {m}")).len() == 2).await);
    c.close().await;
    // Detached for 1 s, then torn down: the daemons go with the session.
    assert!(
        eventually(Duration::from_secs(20), || pids_matching(&format!(
            "sleep {m}"
        ))
        .is_empty())
        .await,
        "daemons survived session expiry"
    );
    // And the server is still serving.
    let mut c = Conn::open(&s.url, None).await;
    c.ok("environment/info", json!({})).await;
    std::fs::remove_dir_all(&d).unwrap();
}

/// A command that writes `cgroup.kill` of its own cgroup (a clean-up
/// script, say) leaves that cgroup marked "killed" by the kernel, which
/// then kills every child born into it. The next commands, started one
/// after another (so the emptied cgroup is the first one reused), still run:
/// the server sees its child killed at birth, never reuses that cgroup, and
/// starts the command the other way.
#[tokio::test]
async fn a_command_that_kills_its_own_cgroup_does_not_kill_the_next_ones() {
    if !cgroups_writable() {
        eprintln!("no writable cgroup2 here: nothing to kill");
        return;
    }
    let s = Server::start(&[]);
    let d = tmpdir("self-kill");
    let mut c = Conn::open(&s.url, None).await;
    let script = "mnt=$(awk '$9 == \"cgroup2\" {print $5; exit}' /proc/self/mountinfo); \
                  cg=$(sed -n 's/^0:://p' /proc/self/cgroup); echo \"$cg\"; \
                  echo 1 > \"$mnt$cg/cgroup.kill\"; echo survived";
    c.ok(
        "process/start",
        start_params("k", &["sh", "-c", script], &d, false, false),
    )
    .await;
    let killed = c.collect("k", WAIT).await;
    assert_eq!(killed.exit, Some(137), "the command killed itself");
    let killed_cgroup = String::from_utf8_lossy(&killed.bytes).trim().to_string();
    assert!(!killed_cgroup.is_empty());
    let mut in_killed = 0;
    for i in 0..3 {
        let id = format!("next{i}");
        c.ok(
            "process/start",
            start_params(
                &id,
                &["sh", "-c", "sed -n 's/^0:://p' /proc/self/cgroup"],
                &d,
                false,
                false,
            ),
        )
        .await;
        let n = c.collect(&id, WAIT).await;
        assert_eq!(n.exit, Some(0), "start {i} after the self-kill");
        if String::from_utf8_lossy(&n.bytes).trim() == killed_cgroup {
            in_killed += 1;
        }
    }
    // The first start may meet the killed cgroup (and go the other way);
    // after that it is never handed out again.
    assert!(
        in_killed <= 1,
        "the killed cgroup served {in_killed} starts"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[tokio::test]
async fn an_emptied_cgroup_serves_later_starts_and_one_a_daemon_holds_never_does() {
    if !cgroups_writable() {
        eprintln!("no writable cgroup2 here: no per-process cgroups");
        return;
    }
    let s = Server::start(&[]);
    let d = tmpdir("cgroup-reuse");
    let mut c = Conn::open(&s.url, None).await;
    let own_cgroup = "sed -n 's/^0:://p' /proc/self/cgroup";
    let m = marker(4);
    let daemon = format!("{own_cgroup}; (setsid sleep {m} >/dev/null 2>&1 &)");
    let held = cgroup_of_run(&mut c, &d, "daemon", &daemon).await;
    assert!(eventually(WAIT, || pids_matching(&format!("sleep {m}")).len() == 1).await);
    let emptied = cgroup_of_run(&mut c, &d, "plain", own_cgroup).await;
    assert!(!held.is_empty() && !emptied.is_empty() && held != emptied);
    let mut later = Vec::new();
    for i in 0..6 {
        later.push(cgroup_of_run(&mut c, &d, &format!("later{i}"), own_cgroup).await);
    }
    assert!(
        later.iter().all(|cg| *cg != held),
        "the cgroup a daemon lives in served another start: {later:?}"
    );
    // Emptied cgroups serve later starts: the one "plain" left, or one a
    // later start left (which of them the pool hands out first depends on
    // when each was seen empty).
    let reused =
        later.contains(&emptied) || (1..later.len()).any(|i| later[..i].contains(&later[i]));
    assert!(
        reused,
        "no emptied cgroup ({emptied}, or one of these) was reused: {later:?}"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

/// Runs `script` (which prints its cgroup) as `id` until closed; its output.
async fn cgroup_of_run(c: &mut Conn, d: &std::path::Path, id: &str, script: &str) -> String {
    c.ok(
        "process/start",
        start_params(id, &["sh", "-c", script], d, false, false),
    )
    .await;
    let done = c.collect(id, WAIT).await;
    assert_eq!(done.exit, Some(0), "{id}");
    String::from_utf8_lossy(&done.bytes).trim().to_string()
}
