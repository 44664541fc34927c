//! The run's outcome for people: a one-screen summary and a markdown report — writer
//! throughput and latency per phase and their ratio, the server's memory and CPU, the
//! hostile clients' outcomes by class and SQLSTATE, the checks of the stream, anomalies,
//! and the command that repeats the run.

use std::fmt::Write as _;
use std::time::Duration;

use super::run::{Phase, RunReport};
use super::tally::Class;
use super::timeline::SLOW;

/// The `q` quantile (0..=1) of `values` (nearest rank), if any.
pub fn quantile<T: Copy + Ord>(values: &[T], q: f64) -> Option<T> {
    let mut v = values.to_vec();
    v.sort_unstable();
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len().max(1));
    v.get(rank - 1).copied()
}

fn mib(bytes: Option<u64>) -> String {
    bytes.map_or("-".into(), |b| format!("{:.0} MiB", b as f64 / 1048576.0))
}

fn ms(us: u64) -> String {
    format!("{:.2} ms", us as f64 / 1000.0)
}

fn pct(r: Option<f64>) -> String {
    r.map_or("-".into(), |r| format!("{:.0}%", r * 100.0))
}

/// The command line that repeats this run.
pub fn reproduce(r: &RunReport) -> String {
    let c = &r.config;
    let mut s = format!(
        "cargo run -p sluice-tests --bin sluice-hostile -- --seed {} --secs {} --baseline-secs {} \
         --writers {} --fuzzers {} --deep {} --hungry {} --cancels {} --idle {} \
         --hostile-timeout-ms {}",
        c.seed,
        c.disturbed.as_secs(),
        c.baseline.as_secs(),
        c.writers,
        c.fuzzers,
        c.deep,
        c.hungry,
        c.cancels,
        c.idle,
        c.hostile_timeout.as_millis()
    );
    if let Some(b) = c.rss_bound {
        let _ = write!(s, " --rss-bound {b}");
    }
    for a in &c.server_args {
        let _ = write!(s, " --server-arg={a}");
    }
    s
}

/// Per-second acknowledgements: min and median over the phase's whole seconds.
fn per_second(p: &Phase) -> (Option<u64>, Option<u64>) {
    let s = &p.writes.per_second;
    (quantile(s, 0.0), quantile(s, 0.5))
}

fn latency(p: &Phase, q: f64) -> String {
    if p.writes.latency.is_empty() {
        return "-".into();
    }
    if q >= 1.0 {
        return ms(p.writes.latency.max());
    }
    ms(p.writes.latency.value_at_quantile(q))
}

fn cores(cpu: Duration, wall: Duration) -> String {
    format!("{:.2}", cpu.as_secs_f64() / wall.as_secs_f64().max(1e-9))
}

pub fn summary(r: &RunReport) -> String {
    let mut s = String::new();
    let c = &r.config;
    let _ = writeln!(
        s,
        "sluice-hostile: seed {}, baseline {} s, disturbed {} s, {} writers; {:.0} s in all",
        c.seed,
        c.baseline.as_secs(),
        c.disturbed.as_secs(),
        c.writers,
        r.elapsed.as_secs_f64()
    );
    for (name, p) in [("baseline", &r.baseline), ("disturbed", &r.disturbed)] {
        let Some(p) = p else { continue };
        let (min, p50) = per_second(p);
        let _ = writeln!(
            s,
            "  {name:<9} {:>8.0} rows/s (per second min {} p50 {}); latency p50 {} p99 {} \
             p99.9 {} max {}; RSS p99 {} peak {}; server CPU {} cores",
            p.writes.rate(),
            min.unwrap_or(0),
            p50.unwrap_or(0),
            latency(p, 0.5),
            latency(p, 0.99),
            latency(p, 0.999),
            latency(p, 1.0),
            mib(quantile(&p.usage.rss, 0.99)),
            mib(quantile(&p.usage.rss, 1.0)),
            cores(p.usage.server_cpu, p.usage.wall)
        );
    }
    let _ = writeln!(
        s,
        "  throughput ratio disturbed/baseline: {}; server RSS peak {} (VmHWM incl.)",
        pct(r.ratio()),
        mib(r.rss_peak())
    );
    if let Some(worst) = r.stalls.first() {
        let _ = writeln!(
            s,
            "  writer INSERTs of {} ms or more: {}, the longest {:.1} s at {:.1} s",
            SLOW.as_millis(),
            r.stall_count,
            worst.longest.as_secs_f64(),
            worst.span.start.as_secs_f64()
        );
    }
    for (class, t) in &r.tally {
        let _ = writeln!(
            s,
            "  {:<24} {:>7} attempts, {} unexpected",
            class.name(),
            t.attempts,
            t.unexpected_total()
        );
    }
    for v in &r.checks {
        match &v.result {
            Ok(c) => {
                let _ = writeln!(
                    s,
                    "  check {}: {} rows, {} acknowledged, {} lost, {} moved, {} problems",
                    v.when,
                    c.rows,
                    c.acknowledged,
                    c.lost,
                    c.moved,
                    c.problems().len()
                );
            }
            Err(e) => {
                let _ = writeln!(s, "  check {}: failed: {e}", v.when);
            }
        }
    }
    let _ = writeln!(s, "  anomalies: {}", r.anomalies.len());
    for a in &r.anomalies {
        let _ = writeln!(s, "    {a}");
    }
    if let Some(dir) = &r.kept {
        let _ = writeln!(
            s,
            "  data directory and server log kept in {}",
            dir.display()
        );
    }
    s
}

