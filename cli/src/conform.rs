//! `locksim conform`: the simulated servers against the real ones (see `locksim_live::conform`).

use locksim_live::conform::client::etcd::EtcdClientSide;
use locksim_live::conform::client::kazoo::KazooClientSide;
use locksim_live::conform::client::netns::Netns;
use locksim_live::conform::client::sql::SqlClientSide;
use locksim_live::conform::client::zk::ZkClientSide;
use locksim_live::conform::client::{self, ClientFamily};
use locksim_live::conform::ensemble::etcd::EtcdCluster;
use locksim_live::conform::ensemble::sentinel::RedisSentinel;
use locksim_live::conform::ensemble::zk::ZkEnsemble;
use locksim_live::conform::ensemble::{self, EnsembleFamily};
use locksim_live::conform::etcd::Etcd;
use locksim_live::conform::redis::Redis;
use locksim_live::conform::sql::pgbouncer::Pgbouncer;
use locksim_live::conform::sql::Sql;
use locksim_live::conform::zk::Zk;
use locksim_live::conform::{check, coverage, replay_alone, script, script_for, Family, Outcome};
use locksim_live::servers::Server;
use serde::Serialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

#[derive(clap::Args)]
#[command(after_help = "Each seed draws a script of operations from several clients, with server restarts and \
                  stops between them, and plays it on the model and on the real server; the first answer \
                  that differs is a mismatch, printed with a shrunk script that still shows it.\n\n\
                  A client family (sql-client, zk-client, kazoo-client, etcd-client) plays a client library under a fault instead — a cut of its \
                  connection, its process killed, its host dead — on the model and for real, the real \
                  server and client in a network namespace of their own (root, `ip` and `nft` needed), and \
                  compares what each saw and when.\n\n\
                  An ensemble family (zk-ensemble, etcd-cluster) starts a real three-member ensemble for each \
                  seed — cuts a ZooKeeper follower off from its leader through the proxies on their peer links, \
                  or kills etcd's leader — and compares what its clients saw and when with the model's \
                  ensemble.\n\n\
                  The real servers come from Debian packages: run .ci/install-servers once (as root). \
                  locksim starts each in a temporary directory on a free loopback port and stops it at the \
                  end.\n\n\
                  Exit codes: 0 no seed mismatched and some were compared, 1 a mismatch or none compared, \
                  2 bad input or a server that would not start.")]
pub struct Args {
    /// Which server family to check.
    #[arg(default_value = ALL, value_parser = families())]
    family: String,
    /// Seeds to play: `A..B` (B exclusive) or one seed. Each takes a few seconds of real time.
    #[arg(long, default_value = "0..20", value_parser = super::parse_seeds)]
    seeds: std::ops::Range<u64>,
    /// Use the server already running at HOST:PORT instead of starting one; scripts are then played
    /// without their restarts and stops. Only with one family.
    #[arg(long)]
    server: Option<SocketAddr>,
    /// Write the counts and every mismatch to this JSON file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Seeds played at once, each on its own server (default: the number of cores; an ensemble family
    /// plays at most 2 at once, as each starts three servers). A seed mostly waits for its script's
    /// times, but a machine too busy to keep them makes seeds inconclusive.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=64))]
    jobs: Option<u16>,
}

/// A family `conform` checks, as its argument names it: the real server's model, or a client library.
struct Driver {
    name: &'static str,
    about: &'static str,
    /// A client or ensemble family: it plays on servers of its own, never on `--server`.
    own_servers: bool,
    run: fn(&Args) -> anyhow::Result<Report>,
}

impl Driver {
    const fn server<F: Family + Default + Sync>() -> Driver {
        Driver { name: F::NAME, about: F::ABOUT, own_servers: false, run: |args| family(&F::default(), args) }
    }

    const fn client<F: ClientFamily + Default>() -> Driver {
        Driver { name: F::NAME, about: F::ABOUT, own_servers: true, run: |args| client_family(&F::default(), args) }
    }

    const fn ensemble<F: EnsembleFamily + Default>() -> Driver {
        Driver { name: F::NAME, about: F::ABOUT, own_servers: true, run: |args| ensemble_family(&F::default(), args) }
    }
}

