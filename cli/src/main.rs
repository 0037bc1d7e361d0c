//! `locksim`: run lock recipes against simulated backends under injected faults, and check the result.

fn main() -> std::process::ExitCode {
    locksim_cli::main(locksim_locks::Registry::builtin())
}
