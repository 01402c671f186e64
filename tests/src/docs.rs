//! The shell commands of the user docs, as a test runs them: every fenced
//! `sh` block of a page, split into the commands a reader types (lines
//! joined at a trailing `\`, comments dropped; a here-document, and a
//! `for`/`while` loop or `if` up to its `done` or `fi`, is one command with
//! its lines kept as written), and a bash script that runs them one after
//! the other as a reader would, reporting each command that failed.
//!
//! A command whose last pipeline stage is `grep` and that exits 1 found no
//! line, and `kubectl mountguard status` that exits 1 found a verdict that
//! needs attention (docs/reference/cli.md, "Exit codes"): those are
//! answers, not failures. A command sent to the background
//! (`... &`, a `kubectl port-forward`) gets two seconds before the next one,
//! as a reader gives it, and is stopped when the block ends.

/// One fenced `sh`/`bash` block of a page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    /// Its first line's number in the page (1-based), for messages.
    pub line: usize,
    /// The commands, in order.
    pub commands: Vec<String>,
}

/// The fenced `sh` and `bash` blocks of a Markdown page.
pub fn shell_blocks(page: &str) -> Vec<Block> {
    let mut out = Vec::new();
    // (first line, indentation of the fence, lines without it)
    let mut open: Option<(usize, usize, Vec<String>)> = None;
    for (i, line) in page.lines().enumerate() {
        let t = line.trim();
        if let Some(lang) = t.strip_prefix("```") {
            match open.take() {
                Some((start, _, lines)) => out.push(Block {
                    line: start,
                    commands: commands(&lines),
                }),
                None => {
                    let indent = line.len() - line.trim_start().len();
                    let start = if matches!(lang.trim(), "sh" | "bash") {
                        i + 2
                    } else {
                        0
                    };
                    open = Some((start, indent, Vec::new()));
                }
            }
            continue;
        }
        if let Some((_, indent, lines)) = open.as_mut() {
            let cut = line.len() - line.trim_start().len();
            lines.push(line[cut.min(*indent)..].trim_end().to_string());
        }
    }
    out.retain(|b| b.line > 0 && !b.commands.is_empty());
    out
}

/// The delimiter of the here-document `line` opens (`<<EOF`, `<<'EOF'`,
/// `<<-EOF`), if any; a here-string (`<<<`) opens none.
fn heredoc_delimiter(line: &str) -> Option<String> {
    let code = line.split(" #").next().unwrap_or(line);
    let at = code.find("<<")?;
    let rest = &code[at + 2..];
    if rest.starts_with('<') {
        return None;
    }
    let word: String = rest
        .trim_start_matches('-')
        .trim_start()
        .trim_start_matches(['\'', '"'])
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!word.is_empty()).then_some(word)
}

/// How many compound commands `line` opens (`for`/`while`/`until`/`if`
/// at its start) minus how many it closes (`done`/`fi` as a word of it).
fn depth_change(line: &str) -> i32 {
    let code = line.split(" #").next().unwrap_or(line);
    let words: Vec<&str> = code
        .split(|c: char| c.is_whitespace() || c == ';')
        .filter(|w| !w.is_empty())
        .collect();
    let opens = words
        .first()
        .is_some_and(|w| matches!(*w, "for" | "while" | "until" | "if")) as i32;
    let closes = words
        .iter()
        .filter(|w| matches!(**w, "done" | "fi"))
        .count() as i32;
    opens - closes
}

/// The commands of a block's lines: continuation lines joined, comment
/// lines and empty lines dropped; a here-document's lines, and the lines
/// of a compound command up to its end, kept as written.
fn commands(lines: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut heredoc: Option<String> = None;
    let mut depth = 0;
    for raw in lines {
        if let Some(end) = &heredoc {
            current.push_str(raw);
            current.push('\n');
            if raw.trim() == end {
                heredoc = None;
                if depth == 0 {
                    out.push(std::mem::take(&mut current).trim_end().to_string());
                }
            }
            continue;
        }
        let l = raw.trim();
        if current.is_empty() && (l.is_empty() || l.starts_with('#')) {
            continue;
        }
        if let Some(head) = l.strip_suffix('\\') {
            current.push_str(head.trim_end());
            current.push(' ');
            continue;
        }
        current.push_str(l);
        depth += depth_change(l);
        if let Some(end) = heredoc_delimiter(l) {
            heredoc = Some(end);
            current.push('\n');
            continue;
        }
        if depth > 0 {
            current.push('\n');
            continue;
        }
        depth = 0;
        out.push(std::mem::take(&mut current));
    }
    if !current.trim().is_empty() {
        out.push(current.trim().to_string());
    }
    out
}

