//! `cairn`: the operator and developer entry point of Cairn.
//!
//! Subcommands so far: `cairn store mkfs|info|scrub` (one OSD's local store) and
//! `cairn bench store` (the store benchmark, with raw-device baselines in the same run).

mod bench;
mod size;
mod store_cmd;
mod torture;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "cairn",
    version,
    about = "Cairn: a scale-out storage cluster for flash",
    long_about = "Cairn: a scale-out storage cluster for flash.\n\n\
        Exit status: 0 on success, 1 on an error (printed on one line to stderr), \
        2 on a usage error, 3 when `store scrub` found damaged data."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Format, inspect and verify a local object store (the store an OSD runs on).
    #[command(subcommand)]
    Store(store_cmd::StoreCmd),
    /// Benchmarks, each reported against a raw baseline measured in the same run.
    #[command(subcommand)]
    Bench(BenchCmd),
}

#[derive(Subcommand)]
enum BenchCmd {
    /// Benchmark cairn-store on files in two directories (--help: workloads, baselines, JSON).
    #[command(long_about = bench::LONG_ABOUT)]
    Store(bench::BenchStoreArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Store(c) => store_cmd::run(c),
        Cmd::Bench(BenchCmd::Store(a)) => bench::run(a).map(|()| ExitCode::SUCCESS),
    };
    match r {
        Ok(code) => code,
        Err(e) => {
            eprintln!("cairn: error: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes on one line ("what: why: root cause"), skipping a cause whose
/// text the line already holds (some errors print their source themselves).
fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let s = cause.to_string();
        if line.contains(&s) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&s);
    }
    line.replace('\n', " ")
}
