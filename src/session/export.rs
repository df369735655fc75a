//! Exporting a branch: the cells from the root to one cell, as a Jupyter
//! notebook (nbformat 4.5, with the outputs, values and images the session
//! still keeps) or as a script in the percent format (`# %%` cells). Only
//! cells that ended ok are written, so the export runs top to bottom as
//! the state was built.

use serde_json::json;

use super::error::SessionError;
use super::kept::KeptResults;
use super::lineage::{PathCell, ranges};
use super::manager::SessionManager;
use super::report::CellStatus;
use super::source::StoredSource;
use super::state::{Session, SessionState};
use crate::worker::Language;

/// The formats of an export.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ExportFormat {
    Ipynb,
    Py,
}

/// An export: the document, and what it holds.
pub struct Export {
    pub text: String,
    pub cells: Vec<u64>,
    /// Cells of the branch left out (failed, interrupted, crashed).
    pub skipped: Vec<u64>,
}

impl SessionManager {
    /// The branch from the root to `cell` (default: the current head) of
    /// session `name`, as a document.
    pub fn export(
        &self,
        name: &str,
        cell: Option<u64>,
        format: ExportFormat,
    ) -> Result<Export, SessionError> {
        let sess = self.existing(name)?;
        let mut st = sess.lock();
        self.refresh(&sess, &mut st);
        export_branch(&sess, &st, name, cell, format)
    }
}

/// The branch ending at `head` (default: the current one) of a session as
/// a notebook (the viewer's download); None for a cell not in its tree.
pub(super) fn notebook_of(sess: &Session, st: &SessionState, head: Option<u64>) -> Option<String> {
    export_branch(sess, st, &sess.name, head, ExportFormat::Ipynb)
        .ok()
        .map(|e| e.text)
}

fn export_branch(
    sess: &Session,
    st: &SessionState,
    name: &str,
    cell: Option<u64>,
    format: ExportFormat,
) -> Result<Export, SessionError> {
    {
        let chain: Vec<PathCell> = match cell {
            Some(id) => st.lineage.chain_to(id).map(|(c, _)| c).ok_or_else(|| {
                SessionError::Invalid(format!(
                    "cell {id} is not a finished cell of session '{name}'; python_history lists its cells"
                ))
            })?,
            None => st.lineage.path().to_vec(),
        };
        let (ok, skipped): (Vec<_>, Vec<_>) =
            chain.into_iter().partition(|c| c.status == CellStatus::Ok);
        let skipped = skipped.into_iter().map(|c| c.id).collect();
        let cells: Vec<u64> = ok.iter().map(|c| c.id).collect();
        let text = match format {
            ExportFormat::Py => script(sess, &ok),
            ExportFormat::Ipynb => notebook(sess, &ok, st.kept.results()),
        };
        Ok(Export {
            text,
            cells,
            skipped,
        })
    }
}

/// The code a cell ran, as a cell of the document.
fn source_text(source: &StoredSource) -> String {
    match source {
        StoredSource::Code { code } => code.clone(),
        StoredSource::File { file, args } => {
            let argv: Vec<String> = std::iter::once(file.clone())
                .chain(args.iter().cloned())
                .collect();
            format!(
                "# python_run_file {file}\nimport runpy, sys\nsys.argv = {}\nglobals().update(runpy.run_path({}, run_name=\"__main__\"))",
                serde_json::to_string(&argv).unwrap_or_default(),
                serde_json::to_string(file).unwrap_or_default()
            )
        }
    }
}

fn script(sess: &Session, cells: &[PathCell]) -> String {
    let mut out = format!(
        "# Exported by ferrepl from session '{}' ({}): cells {}.\n",
        sess.name,
        sess.language,
        ranges(&cells.iter().map(|c| c.id).collect::<Vec<_>>())
    );
    for c in cells {
        out.push_str(&format!("\n# %% cell {}\n", c.id));
        out.push_str(source_text(&c.source).trim_end());
        out.push('\n');
    }
    out
}

/// Lines of a notebook string field (nbformat's multi-line form).
fn lines(text: &str) -> Vec<String> {
    text.split_inclusive('\n').map(str::to_string).collect()
}

fn notebook(sess: &Session, cells: &[PathCell], kept: &KeptResults) -> String {
    let mut out_cells = Vec::new();
    for (n, c) in cells.iter().enumerate() {
        let count = n + 1;
        let mut outputs = Vec::new();
        if let Some(k) = kept.get(c.id) {
            for (name, text) in [("stdout", &k.stdout), ("stderr", &k.stderr)] {
                if !text.is_empty() {
                    outputs
                        .push(json!({"output_type": "stream", "name": name, "text": lines(text)}));
                }
            }
            for (mime, data) in &k.images {
                // The agent's code names the type: written only as what
                // its bytes are (an "image" of type text/html would be
                // rendered by notebook tools).
                match crate::output::image::base64_image_type(data) {
                    Some(t) if t == mime => outputs.push(
                        json!({"output_type": "display_data", "data": {t: data}, "metadata": {}}),
                    ),
                    _ => outputs.push(json!({"output_type": "stream", "name": "stderr",
                        "text": ["[an image that is not PNG or JPEG is not exported]\n"]})),
                }
            }
            if let Some(value) = &k.value {
                outputs.push(json!({
                    "output_type": "execute_result",
                    "execution_count": count,
                    "data": {"text/plain": lines(value)},
                    "metadata": {}
                }));
            }
        }
        out_cells.push(json!({
            "cell_type": "code",
            "id": format!("ferrepl-cell-{}", c.id),
            "metadata": {"ferrepl": {"cell": c.id, "parent": c.parent}},
            "execution_count": count,
            "source": lines(&source_text(&c.source)),
            "outputs": outputs,
        }));
    }
    let other = sess
        .spec
        .as_ref()
        .and_then(|s| s.kernel.as_ref())
        .filter(|k| k.other_language.is_some());
    let (kernel, display, language) = match (other, sess.language) {
        // A session on a kernel of another language (bash) is Python only
        // for routing: its notebook names its own kernel.
        (Some(k), _) => (
            k.name.as_str(),
            k.display_name.as_str(),
            k.other_language.as_deref().unwrap_or_default(),
        ),
        (None, Language::Python) => ("python3", "Python 3", "python"),
        (None, Language::R) => ("ir", "R", "R"),
    };
    let doc = json!({
        "nbformat": 4,
        "nbformat_minor": 5,
        "metadata": {
            "kernelspec": {"name": kernel, "display_name": display, "language": language},
            "language_info": {"name": language},
            "ferrepl": {"session": sess.name},
        },
        "cells": out_cells,
    });
    serde_json::to_string_pretty(&doc).unwrap_or_default() + "\n"
}
