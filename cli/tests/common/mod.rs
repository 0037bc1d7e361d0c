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

/// A run of locksim whose processes — locksim, the server it starts, the client processes and whatever
/// they start — all carry a mark in their environment, with its temporary files in a directory of its own.
pub struct Marked {
    mark: String,
    tmp: tempfile::TempDir,
}

impl Marked {
    pub fn new() -> Marked {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        Marked { mark: format!("locksim-test-{}-{nanos}", std::process::id()), tmp: tempfile::tempdir().unwrap() }
    }

    pub fn command(&self, args: &[&str]) -> std::process::Command {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_locksim"));
        cmd.args(args).current_dir(root()).env("LOCKSIM_TEST_MARK", &self.mark).env("TMPDIR", self.tmp.path());
        cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
        cmd
    }

    /// Live processes (zombies hold no port or file) with the mark in their environment.
    pub fn processes(&self) -> Vec<String> {
        let needle = format!("LOCKSIM_TEST_MARK={}", self.mark);
        let mut found = Vec::new();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let proc = entry.path();
            let Ok(environ) = std::fs::read(proc.join("environ")) else { continue };
            if !environ.split(|b| *b == 0).any(|v| v == needle.as_bytes()) {
                continue;
            }
            let stat = std::fs::read_to_string(proc.join("stat")).unwrap_or_default();
            let state = stat.rsplit_once(") ").map_or("", |(_, rest)| &rest[..1]);
            if state != "Z" {
                let cmdline = std::fs::read(proc.join("cmdline")).unwrap_or_default();
                found.push(String::from_utf8_lossy(&cmdline).replace('\0', " "));
            }
        }
        found
    }

    /// Nothing marked still runs (given a moment: a parent-death signal is delivered asynchronously),
    /// and the temporary directory is empty.
    pub fn assert_nothing_left(&self, case: &str) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut left = self.processes();
        while !left.is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(100));
            left = self.processes();
        }
        assert!(left.is_empty(), "{case}: processes left behind: {left:#?}");
        let files: Vec<_> = std::fs::read_dir(self.tmp.path()).unwrap().flatten().map(|e| e.path()).collect();
        assert!(files.is_empty(), "{case}: temporary files left behind: {files:?}");
    }
}