/// Every family, in the order `all` plays them: one line each.
const DRIVERS: &[Driver] = &[
    Driver::server::<Redis>(),
    Driver::server::<Zk>(),
    Driver::server::<Etcd>(),
    Driver::server::<Sql>(),
    Driver::server::<Pgbouncer>(),
    Driver::client::<SqlClientSide>(),
    Driver::client::<ZkClientSide>(),
    Driver::client::<KazooClientSide>(),
    Driver::client::<EtcdClientSide>(),
    Driver::ensemble::<ZkEnsemble>(),
    Driver::ensemble::<EtcdCluster>(),
    Driver::ensemble::<RedisSentinel>(),
];

/// `all`, then each driver, with its line of help.
fn families() -> clap::builder::PossibleValuesParser {
    let all = clap::builder::PossibleValue::new(ALL).help("Every family below.");
    let each = DRIVERS.iter().map(|d| clap::builder::PossibleValue::new(d.name).help(d.about));
    clap::builder::PossibleValuesParser::new(std::iter::once(all).chain(each))
}

const ALL: &str = "all";

/// What one family's run showed, as `--json` writes it.
#[derive(Serialize)]
struct Report {
    family: &'static str,
    seeds: std::ops::Range<u64>,
    agreed: u64,
    inconclusive: Vec<(u64, String)>,
    /// Seeds whose real answers were a slot late at one step in both plays, or (a client or ensemble
    /// family's timelines) that mismatched, beside other seeds, and were played again alone: their
    /// outcome is the replay's.
    replayed_alone: Vec<u64>,
    /// For each seed played again alone, what it showed beside the other seeds: the step, the model's
    /// answer and the real one — the evidence a replay that agreed set aside.
    beside_others: Vec<(u64, String)>,
    /// Seeds that agreed on everything compared, and the events the model alone drew from its seed
    /// where the real server's own scheduling decides (counted as agreed).
    drawn_alone: Vec<(u64, String)>,
    /// Played on a server locksim did not start: without restarts and stops.
    without_faults: bool,
    mismatches: Vec<Mismatch>,
    /// Steps played, by operation kind.
    coverage: BTreeMap<&'static str, u64>,
}

#[derive(Serialize)]
struct Mismatch {
    seed: u64,
    step: String,
    model: String,
    real: String,
    /// The shrunk script, one step per line.
    script: Vec<String>,
}

pub fn conform(args: Args) -> anyhow::Result<ExitCode> {
    if args.server.is_some() && args.family == ALL {
        anyhow::bail!("--server points at one server: name its family (e.g. `locksim conform redis --server …`)");
    }
    let chosen: Vec<&Driver> = DRIVERS.iter().filter(|d| args.family == ALL || d.name == args.family).collect();
    if args.server.is_some() && chosen.iter().any(|d| d.own_servers) {
        anyhow::bail!("--server: a client or ensemble family plays on servers of its own, which it cuts");
    }
    super::check_outputs([&args.json], [])?;
    let mut reports = Vec::new();
    let mut bad = 0;
    for d in chosen {
        // Each family's lines as soon as it is done: `all` runs for many minutes, and a log cut short
        // (a CI job's time limit) still says what was found.
        let r = (d.run)(&args)?;
        bad += r.mismatches.len();
        super::emit(&said(&r))?;
        if r.agreed == 0 && r.mismatches.is_empty() {
            // Nothing was compared: that is no evidence the model is right.
            super::emit(&format!("  {}: no seed could be compared\n", r.family))?;
            bad += 1;
        }
        reports.push(r);
    }
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&reports)? + "\n";
        std::fs::write(path, json).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    }
    Ok(if bad == 0 { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

fn family<F: Family + Sync>(family: &F, args: &Args) -> anyhow::Result<Report> {
    // One server per job: a script owns its server (it restarts and stops it).
    let jobs = if args.server.is_some() { 1 } else { super::jobs(args.jobs.map(|j| j.min(64))) };
    let counts: Mutex<BTreeMap<&'static str, u64>> = Mutex::new(BTreeMap::new());
    let start = || match args.server {
        Some(addr) => Server::external(F::server(), addr),
        None => Server::start(F::server()),
    };
    let outcomes = lanes(F::NAME, jobs, &args.seeds, start, |server, seed| {
        let outcome = check(family, server, seed)?;
        coverage::<F>(&script_for::<F>(server, seed), &mut counts.lock().expect("counts lock"));
        Ok(outcome)
    })?;
    let mut report = Report::new(F::NAME, args, counts.into_inner().expect("counts lock"));
    for (seed, mut outcome) in outcomes {
        // Late in both plays while other seeds ran beside it: once more alone, on a server of its own.
        // A mismatch again keeps the shrunk script found first.
        if let (Outcome::Mismatch { late: true, steps, step, model, real }, true) = (&outcome, jobs > 1) {
            report.replayed_alone.push(seed);
            report.beside_others.push((seed, format!("{}: model {model}, real {real}", steps[*step])));
            // `script_for` is `script` on a server of its own, as every job but `--server`'s has.
            match replay_alone(family, &script::<F>(seed))? {
                Outcome::Mismatch { .. } => {}
                alone => outcome = alone,
            }
        }
        match outcome {
            Outcome::Agree => report.agreed += 1,
            Outcome::Inconclusive(why) => report.inconclusive.push((seed, why)),
            Outcome::Mismatch { steps, step, model, real, .. } => report.mismatches.push(Mismatch {
                seed,
                step: steps[step].to_string(),
                model,
                real,
                script: steps.iter().map(ToString::to_string).collect(),
            }),
        }
    }
    Ok(report)
}

/// A client family: each job in a network namespace of its own, with its own server in it.
fn client_family<F: ClientFamily>(family: &F, args: &Args) -> anyhow::Result<Report> {
    let jobs = super::jobs(args.jobs.map(|j| j.min(64)));
    let counts: Mutex<BTreeMap<&'static str, u64>> = Mutex::new(BTreeMap::new());
    let start = || -> anyhow::Result<(Netns, Server)> {
        let net = Netns::enter()?;
        Ok((net, Server::start(F::server())?))
    };
    let outcomes = lanes(F::NAME, jobs, &args.seeds, start, |(net, server), seed| {
        *counts.lock().expect("counts lock").entry(F::kind(&client::plan::<F>(seed))).or_insert(0) += 1;
        client::check(family, server, net, seed)
    })?;
    let report = Report::new(F::NAME, args, counts.into_inner().expect("counts lock"));
    // On a thread of its own: entering a namespace is for good, for the thread that enters it.
    let alone = |seed| {
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    let (net, mut server) = start()?;
                    client::check(family, &mut server, &net, seed)
                })
                .join()
                .expect("a conformance replay panicked")
        })
    };
    timeline_report(report, outcomes, jobs, alone)
}