pub fn markdown(r: &RunReport) -> String {
    let mut s = String::new();
    let c = &r.config;
    let _ = writeln!(s, "# Sluice hostile load\n");
    let _ = writeln!(
        s,
        "Seed {}; {} writers alone for {} s (baseline), then beside {} fuzzers, {} deep-statement, \
         {} memory-hungry, {} cancel and {} idle clients for {} s (disturbed); hostile sessions \
         with `statement_timeout` {} ms; server arguments `{}`; {:.0} s in all.\n",
        c.seed,
        c.writers,
        c.baseline.as_secs(),
        c.fuzzers,
        c.deep,
        c.hungry,
        c.cancels,
        c.idle,
        c.disturbed.as_secs(),
        c.hostile_timeout.as_millis(),
        c.server_args.join(" "),
        r.elapsed.as_secs_f64()
    );
    let _ = writeln!(s, "Reproduce: `{}`\n", reproduce(r));
    let _ = writeln!(s, "## Summary\n");
    let _ = writeln!(s, "| measure | value |\n|---|---|");
    let _ = writeln!(s, "| anomalies | **{}** |", r.anomalies.len());
    let _ = writeln!(
        s,
        "| writer throughput, disturbed / baseline | **{}** (at least {:.0}% required) |",
        pct(r.ratio()),
        c.min_ratio * 100.0
    );
    let _ = writeln!(
        s,
        "| server RSS peak (samples and VmHWM) | {}{} |",
        mib(r.rss_peak()),
        c.rss_bound
            .map_or(String::new(), |b| format!(" (bound {})", mib(Some(b))))
    );
    for v in &r.checks {
        let value = match &v.result {
            Ok(c) => format!(
                "{} rows, {} acknowledged: {} lost, {} moved, {} duplicated, {} refused but \
                 present, {} unwritten, {} offsets out of place; unknown outcomes {} present / {} \
                 absent",
                c.rows,
                c.acknowledged,
                c.lost,
                c.moved,
                c.duplicated,
                c.refused_present,
                c.phantom,
                c.misplaced_offsets,
                c.unknown_present,
                c.unknown_absent
            ),
            Err(e) => format!("could not read the stream: {e}"),
        };
        let _ = writeln!(s, "| check {} | {value} |", v.when);
    }
    let _ = writeln!(s, "\n## Writers and server by phase\n");
    let _ = writeln!(s, "| measure | baseline | disturbed |\n|---|---|---|");
    let phases = [&r.baseline, &r.disturbed];
    let row = |s: &mut String, name: &str, f: &dyn Fn(&Phase) -> String| {
        let cells: Vec<String> = phases
            .iter()
            .map(|p| p.as_ref().map_or("-".into(), f))
            .collect();
        let _ = writeln!(s, "| {name} | {} |", cells.join(" | "));
    };
    row(&mut s, "rows/s (whole phase)", &|p| {
        format!("{:.0}", p.writes.rate())
    });
    row(&mut s, "rows/s per second: min", &|p| {
        per_second(p).0.map_or("-".into(), |v| v.to_string())
    });
    row(&mut s, "rows/s per second: p50", &|p| {
        per_second(p).1.map_or("-".into(), |v| v.to_string())
    });
    row(&mut s, "rows acknowledged", &|p| {
        p.writes.acks.len().to_string()
    });
    row(&mut s, "writer errors", &|p| {
        format!("{:?}", p.writes.errors)
    });
    for (name, q) in [
        ("latency p50", 0.5),
        ("latency p90", 0.9),
        ("latency p99", 0.99),
        ("latency p99.9", 0.999),
        ("latency max", 1.0),
    ] {
        row(&mut s, name, &|p| latency(p, q));
    }
    row(&mut s, "server RSS p50", &|p| {
        mib(quantile(&p.usage.rss, 0.5))
    });
    row(&mut s, "server RSS p99", &|p| {
        mib(quantile(&p.usage.rss, 0.99))
    });
    row(&mut s, "server RSS peak (1 s samples)", &|p| {
        mib(quantile(&p.usage.rss, 1.0))
    });
    row(&mut s, "server VmHWM at the phase's end", &|p| {
        mib(p.usage.peak_since_start)
    });
    row(&mut s, "server CPU (cores)", &|p| {
        cores(p.usage.server_cpu, p.usage.wall)
    });
    row(&mut s, "load generator CPU (cores)", &|p| {
        cores(p.usage.load_cpu, p.usage.wall)
    });
    row(&mut s, "probe login + SELECT 1: p50 / max", &|p| {
        let q = |x| quantile(&p.usage.probes, x).map_or("-".into(), |d| format!("{d:.1?}"));
        format!("{} / {}", q(0.5), q(1.0))
    });
    row(&mut s, "probe failures", &|p| {
        p.usage.probe_failures.to_string()
    });
    let _ = writeln!(
        s,
        "\nWriters run a closed loop (each sends its next INSERT when the last is acknowledged); \
         latency is from sending to the acknowledgement. RSS is sampled once a second; VmHWM is \
         the kernel's high-water mark since the server started. CPU is in cores used over the \
         phase (the load generator runs on the same machine).\n"
    );
    for (name, p) in [("baseline", &r.baseline), ("disturbed", &r.disturbed)] {
        if let Some(p) = p {
            let counts: Vec<String> = p.writes.per_second.iter().map(u64::to_string).collect();
            let _ = writeln!(
                s,
                "Acknowledgements per second, {name}: {}\n",
                counts.join(" ")
            );
        }
    }
    let _ = writeln!(s, "## Hostile clients\n");
    let _ = writeln!(
        s,
        "| class | attempts | expected | unexpected |\n|---|---|---|---|"
    );
    for class in Class::ALL {
        if let Some(t) = r.tally.get(&class) {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} |",
                class.name(),
                t.attempts,
                t.attempts - t.unexpected_total(),
                t.unexpected_total()
            );
        }
    }
    for class in Class::ALL {
        let Some(t) = r.tally.get(&class) else {
            continue;
        };
        let _ = writeln!(s, "\n### {}\n", class.name());
        let _ = writeln!(s, "| outcome | count |\n|---|---|");
        for (k, n) in &t.expected {
            let _ = writeln!(s, "| {} | {n} |", k.replace('|', "\\|"));
        }
        for (k, n) in &t.unexpected {
            let _ = writeln!(s, "| **unexpected:** {} | {n} |", k.replace('|', "\\|"));
        }
        if !t.examples.is_empty() {
            let _ = writeln!(s, "\nExamples of unexpected outcomes:\n");
            for e in &t.examples {
                let _ = writeln!(s, "- `{}`", e.replace('`', "'"));
            }
        }
    }
    let _ = writeln!(s, "\n## Worst writer stalls\n");
    let _ = writeln!(
        s,
        "{} writer INSERTs took {} ms or more. The worst episodes (overlapping stalls merged), \
         with the hostile statements, cancels and fuzz sessions of {} ms or more that ran \
         during each; times from the start of the run{}:\n",
        r.stall_count,
        SLOW.as_millis(),
        SLOW.as_millis(),
        r.disturbed_at.map_or(String::new(), |d| format!(
            " (the disturbed phase began at {:.1} s)",
            d.as_secs_f64()
        ))
    );
    if !r.stalls.is_empty() {
        let _ = writeln!(
            s,
            "| episode | stalled INSERTs | longest | running during it |\n|---|---|---|---|"
        );
    }
    let secs = |d: Duration| d.as_secs_f64();
    for e in &r.stalls {
        let during: Vec<String> = e
            .during
            .iter()
            .map(|h| {
                format!(
                    "{:.1}–{:.1} s: {}",
                    secs(h.start),
                    secs(h.start + h.took),
                    h.what.replace('|', "\\|").replace('`', "'")
                )
            })
            .collect();
        let _ = writeln!(
            s,
            "| {:.1}–{:.1} s | {} | {:.2} s | {} |",
            secs(e.span.start),
            secs(e.span.start + e.span.took),
            e.stalls,
            secs(e.longest),
            during.join("<br>")
        );
    }
    let _ = writeln!(s, "\n## Anomalies\n");
    if r.anomalies.is_empty() {
        let _ = writeln!(s, "None.");
    }
    for a in &r.anomalies {
        let _ = writeln!(s, "- {a}");
    }
    if !r.panics.is_empty() {
        let _ = writeln!(s, "\n## Panic lines in the server log\n");
        for p in &r.panics {
            let _ = writeln!(s, "- `{}`", p.replace('`', "'"));
        }
    }
    if let Some(dir) = &r.kept {
        let _ = writeln!(s, "\nData directory and server log: `{}`", dir.display());
    }
    s
}

#[cfg(test)]
mod tests {
    use super::quantile;

    #[test]
    fn quantiles_by_nearest_rank() {
        let v = [5u64, 1, 4, 2, 3];
        assert_eq!(quantile(&v, 0.0), Some(1));
        assert_eq!(quantile(&v, 0.5), Some(3));
        assert_eq!(quantile(&v, 0.99), Some(5));
        assert_eq!(quantile(&v, 1.0), Some(5));
        assert_eq!(quantile::<u64>(&[], 0.5), None);
    }
}
