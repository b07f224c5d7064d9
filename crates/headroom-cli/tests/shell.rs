//! `headroom completions` and `headroom man`: generated from the command
//! definition, they name every subcommand, and the scripts parse in their shells.

use assert_cmd::Command;
mod support;
use support::*;

const SUBCOMMANDS: [&str; 7] = ["plan", "replay", "inspect", "kv", "checkpoint", "completions", "man"];

fn stdout(args: &[&str]) -> String {
    let out = Command::cargo_bin("headroom").unwrap().args(args).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn completion_scripts_name_every_subcommand_and_parse() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let script = stdout(&["completions", shell]);
        for sub in SUBCOMMANDS {
            assert!(script.contains(sub), "{shell}: no {sub}");
        }
        // Flags of a subcommand complete too.
        assert!(script.contains("max-batch"), "{shell}: plan's flags");
    }
    // bash -n parses without running; skipped where bash is absent.
    if std::process::Command::new("bash").arg("--version").output().is_ok() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("headroom.bash");
        std::fs::write(&path, stdout(&["completions", "bash"])).unwrap();
        let check = std::process::Command::new("bash").arg("-n").arg(&path).output().unwrap();
        assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stderr));
    }
}

#[test]
fn an_unknown_shell_is_refused_by_name() {
    let out = Command::cargo_bin("headroom").unwrap().args(["completions", "tcsh"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("tcsh"));
}

#[test]
fn the_man_pages_name_every_subcommand_and_each_has_its_own() {
    let page = stdout(&["man"]);
    assert!(page.contains(".TH headroom 1"), "{page}");
    for sub in SUBCOMMANDS {
        assert!(page.contains(&format!("headroom\\-{sub}(1)")), "headroom.1 does not list {sub}");
    }
    let plan = stdout(&["man", "plan"]);
    assert!(plan.contains(".TH headroom-plan 1") && plan.contains("max\\-batch"), "{plan}");
    assert!(stdout(&["man", "kv", "simulate"]).contains(".TH headroom-kv-simulate 1"));
    let dir = tempfile::tempdir().unwrap();
    let listed = stdout(&["man", "--out-dir", dir.path().to_str().unwrap()]);
    for sub in SUBCOMMANDS
        .iter()
        .map(|s| format!("headroom-{s}.1"))
        .chain(["headroom.1".into(), "headroom-kv-simulate.1".into()])
    {
        let path = dir.path().join(&sub);
        assert!(path.is_file() && listed.contains(path.to_str().unwrap()), "{sub} not written");
    }
    let out = Command::cargo_bin("headroom").unwrap().args(["man", "nope"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no command `nope`"));
}

#[test]
fn man_pages_are_written_whole_or_not_at_all() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir_all(d.join("out/headroom-plan.1")).unwrap();
    headroom_in(d, &["man", "--out-dir", "out"]).expect(2, "headroom-plan.1");
    let left: Vec<_> = std::fs::read_dir(d.join("out")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, ["headroom-plan.1"], "nothing written beside the blocker");
    let r = headroom_in(d, &["man", "--out-dir", "pages"]);
    assert_eq!(r.code, 0);
    let pages = std::fs::read_dir(d.join("pages")).unwrap().count();
    assert!(pages >= 8 && r.stdout.lines().count() == pages, "{pages} pages: {}", r.stdout);
}
