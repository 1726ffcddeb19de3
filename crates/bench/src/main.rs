//! exec-server-bench: drives any exec-server (ours or the reference) by URL or
//! by a command that prints its URL, runs scenarios interleaved across servers
//! (A B A B …), checks every result, and prints medians and ratios.
//!
//! ```text
//! cargo run --release -p exec-server-bench -- \
//!   --server "ours=target/release/exec-server --listen ws://127.0.0.1:0" \
//!   --server "ref=/path/to/codex exec-server --listen ws://127.0.0.1:0" \
//!   --runs 3 --scenarios all --plot BENCHMARKS-scaling.svg
//! ```

mod local;
mod sandboxed;
mod scenarios;
mod server;
mod snapshot;
mod svg;
mod wire;

use clap::Parser;
use scenarios::{Outcome, Scenario};
use std::collections::BTreeMap;

/// Benchmark exec-servers side by side.
#[derive(Parser, Debug)]
#[command(name = "exec-server-bench")]
struct Args {
    /// NAME=COMMAND that starts a server and prints its ws:// URL, or NAME=ws://URL
    /// of a running one. Repeat to compare (runs are interleaved).
    #[arg(long = "server", required = true)]
    servers: Vec<String>,
    /// Runs per scenario and server; the median is reported.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Comma-separated scenarios, or `all`: connect, spawn, spawn-limited, spawn-concurrent,
    /// spawn-pipelined, stream, fsread, fswrite, fsread-blocks, fswrite-blocks,
    /// many-procs, idle-conns, spawn-sandboxed, shell-snapshot.
    #[arg(long, default_value = "all")]
    scenarios: String,
    /// Include the local limit (the same work without a server).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    local: bool,
    /// Write an SVG of spawn latency and server memory vs concurrent processes.
    #[arg(long)]
    plot: Option<String>,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

fn raise_fd_limit() {
    // SAFETY: getrlimit/setrlimit with a struct that lives for the call.
    unsafe {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 {
            r.rlim_cur = r.rlim_max.min(65536);
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

fn main() {
    // Before any thread exists: the allocator's settings apply to every one.
    tune_allocator();
    let args = Args::parse();
    warm_heap();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot start the async runtime: {e}");
            std::process::exit(2);
        }
    };
    runtime.block_on(run(args));
}

async fn run(args: Args) {
    raise_fd_limit();
    let servers: Vec<server::Target> = match args
        .servers
        .iter()
        .map(|s| server::Target::parse(s))
        .collect()
    {
        Ok(s) => s,
        Err(e) => {
            eprintln!("exec-server-bench: {e}");
            std::process::exit(2);
        }
    };
    let chosen: Vec<Scenario> = if args.scenarios == "all" {
        Scenario::ALL.to_vec()
    } else {
        match args
            .scenarios
            .split(',')
            .map(|s| Scenario::parse(s.trim()))
            .collect()
        {
            Ok(v) => v,
            Err(e) => {
                eprintln!("exec-server-bench: {e}");
                std::process::exit(2);
            }
        }
    };
    println!(
        "machine: {} cores, {}",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        server::kernel()
    );
    let mut failed = false;
    let mut table: Vec<(Scenario, BTreeMap<String, Vec<Outcome>>)> = Vec::new();
    for sc in &chosen {
        let mut per: BTreeMap<String, Vec<Outcome>> = BTreeMap::new();
        for run in 0..args.runs {
            for t in &servers {
                // A fresh server per run keeps memory figures independent.
                let r = match t.start().await {
                    Ok(srv) => {
                        let r = scenarios::run(*sc, &srv).await;
                        srv.stop();
                        r
                    }
                    Err(e) => Err(e),
                };
                match r {
                    Ok(o) => {
                        eprintln!(
                            "  {:<16} {:<6} run {}: {}",
                            sc.name(),
                            t.name,
                            run + 1,
                            o.describe()
                        );
                        per.entry(t.name.clone()).or_default().push(o);
                    }
                    Err(e) => {
                        eprintln!(
                            "  {:<16} {:<6} run {}: FAILED: {e}",
                            sc.name(),
                            t.name,
                            run + 1
                        );
                        per.entry(t.name.clone())
                            .or_default()
                            .push(Outcome::failed(e));
                        failed = true;
                    }
                }
            }
            if args.local {
                if let Ok(o) = scenarios::local(*sc).await {
                    per.entry("local".into()).or_default().push(o);
                }
            }
        }
        table.push((*sc, per));
    }
    println!();
    print_table(&table, &servers);
    if let Some(path) = &args.plot {
        match scenarios::scaling(&servers).await {
            Ok(series) => {
                let svg = svg::render(&series);
                if let Err(e) = std::fs::write(path, svg) {
                    eprintln!("cannot write {path}: {e}");
                }
                for (name, pts) in &series {
                    for p in pts {
                        println!(
                            "scaling {name}: {} procs: spawn p50 {:.2} ms, server RSS {:.1} MiB",
                            p.procs, p.spawn_ms, p.rss_mib
                        );
                    }
                }
            }
            Err(e) => {
                eprintln!("scaling failed: {e}");
                failed = true;
            }
        }
    }
    if failed {
        std::process::exit(1);
    }
}

fn print_table(table: &[(Scenario, BTreeMap<String, Vec<Outcome>>)], servers: &[server::Target]) {
    let mut names: Vec<String> = servers.iter().map(|s| s.name.clone()).collect();
    names.push("local".into());
    print!("| scenario | metric |");
    for n in &names {
        print!(" {n} |");
    }
    if names.len() >= 3 {
        print!(" {} / local | {} / {} |", names[0], names[0], names[1]);
    }
    println!();
    print!("|---|---|");
    for _ in &names {
        print!("---|");
    }
    if names.len() >= 3 {
        print!("---|---|");
    }
    println!();
    for (sc, per) in table {
        for (mi, metric) in sc.metrics().iter().enumerate() {
            print!("| {} | {} |", sc.name(), metric);
            let mut meds = Vec::new();
            for n in &names {
                let vals: Vec<f64> = per
                    .get(n)
                    .map(|v| v.iter().filter_map(|o| o.values.get(mi).copied()).collect())
                    .unwrap_or_default();
                let failed = per
                    .get(n)
                    .is_some_and(|v| v.iter().any(|o| o.error.is_some()));
                let m = median(vals);
                meds.push(m);
                if failed && m.is_nan() {
                    print!(" fails |");
                } else if m.is_nan() {
                    print!(" – |");
                } else {
                    print!(" {} |", fmt(m));
                }
            }
            if names.len() >= 3 {
                let ratio = |a: f64, b: f64| {
                    if a.is_nan() || b.is_nan() || b == 0.0 {
                        "–".to_string()
                    } else {
                        format!("{:.2}×", a / b)
                    }
                };
                print!(
                    " {} | {} |",
                    ratio(meds[0], meds[meds.len() - 1]),
                    ratio(meds[0], meds[1])
                );
            }
            println!();
        }
    }
}

fn fmt(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// Heap the driver touches once before measuring: 1 GiB (more than every
/// scenario holds at once, a 256 MiB message reservation included).
const WARM_HEAP_BYTES: usize = 1 << 30;

/// Touches [`WARM_HEAP_BYTES`] of heap and frees it, kept (see
/// [`tune_allocator`]): the driver's buffers then land in memory already
/// faulted in, whatever the order of its allocations. Without this, where
/// an 85 MiB `fs/readFile` reply landed decided whether its pages were new,
/// and the same server measured 250 or 670 MiB/s from one run to the next.
fn warm_heap() {
    let mut heap = Vec::<u8>::with_capacity(WARM_HEAP_BYTES);
    let room = heap.spare_capacity_mut();
    for page in room.chunks_mut(4096) {
        page[0].write(1);
    }
    // The writes must happen although nothing reads them.
    std::hint::black_box(&mut heap);
    drop(heap);
}

/// The driver's own allocations (a message of up to 171 KiB per output
/// chunk, and the 85 MiB of one whole-file message) reuse memory instead of
/// faulting in fresh pages each time: one heap, never mapped apart, never
/// given back. The driver's memory is not measured; its time is, and on a
/// virtual machine a fresh page can cost more than the copy into it. The
/// same for every server.
fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt changes allocator parameters only; called before any
    // thread starts.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
        libc::mallopt(libc::M_MMAP_MAX, 0);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
    }
}
