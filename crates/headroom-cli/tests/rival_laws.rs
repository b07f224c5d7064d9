//! `headroom plan` says when the template it planned from holds a size law its recording
//! cannot tell from another that gives other bytes at the planned model's heads
//! (`headroom_plan::program_template::law_ambiguity`): in the text under what planned it, and
//! in `--json` beside the template's key.

use assert_cmd::Command;
use headroom_plan::model::preset;
use headroom_plan::program_template::law_ambiguity::caveat;
use serde_json::Value;

fn plan(args: &[&str]) -> (String, Value) {
    let run = |json: bool| {
        let out = Command::cargo_bin("headroom")
            .unwrap()
            .arg("plan")
            .args(args)
            .args(if json { &["--json"][..] } else { &[][..] })
            .output()
            .unwrap();
        assert!(out.status.code().unwrap() < 2, "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        out.stdout
    };
    (String::from_utf8(run(false)).unwrap(), serde_json::from_slice(&run(true)).unwrap())
}

/// Each plan, training and inference, carries the caveat exactly where the planner finds one
/// for its template at its model: the sentence in the text and `--json`, and the count. Gemma
/// 2B's templates were recorded at 4 heads over 2 and are read at its 8 heads over 1
/// (`headroom-plan`'s `tests/law_ambiguity.rs` lists them until they are recorded again).
#[test]
fn a_plan_from_a_template_whose_laws_read_two_ways_says_so() {
    for (model, infer) in [("gemma-2b", true), ("gemma-2b", false), ("llama-3-8b", true), ("gemma-7b", true)] {
        let mut args = vec!["--model", model, "--gpu", "a100-80gb", "--framework", "hf", "--seq", "512"];
        if infer {
            args.push("--infer");
        }
        let (text, v) = plan(&args);
        let source = if infer { &v["planned_from"] } else { &v["program"] };
        let key = source["template"].as_str().unwrap_or_else(|| panic!("{args:?}: no template: {source}"));
        match caveat(key, &preset(model).unwrap()) {
            Some(c) => {
                assert!(c.tensors > 0);
                assert!(text.contains(&format!("caveat: {}", c.describe())), "{args:?}: {text}");
                assert_eq!(source["caveat"], c.describe(), "{args:?}");
                assert_eq!(source["rival_law_tensors"], c.tensors, "{args:?}");
                assert!(c.describe().contains(key) && c.describe().contains("15 heads over 5"));
            }
            None => {
                assert!(!text.contains("caveat: the recorded template"), "{args:?}: {text}");
                assert!(source.get("caveat").is_none() && source.get("rival_law_tensors").is_none(), "{source}");
            }
        }
    }
}