/// An ensemble family: each seed on a real ensemble of its own, started for it.
fn ensemble_family<F: EnsembleFamily>(family: &F, args: &Args) -> anyhow::Result<Report> {
    let jobs = super::jobs(args.jobs.map(|j| j.min(64))).min(F::AT_ONCE);
    let counts: Mutex<BTreeMap<&'static str, u64>> = Mutex::new(BTreeMap::new());
    let outcomes = lanes(
        F::NAME,
        jobs,
        &args.seeds,
        || Ok(()),
        |(), seed| {
            *counts.lock().expect("counts lock").entry(F::kind(&ensemble::plan::<F>(seed))).or_insert(0) += 1;
            ensemble::check(family, seed)
        },
    )?;
    let report = Report::new(F::NAME, args, counts.into_inner().expect("counts lock"));
    timeline_report(report, outcomes, jobs, |seed| ensemble::check(family, seed))
}

/// A report of timelines compared, seed by seed. A timeline is real time: a seed that mismatched while
/// other seeds ran beside it (`jobs` > 1) is played once more alone, and the replay's outcome counts —
/// a server that really differs from its model differs again alone; a machine too busy to keep the
/// plan's times rarely is twice.
fn timeline_report(
    mut report: Report,
    outcomes: BTreeMap<u64, client::Outcome>,
    jobs: usize,
    alone: impl Fn(u64) -> anyhow::Result<client::Outcome>,
) -> anyhow::Result<Report> {
    for (seed, mut outcome) in outcomes {
        if let (client::Outcome::Mismatch { why, .. }, true) = (&outcome, jobs > 1) {
            report.replayed_alone.push(seed);
            report.beside_others.push((seed, why.clone()));
            outcome = alone(seed)?;
        }
        match outcome {
            client::Outcome::Agree => report.agreed += 1,
            client::Outcome::DrawnAlone(what) => {
                report.agreed += 1;
                report.drawn_alone.push((seed, what));
            }
            client::Outcome::Inconclusive(why) => report.inconclusive.push((seed, why)),
            client::Outcome::Mismatch { plan, model, real, why } => report.mismatches.push(Mismatch {
                seed,
                step: why,
                model: format!("\n{model}"),
                real: format!("\n{real}"),
                script: vec![plan],
            }),
        }
    }
    Ok(report)
}

