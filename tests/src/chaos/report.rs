//! The run's outcome for people: a one-screen summary and a markdown report (rounds,
//! per-nemesis counts and timings, operation outcomes, anomalies, how to reproduce).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use super::checker::quantile;
use super::run::{RunReport, ACK_BOUND};

fn ms(d: Option<Duration>) -> String {
    d.map_or("-".into(), |d| format!("{} ms", d.as_millis()))
}

fn pct(a: Option<f64>) -> String {
    a.map_or("-".into(), |a| format!("{:.0}%", a * 100.0))
}

/// The command line that repeats this run.
pub fn reproduce(r: &RunReport) -> String {
    let names: Vec<&str> = r.config.nemeses.iter().map(|n| n.name()).collect();
    format!(
        "cargo run -p sluice-tests --bin sluice-chaos -- --rounds {} --seed {} --nodes {} \
         --fault-secs {} --nemeses {}",
        r.config.rounds,
        r.config.seed,
        r.config.nodes,
        r.config.fault.as_secs(),
        names.join(",")
    )
}

/// Per nemesis: rounds, failovers and availabilities.
type Stats = (usize, Vec<Duration>, Vec<f64>, usize);

fn per_nemesis(r: &RunReport) -> BTreeMap<&'static str, Stats> {
    let mut by: BTreeMap<&'static str, Stats> = BTreeMap::new();
    for round in &r.rounds {
        let e = by.entry(round.fault.nemesis.name()).or_default();
        e.0 += 1;
        e.1.extend(round.failover);
        e.2.extend(round.availability);
        e.3 += round.anomalies;
    }
    by
}

pub fn summary(r: &RunReport) -> String {
    let mut s = String::new();
    let failovers: Vec<Duration> = r.rounds.iter().filter_map(|x| x.failover).collect();
    let _ = writeln!(
        s,
        "sluice-chaos: {} rounds, seed {}, {} nodes, {:.0}s",
        r.rounds.len(),
        r.config.seed,
        r.config.nodes,
        r.elapsed.as_secs_f64()
    );
    let _ = writeln!(
        s,
        "  appends: {} ok, {} failed, {} unknown ({} of them applied); {} rows in the log",
        r.ops.ok, r.ops.failed, r.ops.unknown, r.unknown.present, r.rows
    );
    let _ = writeln!(
        s,
        "  bank: {} of {} transfers committed, {} reads; {} terms seen; {} tail COPYs",
        r.bank.0, r.bank.1, r.bank_reads, r.terms, r.tail_copies
    );
    let _ = writeln!(
        s,
        "  failover p50 {} p99 {} max {}",
        ms(quantile(&failovers, 0.5)),
        ms(quantile(&failovers, 0.99)),
        ms(quantile(&failovers, 1.0))
    );
    for (name, (n, f, _, a)) in per_nemesis(r) {
        let _ = writeln!(
            s,
            "  {name:<19} {n:>3} rounds, failover max {:>9}, {a} anomalies",
            ms(quantile(&f, 1.0))
        );
    }
    let _ = writeln!(s, "  anomalies: {}", r.anomalies.len());
    for a in &r.anomalies {
        let _ = writeln!(s, "    round {} ({}): {}", a.round, a.nemesis, a.what);
    }
    if let Some(dir) = &r.kept {
        let _ = writeln!(s, "  node data and logs kept in {}", dir.display());
    }
    s
}

