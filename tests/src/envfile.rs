//! The `env` file of a local cluster (`mountguard-local-cluster`,
//! `scripts/local-cluster.sh`): `export KEY='value'` lines, so that after
//! `. env` the programs a reader runs next (`helm`, `kubectl`) see them,
//! and a line that puts a directory of programs first on `PATH`.

/// A value quoted for a POSIX shell.
fn shell_quote(v: &str) -> String {
    format!("'{}'", v.replace('\'', r"'\''"))
}

/// The file's text for `vars`.
pub fn write(vars: &[(&str, String)]) -> String {
    vars.iter()
        .map(|(k, v)| format!("export {k}={}\n", shell_quote(v)))
        .collect()
}

/// The line that puts `dir` first on the reader's `PATH`.
pub fn path_first(dir: &std::path::Path) -> String {
    format!(
        "export PATH={}:\"$PATH\"\n",
        shell_quote(&dir.display().to_string())
    )
}

/// The `(KEY, value)` pairs of a file [`write`] wrote (also reads the
/// older `KEY='value'` lines without `export`).
pub fn parse(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(|l| l.strip_prefix("export ").unwrap_or(l))
        .filter(|l| !l.starts_with("PATH="))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| {
            let v = v
                .strip_prefix('\'')
                .and_then(|v| v.strip_suffix('\''))
                .unwrap_or(v);
            (k.to_string(), v.replace(r"'\''", "'"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `. env` then `helm status`: helm is a child process, so it sees
    /// KUBECONFIG only when the file exports it.
    #[test]
    fn a_program_started_after_sourcing_the_env_file_sees_kubeconfig() {
        let dir = std::env::temp_dir().join(format!("mg-envfile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("env");
        let vars = [
            ("KUBECONFIG", "/tmp/it's here/kubeconfig".to_string()),
            ("HELM", "/opt/helm".to_string()),
        ];
        std::fs::write(&path, write(&vars)).unwrap();
        let out = std::process::Command::new("bash")
            .arg("-c")
            .arg(format!(
                ". '{}' && bash -c 'printf %s \"$KUBECONFIG\"'",
                path.display()
            ))
            .env_remove("KUBECONFIG")
            .output()
            .unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "/tmp/it's here/kubeconfig",
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let back = parse(&write(&vars));
        assert_eq!(back[0], ("KUBECONFIG".into(), vars[0].1.clone()));
        assert_eq!(back[1], ("HELM".into(), "/opt/helm".into()));
    }

    /// `. env` then `kubectl`: the directory of the cluster's programs
    /// comes first on PATH, the reader's PATH after it.
    #[test]
    fn the_programs_directory_comes_first_on_path() {
        let text = format!(
            "{}{}",
            write(&[("HELM", "/opt/helm".to_string())]),
            path_first(std::path::Path::new("/opt/it's/bin"))
        );
        let out = std::process::Command::new("bash")
            .arg("-c")
            .arg(format!("{text}printf %s \"$PATH\""))
            .env("PATH", "/usr/bin:/bin")
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "/opt/it's/bin:/usr/bin:/bin"
        );
        assert_eq!(
            parse(&text),
            [("HELM".to_string(), "/opt/helm".to_string())]
        );
    }
}