/// Whether `cmd` runs in the background (`... &`).
fn background(cmd: &str) -> bool {
    let code = cmd.split(" #").next().unwrap_or(cmd).trim_end();
    code.ends_with('&') && !code.ends_with("&&")
}

/// Whether exit code 1 of `cmd` is an answer: the last stage of its
/// pipeline is `grep` (no line matched) or `kubectl mountguard status` (a
/// verdict needs attention).
fn one_is_an_answer(cmd: &str) -> bool {
    let code = cmd.split(" #").next().unwrap_or(cmd);
    if code.contains("&&") || code.contains("||") || code.contains(';') {
        return false;
    }
    let last = code.rsplit('|').next().unwrap_or("").trim_start();
    last.split_whitespace().next() == Some("grep") || last.starts_with("kubectl mountguard status")
}

/// The bash script that runs `commands` in order: after each, a failure
/// (see the module docs) prints `MG-FAILED <index> <exit code>` on
/// stderr; the script exits 1 when one failed.
pub fn script(commands: &[String]) -> String {
    let mut s = String::from(
        "failed=0\ntrap 'kill $(jobs -p) 2>/dev/null' EXIT\n\
         check() { if [ \"$2\" != 0 ] && ! { [ \"$2\" = 1 ] && [ \"$3\" = answer ]; }; then \
         echo \"MG-FAILED $1 $2\" >&2; failed=1; fi; }\n",
    );
    for (i, c) in commands.iter().enumerate() {
        s.push_str(c);
        s.push('\n');
        if background(c) {
            s.push_str("sleep 2\n");
        } else {
            let last = if one_is_an_answer(c) { "answer" } else { "-" };
            s.push_str(&format!("check {i} $? {last}\n"));
        }
    }
    s.push_str("exit $failed\n");
    s
}

/// What [`run_block`] saw: the failures, each as `` `command` exited N ``
/// (then the block's output), or why the block did not finish; and what
/// the block printed on stdout.
#[derive(Debug, Default)]
pub struct BlockRun {
    /// Empty when every command succeeded or gave an answer.
    pub failures: Vec<String>,
    /// The block's standard output.
    pub stdout: String,
}

/// Runs one block's `commands` with bash as [`script`] writes them, in
/// `cwd`, with no environment but `env`, for at most `timeout`.
pub async fn run_block(
    commands: &[String],
    cwd: &std::path::Path,
    env: &[(&str, String)],
    timeout: std::time::Duration,
) -> BlockRun {
    let mut cmd = tokio::process::Command::new("bash");
    cmd.arg("-c")
        .arg(script(commands))
        .current_dir(cwd)
        .env_clear()
        .kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = match tokio::time::timeout(timeout, cmd.output()).await {
        Err(_) => {
            return BlockRun {
                failures: vec![format!("still running after {timeout:?}")],
                ..BlockRun::default()
            };
        }
        Ok(Err(e)) => {
            return BlockRun {
                failures: vec![format!("bash: {e}")],
                ..BlockRun::default()
            };
        }
        Ok(Ok(out)) => out,
    };
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let failed = failures(&stderr);
    let mut lines: Vec<String> = failed
        .iter()
        .map(|(i, code)| format!("`{}` exited {code}", commands[*i]))
        .collect();
    if !out.status.success() && failed.is_empty() {
        lines.push(format!("the block failed: {stderr}"));
    }
    if !failed.is_empty() {
        lines.push(format!("  its output:\n{stdout}\n{stderr}"));
    }
    BlockRun {
        failures: lines,
        stdout,
    }
}

/// The indices and exit codes `script`'s run reported failed (its stderr).
pub fn failures(stderr: &str) -> Vec<(usize, i32)> {
    stderr
        .lines()
        .filter_map(|l| {
            let mut w = l.strip_prefix("MG-FAILED ")?.split_whitespace();
            Some((w.next()?.parse().ok()?, w.next()?.parse().ok()?))
        })
        .collect()
}

