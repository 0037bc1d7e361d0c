//! `locksim`: run lock recipes against simulated backends under injected faults, and check the result.

mod cli;

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    // A panic inside a simulation is a harness bug, reported once as an error with exit code 2 (the
    // runner names the seed); hundreds of seeds must not each print a backtrace.
    std::panic::set_hook(Box::new(|info| {
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| eprintln!("locksim: internal error: {info}"));
    }));
    let args = cli::Cli::parse();
    match cli::dispatch(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("locksim: {e:#}");
            ExitCode::from(2)
        }
    }
}
