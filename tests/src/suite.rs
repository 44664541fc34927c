//! What the load binaries (`sluice-chaos`, `sluice-hostile`) share: running a suite to its
//! report.

use std::future::Future;
use std::path::Path;

/// Runs `suite` on a 4-thread runtime until it ends or Ctrl-C (which drops it: its servers
/// are killed and their directories removed), prints `summary`, writes `markdown` to `out`,
/// and exits: 1 if `failed`, 130 when interrupted, 2 if the report cannot be written.
pub fn run_to_report<R>(
    suite: impl Future<Output = R>,
    out: Option<&Path>,
    summary: fn(&R) -> String,
    markdown: fn(&R) -> String,
    failed: fn(&R) -> bool,
) -> ! {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let result = runtime.block_on(async {
        tokio::select! {
            r = suite => Some(r),
            _ = tokio::signal::ctrl_c() => None,
        }
    });
    let Some(result) = result else {
        eprintln!("interrupted");
        std::process::exit(130);
    };
    print!("{}", summary(&result));
    if let Some(out) = out {
        if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
            let _ = std::fs::create_dir_all(dir);
        }
        match std::fs::write(out, markdown(&result)) {
            Ok(()) => println!("report written to {}", out.display()),
            Err(e) => {
                eprintln!("write {}: {e}", out.display());
                std::process::exit(2);
            }
        }
    }
    std::process::exit(i32::from(failed(&result)));
}
