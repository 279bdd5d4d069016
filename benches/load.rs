//! Load on the real `keyward serve` over loopback TLS: throughput, latency percentiles, and the
//! server's CPU and peak memory, for the resource requests in deploy/ and BENCHMARKS.md.
//!
//! Run: `cargo bench --bench load` (or `scripts/bench.sh`). Bounded: a fixed number of requests,
//! to loopback only, and it stops by itself. Knobs: KEYWARD_BENCH_REQUESTS (default 20000),
//! KEYWARD_BENCH_CONNECTIONS (default 8), KEYWARD_BENCH_HANDSHAKES (default 1000).
#![allow(clippy::unwrap_used)] // a panic is the benchmark failure report

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use support::*;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// (utime + stime) in seconds, and peak RSS in KiB, of a process.
fn process_usage(pid: u32) -> (f64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let hwm = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    (ticks / 100.0, hwm)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn report(name: &str, mut latencies: Vec<Duration>, wall: Duration, cpu: f64) {
    latencies.sort();
    let n = latencies.len() as f64;
    println!(
        "| {name} | {} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {:.1} |",
        latencies.len(),
        n / wall.as_secs_f64(),
        percentile(&latencies, 0.50).as_secs_f64() * 1e3,
        percentile(&latencies, 0.90).as_secs_f64() * 1e3,
        percentile(&latencies, 0.99).as_secs_f64() * 1e3,
        latencies.last().unwrap().as_secs_f64() * 1e3,
        cpu / n * 1e6,
    );
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let requests = env_or("KEYWARD_BENCH_REQUESTS", 20_000);
    let connections = env_or("KEYWARD_BENCH_CONNECTIONS", 8).max(1);
    let handshakes = env_or("KEYWARD_BENCH_HANDSHAKES", 1_000);
    let tls = TlsDir::new();
    let server = tls.start(&[]);
    let pid = server.pid();
    let review = std::sync::Arc::new(fixture("admissionreview-lmeval.json"));
    let (_, idle_rss) = process_usage(pid);

    println!("| scenario | requests | req/s | p50 ms | p90 ms | p99 ms | max ms | server CPU µs/req |");
    println!("|---|---|---|---|---|---|---|---|");

    // Keep-alive, as the apiserver does: `connections` clients share the requests.
    let (cpu0, _) = process_usage(pid);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..connections {
        let (endpoint, review) = (server.endpoint.clone(), review.clone());
        let share = requests / connections + usize::from(c < requests % connections);
        tasks.push(tokio::spawn(async move {
            let (mut client, _) = endpoint.connect().await.unwrap();
            let mut latencies = Vec::with_capacity(share);
            for _ in 0..share {
                let t = Instant::now();
                let r = client.mutate(&review).await.unwrap();
                assert_eq!(r["response"]["allowed"], true);
                latencies.push(t.elapsed());
            }
            latencies
        }));
    }
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await.unwrap());
    }
    let wall = started.elapsed();
    let (cpu1, _) = process_usage(pid);
    report(&format!("keep-alive, {connections} connections, inject (LMEvalJob pod)"), latencies, wall, cpu1 - cpu0);

    // A new TLS connection per request: the worst case (the apiserver reuses connections).
    let started = Instant::now();
    let mut latencies = Vec::with_capacity(handshakes);
    for _ in 0..handshakes {
        let t = Instant::now();
        let (mut client, _) = server.endpoint.connect().await.unwrap();
        client.mutate(&review).await.unwrap();
        latencies.push(t.elapsed());
    }
    let wall = started.elapsed();
    let (cpu2, peak_rss) = process_usage(pid);
    report("new TLS connection per request, 1 client", latencies, wall, cpu2 - cpu1);

    println!();
    println!("server memory: {idle_rss} KiB peak RSS idle (after start-up), {peak_rss} KiB peak RSS after the load");
}
