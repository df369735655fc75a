//! What a call about a cell returns, before it is rendered for MCP.

use serde::Serialize;

use std::collections::HashSet;

use crate::output::RenderedOutput;
use crate::worker::protocol::{Image, PyError};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CellStatus {
    /// The cell finished without an exception.
    Ok,
    /// The cell raised an exception.
    Error,
    /// The cell is still running; collect it with python_wait.
    Running,
    /// The cell is blocked in input(); answer with python_wait's input.
    WaitingInput,
    /// The cell was stopped by an interrupt (or a time limit).
    Interrupted,
    /// The interpreter process died; its state is lost.
    Crashed,
}

impl CellStatus {
    /// How a finished cell is counted (None while it runs or waits).
    pub fn outcome(self) -> Option<crate::metrics::CellOutcome> {
        use crate::metrics::CellOutcome;
        match self {
            CellStatus::Ok => Some(CellOutcome::Ok),
            CellStatus::Error => Some(CellOutcome::Error),
            CellStatus::Interrupted => Some(CellOutcome::Interrupted),
            CellStatus::Crashed => Some(CellOutcome::Crashed),
            CellStatus::Running | CellStatus::WaitingInput => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            CellStatus::Ok => "ok",
            CellStatus::Error => "error",
            CellStatus::Running => "running",
            CellStatus::WaitingInput => "waiting_input",
            CellStatus::Interrupted => "interrupted",
            CellStatus::Crashed => "crashed",
        }
    }

    /// The status `as_str` gave (as the store keeps it).
    pub fn parse(s: &str) -> Option<Self> {
        [
            CellStatus::Ok,
            CellStatus::Error,
            CellStatus::Running,
            CellStatus::WaitingInput,
            CellStatus::Interrupted,
            CellStatus::Crashed,
        ]
        .into_iter()
        .find(|c| c.as_str() == s)
    }

    pub fn from_driver(s: &str) -> Self {
        match s {
            "ok" => CellStatus::Ok,
            "interrupted" => CellStatus::Interrupted,
            _ => CellStatus::Error,
        }
    }

    pub fn is_error(self) -> bool {
        matches!(
            self,
            CellStatus::Error | CellStatus::Interrupted | CellStatus::Crashed
        )
    }
}

/// Output that arrived after an earlier cell had finished (from threads or
/// subprocesses it started).
#[derive(Debug, Clone)]
pub struct BackgroundOutput {
    pub after_cell: u64,
    pub output: RenderedOutput,
}

#[derive(Debug, Clone)]
pub struct CellReport {
    pub status: CellStatus,
    pub session: String,
    pub language: crate::worker::Language,
    pub cell: u64,
    pub output: RenderedOutput,
    pub background: Option<BackgroundOutput>,
    pub value: Option<String>,
    pub error: Option<PyError>,
    pub prompt: Option<String>,
    pub elapsed_ms: f64,
    pub images: Images,
    /// Things the agent must know: lost state, earlier results, escalations.
    pub notes: Vec<String>,
}

/// One display item of a result, as listed in structuredContent.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct DisplayInfo {
    /// MIME type, e.g. image/png.
    pub mime: String,
    /// Size of the image in bytes.
    pub bytes: u64,
    pub width: Option<u32>,
    pub height: Option<u32>,
    /// False when the image was left out (a duplicate, or past --max-images).
    pub shown: bool,
}

/// Entries of a result's `display` list: the first this many images (or
/// --max-images, when more) are listed, the rest only counted, as a cell
/// can display thousands.
pub const MAX_DISPLAY_ENTRIES: usize = 64;

/// The images of one result: bounded in number, each sent once.
#[derive(Debug, Clone, Default)]
pub struct Images {
    pub shown: Vec<Image>,
    pub info: Vec<DisplayInfo>,
    /// Images displayed past the list's end (`MAX_DISPLAY_ENTRIES`).
    pub unlisted: usize,
    /// The shown images' hashes (so at most `limit` of them).
    seen: HashSet<String>,
}

