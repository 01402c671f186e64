//! The reference pages that cannot drift: docs/reference/cli.md's flag
//! tables are the binaries' own `--help` (the agent, the controller and the
//! kubectl plugin, as built), row for row. A flag added, renamed, removed or
//! given another default or environment variable without its row fails
//! here; `MOUNTGUARD_BLESS=1` rewrites the generated part of the page.

use std::path::{Path, PathBuf};
use std::process::Command;

use mountguard_tests::mountguard::{binary, kubectl_plugin};

/// Where the generated part of the page starts.
const MARKER: &str = "<!-- Generated from each command's --help by tests/tests/reference.rs; \
MOUNTGUARD_BLESS=1 cargo nextest run -p mountguard-tests --test reference rewrites it. -->";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// One option of a `--help` text.
#[derive(Debug, Default, PartialEq)]
struct Opt {
    flag: String,
    env: String,
    default: String,
    values: String,
    help: Vec<String>,
}

/// The options (and positional arguments) of clap's long help.
fn options(help: &str) -> Vec<Opt> {
    let mut out: Vec<Opt> = Vec::new();
    let mut in_opts = false;
    for line in help.lines() {
        if line == "Options:" || line == "Arguments:" {
            in_opts = true;
            continue;
        }
        if !in_opts || line.trim().is_empty() {
            continue;
        }
        if !line.starts_with(' ') {
            in_opts = false;
            continue;
        }
        let t = line.trim();
        let indent = line.len() - line.trim_start().len();
        if indent <= 6 && (t.starts_with('-') || t.starts_with('<') || t.starts_with('[')) {
            let name = t
                .split(", ")
                .last()
                .unwrap_or(t)
                .split_whitespace()
                .next()
                .unwrap_or(t);
            out.push(Opt {
                flag: name.to_string(),
                ..Default::default()
            });
        } else if let Some(o) = out.last_mut() {
            if let Some(v) = t.strip_prefix("[env: ").and_then(|v| v.strip_suffix(']')) {
                o.env = v.trim_end_matches('=').to_string();
            } else if let Some(v) = t
                .strip_prefix("[default: ")
                .and_then(|v| v.strip_suffix(']'))
            {
                o.default = v.to_string();
            } else if let Some(v) = t
                .strip_prefix("[possible values: ")
                .and_then(|v| v.strip_suffix(']'))
            {
                o.values = v.to_string();
            } else if !t.starts_with("- ") {
                o.help.push(t.to_string());
            } else {
                // A possible value's own help line (`- json: ...`).
                o.help.push(t.to_string());
            }
        }
    }
    out.retain(|o| o.flag != "--help" && o.flag != "--version");
    out
}

fn cell(s: &str) -> String {
    s.replace('|', "\\|")
}

fn table(title: &str, help: &str) -> String {
    let mut s =
        format!("### `{title}`\n\n| flag | env | default | description |\n|---|---|---|---|\n");
    for o in options(help) {
        let mut d = o.help.join(" ");
        if !o.values.is_empty() {
            d.push_str(&format!(" (one of: {})", o.values));
        }
        let tick = |v: &str| {
            if v.is_empty() {
                String::new()
            } else {
                format!("`{}`", cell(v))
            }
        };
        s.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            cell(&o.flag),
            tick(&o.env),
            tick(&o.default),
            cell(d.trim())
        ));
    }
    s
}

fn help_of(bin: &Path, args: &[&str]) -> String {
    let mut cmd = Command::new(bin);
    for (k, _) in std::env::vars() {
        if k.starts_with("MOUNTGUARD_") || k == "KUBECONFIG" {
            cmd.env_remove(k);
        }
    }
    let out = cmd
        .args(args)
        .arg("--help")
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
    assert!(
        out.status.success(),
        "{} {args:?} --help failed",
        bin.display()
    );
    String::from_utf8(out.stdout).expect("UTF-8 help")
}

/// The generated part of docs/reference/cli.md.
fn generated() -> String {
    let agent = binary("mountguard-agent").unwrap();
    let controller = binary("mountguard-controller").unwrap();
    let dir = tempfile_dir();
    let plugin = kubectl_plugin(&dir).unwrap();
    let mut s = format!("{MARKER}\n\n");
    for (bin, args, title) in [
        (&agent, &["run"][..], "mountguard-agent run"),
        (&agent, &["scan"][..], "mountguard-agent scan"),
        (&controller, &["run"][..], "mountguard-controller run"),
        (&controller, &["status"][..], "mountguard-controller status"),
        (&controller, &["wait"][..], "mountguard-controller wait"),
        (&controller, &["verify"][..], "mountguard-controller verify"),
        (&plugin, &["status"][..], "kubectl mountguard status"),
        (&plugin, &["wait"][..], "kubectl mountguard wait"),
    ] {
        s.push_str(&table(title, &help_of(bin, args)));
        s.push('\n');
    }
    let _ = std::fs::remove_dir_all(&dir);
    s.trim_end().to_string() + "\n"
}

fn tempfile_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("mg-reference-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn the_cli_reference_is_every_commands_own_help() {
    let path = repo().join("docs/reference/cli.md");
    let page = std::fs::read_to_string(&path).unwrap();
    let (head, doc) = page
        .split_once(MARKER)
        .unwrap_or_else(|| panic!("{} has no generated part (marker missing)", path.display()));
    let want = generated();
    let have = format!("{MARKER}{doc}");
    if std::env::var_os("MOUNTGUARD_BLESS").is_some() {
        std::fs::write(&path, format!("{head}{want}")).unwrap();
        return;
    }
    if have != want {
        let missing: Vec<&str> = want.lines().filter(|l| !have.contains(l)).collect();
        let extra: Vec<&str> = have.lines().filter(|l| !want.contains(l)).collect();
        panic!(
            "docs/reference/cli.md differs from the binaries' --help.\nmissing or changed rows:\n{}\nrows no binary has:\n{}\n(MOUNTGUARD_BLESS=1 rewrites the generated part)",
            missing.join("\n"),
            extra.join("\n")
        );
    }
}

#[test]
fn the_help_parser_reads_env_defaults_and_values() {
    let help = "Usage: x [OPTIONS]\n\nArguments:\n  <TARGET>\n          What to wait for\n\nOptions:\n      --output <OUTPUT>\n          Output format\n          \n          [default: table]\n          [possible values: table, json]\n\n  -v, --verbose\n          Say more\n          \n          [env: X_VERBOSE=]\n\n  -h, --help\n          Print help\n";
    let o = options(help);
    assert_eq!(o.len(), 3, "{o:?}");
    assert_eq!(o[0].flag, "<TARGET>");
    assert_eq!(
        (
            o[1].flag.as_str(),
            o[1].default.as_str(),
            o[1].values.as_str()
        ),
        ("--output", "table", "table, json")
    );
    assert_eq!(
        (o[2].flag.as_str(), o[2].env.as_str()),
        ("--verbose", "X_VERBOSE")
    );
}
