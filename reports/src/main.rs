//! `locksim`: run lock recipes against simulated backends under injected faults, and check the result.

mod cli;

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    match cli::dispatch(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("locksim: {e:#}");
            ExitCode::from(2)
        }
    }
}
