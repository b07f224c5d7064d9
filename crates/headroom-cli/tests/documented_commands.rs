//! Every command the documentation shows — in README.md's and docs/'s code blocks, as
//! runnable inline code, and in each command's `--help` examples — runs and exits as
//! documented: 0 or 1 (an answer), never 2 (bad input), never a panic or an abort. Where
//! the README shows what a command prints (a plain block right after a block of that one
//! command), it prints that. Commands run in a scratch directory holding the repository's
//! `data/` and nothing else a fresh clone lacks; lines with `...` elide arguments and are
//! skipped.

use assert_cmd::Command;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

const CARGO_RUN: &str = "cargo run --release -p headroom-cli -- ";

/// The command lines of a markdown file: code-block lines and inline spans that run headroom.
fn from_markdown(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_block = false;
    for line in text.lines() {
        if line.starts_with("```") {
            in_block = !in_block;
            continue;
        }
        if in_block {
            if line.starts_with("headroom ") || line.starts_with(CARGO_RUN) {
                out.push(line.to_string());
            }
        } else {
            for (i, span) in line.split('`').enumerate() {
                if i % 2 == 1 && span.starts_with(CARGO_RUN) {
                    out.push(span.to_string());
                }
            }
        }
    }
    out
}

/// The examples of `headroom COMMAND --help`, rejoined where the help text wrapped them.
fn from_help(command: &[&str]) -> Vec<String> {
    let out = Command::cargo_bin("headroom").unwrap().args(command).arg("--help").output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let examples = text.split_once("Example").map(|(_, e)| e).unwrap_or("");
    let mut lines: Vec<String> = Vec::new();
    for l in examples.lines().skip(1) {
        let l = l.trim();
        if l.starts_with("headroom ") {
            lines.push(l.to_string());
        } else if let Some(last) = lines.last_mut() {
            if !l.is_empty() {
                last.push(' ');
                last.push_str(l);
            }
        }
    }
    lines
}

/// Splits a shell line into arguments (single quotes only, as the docs use), dropping a `#` comment.
fn words(line: &str) -> Vec<String> {
    let mut args = Vec::new();
    let mut cur = String::new();
    let (mut quoted, mut started) = (false, false);
    for c in line.chars() {
        match c {
            '\'' => {
                quoted = !quoted;
                started = true;
            }
            '#' if !quoted && !started => break,
            c if c.is_whitespace() && !quoted => {
                if started {
                    args.push(std::mem::take(&mut cur));
                    started = false;
                }
            }
            c => {
                cur.push(c);
                started = true;
            }
        }
    }
    if started {
        args.push(cur);
    }
    args
}

fn scratch() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path();
    #[cfg(unix)]
    std::os::unix::fs::symlink(repo().join("data"), p.join("data")).unwrap();
    dir
}

/// Runs a documented command line in `dir`; its stdout.
fn run(line: &str, dir: &Path) -> String {
    let line = line.strip_prefix(CARGO_RUN).unwrap_or(line);
    let mut args = words(line);
    if args.first().map(String::as_str) == Some("headroom") {
        args.remove(0);
    }
    // `> FILE` is the shell's: the command's output is checked, not written there.
    if let Some(at) = args.iter().position(|a| a == ">") {
        args.truncate(at);
    }
    let out = Command::cargo_bin("headroom").unwrap().args(&args).current_dir(dir).output().unwrap();
    let code = out.status.code();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(matches!(code, Some(0 | 1)), "`{line}` exited {code:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "`{line}`: {stderr}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn run_all(lines: &[String], dir: &Path) -> usize {
    let mut ran = 0;
    for line in lines.iter().filter(|l| !l.contains("...")) {
        run(line, dir);
        ran += 1;
    }
    ran
}

/// The README's shown outputs: (command, the lines shown) for each plain block that
/// follows a block of exactly one command.
fn shown_outputs(text: &str) -> Vec<(String, Vec<String>)> {
    let mut blocks: Vec<(String, Vec<String>)> = Vec::new();
    let mut current: Option<(String, Vec<String>)> = None;
    for line in text.lines() {
        if let Some(lang) = line.strip_prefix("```") {
            match current.take() {
                Some(b) => blocks.push(b),
                None => current = Some((lang.to_string(), Vec::new())),
            }
        } else if let Some((_, lines)) = current.as_mut() {
            lines.push(line.to_string());
        }
    }
    let mut out = Vec::new();
    for pair in blocks.windows(2) {
        let ((lang, cmd), (plain, shown)) = (&pair[0], &pair[1]);
        let commands: Vec<&String> = cmd.iter().filter(|l| !l.trim().is_empty()).collect();
        if lang == "sh" && plain.is_empty() && commands.len() == 1 {
            out.push((commands[0].clone(), shown.clone()));
        }
    }
    out
}

#[test]
fn every_documented_command_runs_as_documented() {
    let mut lines = Vec::new();
    let mut docs: Vec<PathBuf> = vec![repo().join("README.md")];
    docs.extend(std::fs::read_dir(repo().join("docs")).unwrap().map(|e| e.unwrap().path()));
    for doc in docs.iter().filter(|p| p.extension().is_some_and(|e| e == "md")) {
        lines.extend(from_markdown(&std::fs::read_to_string(doc).unwrap()));
    }
    for command in
        [&["plan"][..], &["replay"], &["inspect"], &["kv", "simulate"], &["checkpoint"], &["completions"], &["man"]]
    {
        let examples = from_help(command);
        assert!(!examples.is_empty(), "{command:?} --help shows examples");
        lines.extend(examples);
    }
    let dir = scratch();
    let ran = run_all(&lines, dir.path());
    eprintln!("{ran} documented commands ran");
    assert!(ran >= 20, "only {ran} commands found");

    // What the README shows a command printing, it prints: each shown line in order
    // (`...` stands for lines left out).
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let shown = shown_outputs(&readme);
    assert!(shown.len() >= 3, "outputs shown: {}", shown.len());
    for (command, lines) in shown {
        let printed = run(&command, dir.path());
        let mut rest = printed.lines().map(str::trim_end);
        for want in lines.iter().map(|l| l.trim_end()).filter(|l| l.trim() != "...") {
            assert!(
                rest.any(|got| got == want),
                "`{command}` does not print, in this order:\n{want}\nIt printed:\n{printed}"
            );
        }
    }
}

#[test]
fn the_readme_counts_the_presets_the_planner_has() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let n: usize = readme
        .split("Models from ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .expect("the README says how many presets");
    assert_eq!(n, headroom_plan::model::presets().len(), "README.md's preset count");
}

#[test]
fn shell_words_and_comments() {
    assert_eq!(
        words("replay t.jsonl --alloc-conf '' --json   # a comment"),
        ["replay", "t.jsonl", "--alloc-conf", "", "--json"]
    );
    assert_eq!(words("--alloc-conf 'a b'"), ["--alloc-conf", "a b"]);
}
