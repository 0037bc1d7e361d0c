//! Running the `locksim` binary from the repository root, as users and CI scripts do.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

pub fn locksim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_locksim")).args(args).current_dir(root()).output().expect("locksim runs")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `locksim` with the environment variable `var` set to `value`.
pub fn locksim_with_env(args: &[&str], var: &str, value: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_locksim"))
        .args(args)
        .env(var, value)
        .current_dir(root())
        .output()
        .expect("locksim runs")
}

/// A scenario file named `name` in a temporary directory of its own, removed when the directory is dropped.
pub fn scenario_file(name: &str, text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::Builder::new().prefix("locksim-test-").tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    (dir, path)
}