/// `text` with each placeholder (an upper-case word of `map`, not part of
/// a longer word and not a shell variable: `$WORD`, `WORD=`) replaced.
pub fn substitute(text: &str, map: &[(&str, &str)]) -> String {
    let mut out = text.to_string();
    for (from, to) in map {
        let mut next = String::with_capacity(out.len());
        let mut rest = out.as_str();
        while let Some(at) = rest.find(from) {
            let before = rest[..at].chars().next_back();
            let after = rest[at + from.len()..].chars().next();
            let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
            next.push_str(&rest[..at]);
            if word(before) || before == Some('$') || word(after) || after == Some('=') {
                next.push_str(from);
            } else {
                next.push_str(to);
            }
            rest = &rest[at + from.len()..];
        }
        next.push_str(rest);
        out = next;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_join_continuations_and_drop_comments() {
        let page = "text\n```sh\n# a comment\nPOD=$(kubectl get pods \\\n  -o name)\n\nkubectl logs \"$POD\"  # trailing\n```\n```yaml\nkind: Pod\n```\n```\nplain\n```\n";
        let b = shell_blocks(page);
        assert_eq!(b.len(), 1, "{b:?}");
        assert_eq!(b[0].line, 3);
        assert_eq!(
            b[0].commands,
            [
                "POD=$(kubectl get pods -o name)",
                "kubectl logs \"$POD\"  # trailing"
            ]
        );
    }

    #[test]
    fn here_documents_and_loops_are_one_command_with_their_lines_as_written() {
        let page = "1. A list item:\n   ```sh\n   cat > a.yaml <<'EOF'\n   kind: Pod\n   spec:\n     x: 1\n   EOF\n   for n in a b; do\n   kubectl apply -f - <<EOF\n   metadata: {name: $n}\n   EOF\n   done\n   echo <<< no-heredoc\n   if true; then echo y; fi\n   ```\n";
        let b = shell_blocks(page);
        assert_eq!(b.len(), 1, "{b:?}");
        assert_eq!(
            b[0].commands,
            [
                "cat > a.yaml <<'EOF'\nkind: Pod\nspec:\n  x: 1\nEOF",
                "for n in a b; do\nkubectl apply -f - <<EOF\nmetadata: {name: $n}\nEOF\ndone",
                "echo <<< no-heredoc",
                "if true; then echo y; fi",
            ]
        );
        let dir = tempfile::tempdir().unwrap();
        let out = std::process::Command::new("bash")
            .arg("-c")
            .arg(script(&b[0].commands[..1]))
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        assert_eq!(
            std::fs::read_to_string(dir.path().join("a.yaml")).unwrap(),
            "kind: Pod\nspec:\n  x: 1\n"
        );
    }

    #[test]
    fn the_script_checks_each_command_and_takes_documented_answers() {
        let cmds = [
            "kubectl port-forward svc/x 8080 &".to_string(),
            "curl -s localhost:8080 | grep -i nothing".to_string(),
            "false".to_string(),
        ];
        let s = script(&cmds);
        assert!(s.contains("&\nsleep 2\n"), "{s}");
        assert!(s.contains("check 1 $? answer\n"), "{s}");
        assert!(s.contains("check 2 $? -\n"), "{s}");
        let out = std::process::Command::new("bash")
            .arg("-c")
            .arg(script(&[
                "printf 'a\\n' | grep b".to_string(),
                "true".to_string(),
                "sh -c 'exit 3'".to_string(),
                "printf 'a\\n' | grep -q a && false".to_string(),
            ]))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1));
        assert_eq!(
            failures(&String::from_utf8_lossy(&out.stderr)),
            [(2, 3), (3, 1)]
        );
        assert!(one_is_an_answer(
            "kubectl mountguard status --namespace demo"
        ));
        assert!(!one_is_an_answer("kubectl mountguard wait secret/x"));
    }

    #[test]
    fn placeholders_are_words_never_variables() {
        let map = [("NODE", "node-0"), ("POD", "web-1"), ("NS", "shop")];
        assert_eq!(
            substitute(
                "POD=x; kubectl -n NS get pod POD; logs \"$POD\"; --node NODE; NODESET NS_X",
                &map
            ),
            "POD=x; kubectl -n shop get pod web-1; logs \"$POD\"; --node node-0; NODESET NS_X"
        );
    }
}
