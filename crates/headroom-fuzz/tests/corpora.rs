//! Replays every input of the checked-in fuzz corpora (`fuzz/corpus/TARGET/`)
//! through its target on stable: what a fuzzer once found stays fixed.

use std::path::PathBuf;

#[test]
fn every_corpus_input_passes_its_target() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus");
    let mut total = 0;
    for (name, target) in headroom_fuzz::TARGETS {
        let dir = root.join(name);
        let inputs: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        assert!(!inputs.is_empty(), "{name} has an empty corpus");
        for p in &inputs {
            let data = std::fs::read(p).unwrap();
            let r = std::panic::catch_unwind(|| target(&data));
            assert!(r.is_ok(), "{name}: {} fails", p.display());
        }
        total += inputs.len();
        eprintln!("{name}: {} inputs", inputs.len());
    }
    eprintln!("{total} corpus inputs replayed");
}