impl Images {
    /// Adds an image and returns the placeholder line for its place in the text.
    pub fn add(&mut self, image: Image, limit: usize) -> String {
        let n = self.info.len() + self.unlisted + 1;
        let mut info = DisplayInfo {
            mime: image.mime.clone(),
            bytes: image.bytes,
            width: image.width,
            height: image.height,
            shown: false,
        };
        let line = if self.seen.contains(&image.sha) {
            format!("[image {n}: the same picture as an earlier image of this result]\n")
        } else if self.shown.len() >= limit {
            format!(
                "[image {n} not shown: at most {limit} images per result (--max-images); show fewer figures per cell]\n"
            )
        } else {
            let dims = match (image.width, image.height) {
                (Some(w), Some(h)) => format!(" {w}x{h}"),
                _ => String::new(),
            };
            let line = format!(
                "[image {n}: {}{dims}, {:.1} KB, attached below]\n",
                image.mime,
                image.bytes as f64 / 1024.0
            );
            info.shown = true;
            self.seen.insert(image.sha.clone());
            self.shown.push(image);
            line
        };
        if self.info.len() < MAX_DISPLAY_ENTRIES.max(limit) {
            self.info.push(info);
        } else {
            self.unlisted += 1;
        }
        line
    }

    /// What the agent is told when the `display` list left images out.
    pub fn unlisted_note(&self) -> Option<String> {
        (self.unlisted > 0).then(|| {
            format!(
                "{} more images were displayed than the {} the result's `display` list names; display fewer per cell",
                self.unlisted,
                self.info.len()
            )
        })
    }

    pub fn take(&mut self) -> Images {
        std::mem::take(self)
    }

    /// Moves another set's images in (used for images made in the background).
    pub fn extend(&mut self, other: Images, limit: usize) {
        for image in other.shown {
            self.add(image, limit);
        }
    }
}

impl CellReport {
    /// A short form of the result (output, value, exception line), for a
    /// note inside a later result.
    pub fn brief(&self) -> String {
        let mut text = crate::output::text::clean(&self.output.combined);
        for line in self.value.iter().cloned().chain(
            self.error
                .iter()
                .map(|e| format!("{}: {}", e.kind, e.message)),
        ) {
            if !text.is_empty() && !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(&line);
        }
        text
    }
}

impl CellReport {
    pub(super) fn with_note(mut self, note: &str) -> Self {
        self.notes.push(note.to_string());
        self
    }

    pub(super) fn with_notes_first(mut self, mut notes: Vec<String>) -> Self {
        notes.append(&mut self.notes);
        self.notes = notes;
        self
    }

    pub(super) fn with_background(mut self, after_cell: u64, output: RenderedOutput) -> Self {
        self.background = Some(BackgroundOutput { after_cell, output });
        self
    }
}

/// The states `python_sessions` lists, in its words.
pub const SESSION_STATES: [&str; 7] = [
    "idle",
    "busy",
    "waiting_input",
    "starting",
    "dead",
    "dormant",
    "rebuilding",
];

#[cfg(test)]
mod tests {
    use super::*;

    /// security.md says how many images a result's display list names.
    #[test]
    fn security_md_states_the_display_lists_bound() {
        let doc = include_str!("../../docs/security.md").replace('\n', " ");
        let said = format!("`display` list names at most {MAX_DISPLAY_ENTRIES} images");
        assert!(doc.contains(&said), "docs/security.md has no `{said}`");
    }

    fn image(sha: &str) -> Image {
        Image {
            mime: "image/png".into(),
            base64: "aGk=".into(),
            bytes: 2,
            width: Some(1),
            height: Some(1),
            sha: sha.into(),
        }
    }

    #[test]
    fn thousands_of_images_list_the_first_and_count_the_rest() {
        let mut images = Images::default();
        for i in 0..5000 {
            images.add(image(&format!("{}", i % 3)), 8);
        }
        assert_eq!(images.shown.len(), 3);
        assert_eq!(images.info.len(), MAX_DISPLAY_ENTRIES);
        assert_eq!(images.unlisted, 5000 - MAX_DISPLAY_ENTRIES);
        let line = images.add(image("new"), 8);
        assert!(line.starts_with("[image 5001:"), "{line}");
        assert!(images.seen.len() <= 8);
        let note = images.unlisted_note().unwrap_or_default();
        assert!(note.starts_with("4937 more images"), "{note}");
    }
}
