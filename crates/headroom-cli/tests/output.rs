//! Standard output as the shell gives it: closed early by a pipe, or full. Output is written
//! in one place, so neither is a panic.

mod support;

use support::*;

#[test]
fn closed_or_full_output_is_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let r = sh("$H kv simulate --model llama-3-8b --gpu h100-sxm --requests 5 | head -c 10 > /dev/null", dir.path());
    assert_eq!(r.code, 0, "{}", r.stderr);
    let t = gpt2_trace().display().to_string();
    let c = gpt2_chain().display().to_string();
    for script in [
        format!("$H replay {t} --json | head -c 100 > /dev/null"),
        format!("$H checkpoint {c} --budget 20GiB --slots 50 --schedule | head -1 > /dev/null"),
        "$H plan --help | head -1 > /dev/null".to_string(),
    ] {
        let r = sh(&script, dir.path());
        assert_eq!(r.code, 0, "{script}: {}", r.stderr);
        assert!(r.stderr.is_empty(), "{script}: {}", r.stderr);
    }
    // The status of the command itself, its reader gone: 1 for a plan that does not fit.
    let r = sh("$H plan --model llama-3-70b --gpu l4 > /dev/null; echo $?", dir.path());
    assert_eq!(r.stdout.trim(), "1");
    if Path::new("/dev/full").exists() {
        for cmd in ["plan --model llama-3-8b --gpu h100-sxm", &format!("replay {t} --json")] {
            sh(&format!("$H {cmd} > /dev/full"), dir.path())
                .expect(2, "error: writing the output: No space left on device");
        }
    }
}
