//! `mountguard-demo`: the seed scenario on the cluster in a box with the
//! real agent and controller, narrated (or summarised as JSON with
//! `--json`). Needs nothing but cargo:
//! `cargo run -p mountguard-tests --bin mountguard-demo`.

use std::process::ExitCode;

use mountguard_tests::demo::{DemoOptions, Narrator, Remediation, run_seed};

const USAGE: &str = "usage: mountguard-demo [--detect-only] [--json]

Starts a 3-node cluster in a box (API server, kubelet, NodeSet and slurmrestd
doubles), one mountguard agent per node and the mountguard controller, then
rotates the immutable Secret slurm-auth-slurm while a second pod on node-0
references it, and shows what mountguard reports. By default the controller
runs with --remediation on and the NodeSet opts in: it drains, replaces,
verifies on the node and undrains the workers a replacement can fix, and
reports the pinned node instead of looping.

  --detect-only  remediation off: report only, then replace two slurmd pods
                 by hand to show which node a replacement fixes
  --remediate    remediation on (the default)
  --json         print a machine-readable summary (verdicts, Events,
                 metrics, remediation attempts) instead of the narration
  --help         this text

Logs: MOUNTGUARD_LOG=info (tracing filter syntax) prints component logs on stderr.";

fn main() -> ExitCode {
    let mut json = false;
    let mut remediation = Remediation::On;
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--json" => json = true,
            "--detect-only" => remediation = Remediation::Off,
            "--remediate" => remediation = Remediation::On,
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            other => {
                eprintln!("error: unknown argument {other:?}\n\n{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    if let Ok(filter) = std::env::var("MOUNTGUARD_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .try_init();
    }
    let opts = DemoOptions {
        remediation,
        ..DemoOptions::default()
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut say = Narrator::new(json);
    match rt.block_on(run_seed(&opts, &mut say)) {
        Ok(summary) => {
            if json {
                match serde_json::to_string_pretty(&summary) {
                    Ok(s) => println!("{s}"),
                    Err(e) => {
                        eprintln!("error: encoding the summary: {e}");
                        return ExitCode::FAILURE;
                    }
                }
            } else {
                say.say(format!(
                    "done: stale verdicts {:.1}s, metric {:.1}s, Events {:.1}s after the rotation (grace {:.0}s)",
                    summary.timings.verdicts_after_rotation_seconds,
                    summary.timings.metric_after_rotation_seconds,
                    summary.timings.events_after_rotation_seconds,
                    summary.timings.grace_seconds
                ));
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            for line in say.lines() {
                eprintln!("{line}");
            }
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