pub fn markdown(r: &RunReport) -> String {
    let mut s = String::new();
    let c = &r.config;
    let _ = writeln!(s, "# Sluice chaos run\n");
    let _ = writeln!(
        s,
        "Seed {}, {} nodes, {} rounds, faults of {} s, {} appenders and {} bank clients, \
         servers with `--checkpoint-entries 200`; {:.0} s in all.\n",
        c.seed,
        c.nodes,
        r.rounds.len(),
        c.fault.as_secs(),
        c.appenders,
        c.transfers,
        r.elapsed.as_secs_f64()
    );
    let _ = writeln!(s, "Reproduce: `{}`\n", reproduce(r));
    let _ = writeln!(s, "## Summary\n");
    let _ = writeln!(s, "| measure | value |\n|---|---|");
    let _ = writeln!(s, "| anomalies | **{}** |", r.anomalies.len());
    let _ = writeln!(s, "| appends acknowledged | {} |", r.ops.ok);
    let _ = writeln!(s, "| appends failed (not applied) | {} |", r.ops.failed);
    let _ = writeln!(
        s,
        "| appends with unknown outcome | {} ({} applied, {} not) |",
        r.ops.unknown, r.unknown.present, r.unknown.absent
    );
    let _ = writeln!(s, "| rows in the log | {} |", r.rows);
    let _ = writeln!(
        s,
        "| bank transfers committed / attempted | {} / {} |",
        r.bank.0, r.bank.1
    );
    let _ = writeln!(s, "| bank invariant reads | {} |", r.bank_reads);
    let _ = writeln!(s, "| Raft terms with a leader seen | {} |", r.terms);
    let _ = writeln!(
        s,
        "| tail COPY statements (1 per node + reconnects) | {} |",
        r.tail_copies
    );
    let failovers: Vec<Duration> = r.rounds.iter().filter_map(|x| x.failover).collect();
    let avail: Vec<f64> = r.rounds.iter().filter_map(|x| x.availability).collect();
    let _ = writeln!(
        s,
        "| failover p50 / p99 / max | {} / {} / {} |",
        ms(quantile(&failovers, 0.5)),
        ms(quantile(&failovers, 0.99)),
        ms(quantile(&failovers, 1.0))
    );
    let _ = writeln!(
        s,
        "| write availability during faults (mean) | {} |\n",
        pct((!avail.is_empty()).then(|| avail.iter().sum::<f64>() / avail.len() as f64))
    );
    let _ = writeln!(
        s,
        "Failover: fault start to the first acknowledgement of an append sent after it. \
         Availability: share of 100 ms windows of the fault with at least one acknowledged \
         append. Leader-kill rounds must fail over within {} s, and every membership step \
         must be followed by an acknowledged append within {} s.\n",
        ACK_BOUND.as_secs(),
        ACK_BOUND.as_secs()
    );
    let _ = writeln!(s, "## Per nemesis\n");
    let _ = writeln!(
        s,
        "| nemesis | rounds | failover p50 | p99 | max | availability mean | min | anomalies |\n|---|---|---|---|---|---|---|---|"
    );
    for (name, (n, f, a, anomalies)) in per_nemesis(r) {
        let mean = (!a.is_empty()).then(|| a.iter().sum::<f64>() / a.len() as f64);
        let min = a.iter().copied().reduce(f64::min);
        let _ = writeln!(
            s,
            "| {name} | {n} | {} | {} | {} | {} | {} | {anomalies} |",
            ms(quantile(&f, 0.5)),
            ms(quantile(&f, 0.99)),
            ms(quantile(&f, 1.0)),
            pct(mean),
            pct(min)
        );
    }
    let _ = writeln!(s, "\n## Anomalies\n");
    if r.anomalies.is_empty() {
        let _ = writeln!(s, "None.");
    }
    for a in &r.anomalies {
        let _ = writeln!(s, "- round {} ({}): {}", a.round, a.nemesis, a.what);
    }
    if let Some(dir) = &r.kept {
        let _ = writeln!(s, "\nNode data and logs: `{}`", dir.display());
    }
    let _ = writeln!(s, "\n## Rounds\n");
    let _ = writeln!(
        s,
        "| # | nemesis | target | fault | ok | failed | unknown | failover | availability | membership step → next ack | anomalies | s |\n|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for x in &r.rounds {
        let steps: Vec<String> = x
            .step_acks
            .iter()
            .map(|(step, d)| format!("{step} → {}", ms(*d)))
            .collect();
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.1}–{:.1} s | {} | {} | {} | {} | {} | {} | {} | {:.1} |",
            x.index,
            x.fault.nemesis.name(),
            x.fault.target,
            x.fault.start.as_secs_f64(),
            x.fault.heal.as_secs_f64(),
            x.ops.ok,
            x.ops.failed,
            x.ops.unknown,
            ms(x.failover),
            pct(x.availability),
            steps.join("<br>"),
            x.anomalies,
            x.elapsed.as_secs_f64()
        );
    }
    let notes: Vec<String> = r
        .rounds
        .iter()
        .flat_map(|x| {
            x.fault
                .notes
                .iter()
                .map(move |n| format!("- round {}: {n}", x.index))
        })
        .collect();
    if !notes.is_empty() {
        let _ = writeln!(s, "\n## Nemesis notes\n\n{}", notes.join("\n"));
    }
    s
}
