//! docs/architecture.md's module table covers every source file, and
//! names none that is gone: a newcomer finds each file's concern there.
//!
//! A file `src/a/b.rs` is covered by a row whose first cell names
//! `` `a/b.rs` ``; or names a directory or module above it (`` `a/` ``,
//! `` `a.rs` `` for `a/`, or a relative directory as in
//! `` `sandbox/launcher.rs` + `launcher/` ``) and whose text names
//! `` `b.rs` `` (or a path ending in it); or, in a first cell that names
//! `` `a/x.rs` ``, by a bare `` `b.rs` `` beside it. Unit tests
//! (`tests.rs`, the convention in AGENTS.md) are their module's.

use std::collections::BTreeSet;
use std::path::Path;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file under src/, relative to it.
fn sources() -> BTreeSet<String> {
    fn walk(dir: &Path, base: &Path, out: &mut BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).expect("read src") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                walk(&path, base, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(base).expect("under src");
                out.insert(rel.to_string_lossy().into_owned());
            }
        }
    }
    let mut out = BTreeSet::new();
    let src = repo().join("src");
    walk(&src, &src, &mut out);
    out
}

/// The backticked words of `text`.
fn ticked(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

struct Row {
    /// Full paths named in the first cell (`a/b.rs`), directories (`a/`),
    /// and bare file names beside them.
    first: Vec<String>,
    text: String,
}

fn rows(doc: &str) -> Vec<Row> {
    doc.lines()
        .filter(|l| l.starts_with("| `"))
        .map(|line| {
            let first = line.split('|').nth(1).unwrap_or_default();
            Row {
                first: ticked(first).iter().map(|s| s.to_string()).collect(),
                text: line.to_string(),
            }
        })
        .collect()
}

/// The directories (without the trailing `/`) and modules (without `.rs`)
/// a row's first cell names, relative entries (`launcher/`) taken in the
/// directory of the cell's full paths.
fn anchors(row: &Row) -> Vec<String> {
    let src = repo().join("src");
    let full: Vec<&String> = row.first.iter().filter(|e| e.contains('/')).collect();
    let mut out = Vec::new();
    for entry in &full {
        let bare = entry
            .trim_end_matches('/')
            .trim_end_matches(".rs")
            .to_string();
        if src.join(entry.as_str()).exists() {
            out.push(bare.clone());
        }
        // `sandbox/launcher.rs` + `launcher/`: a relative directory.
        for base in &full {
            if let Some((parent, _)) = base.rsplit_once('/') {
                let joined = format!("{parent}/{bare}");
                if !entry.starts_with(parent) && src.join(&joined).is_dir() {
                    out.push(joined);
                }
            }
        }
    }
    out
}

fn covered(file: &str, rows: &[Row], doc: &str) -> bool {
    let (dir, name) = file.rsplit_once('/').unwrap_or(("", file));
    if name == "tests.rs" || doc.contains(&format!("`src/{file}`")) {
        return true;
    }
    rows.iter().any(|row| {
        if row.first.iter().any(|e| e == file) {
            return true;
        }
        let words = ticked(&row.text);
        let named = words
            .iter()
            .any(|w| *w == name || file.ends_with(&format!("/{w}")));
        let under = anchors(row)
            .iter()
            .any(|a| file.starts_with(&format!("{a}/")));
        // A bare name beside a full path of the same directory.
        let beside = !dir.is_empty()
            && row.first.iter().any(|e| e == name)
            && row
                .first
                .iter()
                .any(|e| e.starts_with(&format!("{dir}/")) && e.ends_with(".rs"));
        (under && named) || beside
    })
}

#[test]
fn every_source_file_is_in_the_module_table() {
    let doc = std::fs::read_to_string(repo().join("docs/architecture.md")).expect("read");
    let rows = rows(&doc);
    let missing: Vec<String> = sources()
        .into_iter()
        .filter(|f| !covered(f, &rows, &doc))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/architecture.md's module table does not name these files (add a row saying what each holds): {missing:#?}"
    );
}

#[test]
fn the_module_table_names_no_file_that_is_gone() {
    let doc = std::fs::read_to_string(repo().join("docs/architecture.md")).expect("read");
    let src = repo().join("src");
    let gone: Vec<String> = rows(&doc)
        .iter()
        .flat_map(|row| {
            let dirs: Vec<String> = row
                .first
                .iter()
                .filter_map(|e| e.rsplit_once('/').map(|(d, _)| d.to_string()))
                .collect();
            row.first
                .iter()
                .filter(|e| e.contains('/') && (e.ends_with(".rs") || e.ends_with('/')))
                .filter(|e| {
                    // As named, or relative to the directory of a full path
                    // beside it (`launcher/`).
                    !src.join(e.as_str()).exists()
                        && !dirs.iter().any(|d| src.join(d).join(e.as_str()).exists())
                })
                .cloned()
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(gone.is_empty(), "rows for files that are gone: {gone:?}");
}