/// Play `seeds` on `jobs` lanes at once, each with what `start` gives it (its server), with a progress
/// bar; each seed's outcome.
fn lanes<S, O: Send>(
    name: &'static str,
    jobs: usize,
    seeds: &std::ops::Range<u64>,
    start: impl Fn() -> anyhow::Result<S> + Sync,
    check: impl Fn(&mut S, u64) -> anyhow::Result<O> + Sync,
) -> anyhow::Result<BTreeMap<u64, O>> {
    let bar = indicatif::ProgressBar::new(seeds.end - seeds.start);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} seeds of {msg}, eta {eta}")
            .expect("valid template"),
    );
    bar.set_message(name);
    let next = AtomicU64::new(seeds.start);
    let outcomes: Mutex<BTreeMap<u64, O>> = Mutex::new(BTreeMap::new());
    std::thread::scope(|scope| {
        let lanes: Vec<_> = (0..jobs)
            .map(|_| {
                scope.spawn(|| -> anyhow::Result<()> {
                    let mut lane = start()?;
                    let end = seeds.end;
                    while let Ok(seed) =
                        next.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |s| (s < end).then(|| s + 1))
                    {
                        let outcome = check(&mut lane, seed)?;
                        outcomes.lock().expect("outcomes lock").insert(seed, outcome);
                        bar.inc(1);
                    }
                    Ok(())
                })
            })
            .collect();
        lanes.into_iter().map(|l| l.join().expect("a conformance job panicked")).collect::<anyhow::Result<Vec<()>>>()
    })?;
    bar.finish_and_clear();
    Ok(outcomes.into_inner().expect("outcomes lock"))
}

impl Report {
    fn new(family: &'static str, args: &Args, coverage: BTreeMap<&'static str, u64>) -> Report {
        Report {
            family,
            seeds: args.seeds.clone(),
            agreed: 0,
            inconclusive: Vec::new(),
            replayed_alone: Vec::new(),
            beside_others: Vec::new(),
            drawn_alone: Vec::new(),
            without_faults: args.server.is_some(),
            mismatches: Vec::new(),
            coverage,
        }
    }
}

/// The lines `conform` prints for one family.
fn said(r: &Report) -> String {
    let n = r.seeds.end - r.seeds.start;
    let mut out = format!(
        "{}: {n} seed{} (seeds {}..{}): {} agreed, {} mismatched, {} inconclusive{}\n",
        r.family,
        if n == 1 { "" } else { "s" },
        r.seeds.start,
        r.seeds.end,
        r.agreed,
        r.mismatches.len(),
        r.inconclusive.len(),
        if r.without_faults { " (without restarts and stops: --server)" } else { "" }
    );
    let kinds: Vec<String> = r.coverage.iter().map(|(k, n)| format!("{k} {n}")).collect();
    out.push_str(&format!("  steps played: {}\n", kinds.join(", ")));
    for (seed, showed) in &r.beside_others {
        out.push_str(&format!(
            "  seed {seed} played again alone: it mismatched, or a step was answered a slot late in both plays, \
             beside other seeds (a busy machine, or a server that waits where the model does not); the replay's \
             outcome counts. Beside them it showed: {showed}\n"
        ));
    }
    for (seed, what) in &r.drawn_alone {
        out.push_str(&format!(
            "  seed {seed} agreed; the model alone drew {what} (an order its seed draws and a real member's \
             scheduler decides: not compared)\n"
        ));
    }
    for (seed, why) in &r.inconclusive {
        let because = match why.starts_with(client::UNDECIDED) {
            true => "",
            false => " (the machine was too busy to keep the script's times)",
        };
        out.push_str(&format!("  seed {seed} inconclusive: {why}{because}\n"));
    }
    for m in &r.mismatches {
        out.push_str(&format!(
            "  MISMATCH seed {}: {}\n    model: {}\n    real:  {}\n    shrunk script ({} steps):\n",
            m.seed,
            m.step.trim(),
            m.model,
            m.real,
            m.script.len()
        ));
        for line in &m.script {
            out.push_str(&format!("      {line}\n"));
        }
        out.push_str(&format!(
            "    reproduce: {} conform {} --seeds {}\n",
            locksim_reports::text::program(),
            r.family,
            m.seed
        ));
    }
    out
}
