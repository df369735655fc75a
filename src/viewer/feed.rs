//! Server-sent events: the sessions and jobs of a tenant, and one
//! session's branch (its cells, then each new one, the running cell's
//! output as it comes, state changes). Each stream is a task of its own
//! that looks at the session briefly and waits on its watch channels (and a
//! one-second tick), so a viewer never holds a session; its events go
//! through a small queue, and a viewer that stops reading is dropped when
//! the queue stays full, never slowing a cell. A finished cell's event id
//! is its number: a reconnect (Last-Event-ID) gets the cells after it.
//! Cells another client ran in the session's kernel (`foreign` events)
//! carry no id, so they never move Last-Event-ID: every stream starts with
//! all the session still keeps, and the page replaces one it has by its
//! `seq`, so a reconnect neither repeats nor loses them.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tokio::sync::mpsc;

use super::routes::{BranchQuery, listing, text};
use super::{Viewer, valid_name};
use crate::config::tokens::Tenant;
use crate::output::log::{utf8_end, utf8_start};
use crate::session::view::{CODE_SHOWN_BYTES, LIVE_TAIL_BYTES, RunningView};

/// Cells per history page (an event each page's cells).
pub(super) const PAGE: usize = 20;
/// Events queued for one viewer.
const QUEUE: usize = 16;
/// A viewer whose queue stays full this long is dropped.
const STALL: Duration = Duration::from_secs(10);
/// Changes closer together than this go out as one.
const COALESCE: Duration = Duration::from_millis(150);
const TICK: Duration = Duration::from_secs(1);

struct Out {
    tx: mpsc::Sender<Bytes>,
}

impl Out {
    /// Queues an event; false when the viewer is gone or stalled.
    async fn send(&self, event: &str, id: Option<u64>, data: &impl Serialize) -> bool {
        let json = serde_json::to_string(data).unwrap_or_else(|_| "null".into());
        let mut frame = String::with_capacity(json.len() + 32);
        if let Some(id) = id {
            frame.push_str(&format!("id: {id}\n"));
        }
        frame.push_str(&format!("event: {event}\ndata: {json}\n\n"));
        self.tx
            .send_timeout(Bytes::from(frame), STALL)
            .await
            .is_ok()
    }
}

/// An event-stream response fed by `produce` (its place among the
/// --viewer-max-clients is taken by `routes::require_login`).
fn stream<F, Fut>(viewer: &Arc<Viewer>, produce: F) -> Response
where
    F: FnOnce(Out) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = mpsc::channel::<Bytes>(QUEUE);
    let work = produce(Out { tx });
    let shutdown = viewer.shutdown.clone();
    tokio::spawn(async move {
        tokio::select! {
            () = work => {}
            () = shutdown.cancelled() => {}
        }
    });
    let body = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, std::convert::Infallible>(b), rx))
    });
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::HeaderName::from_static("x-accel-buffering"), "no"),
        ],
        Body::from_stream(body),
    )
        .into_response()
}

/// `/events`: the tenant's sessions and jobs whenever they change.
pub(super) async fn index(
    State(viewer): State<Arc<Viewer>>,
    axum::Extension(tenant): axum::Extension<Tenant>,
) -> Response {
    let v = viewer.clone();
    stream(&viewer, move |out| async move {
        let mut last = serde_json::Value::Null;
        loop {
            let now = listing(&v, &tenant);
            if now != last {
                if !out.send("sessions", None, &now).await {
                    return;
                }
                last = now;
            }
            tokio::select! {
                () = tokio::time::sleep(TICK) => {}
                () = out.tx.closed() => return,
            }
        }
    })
}

/// `/events/s/<name>`: the branch (`?head=N`, default the current one).
pub(super) async fn session(
    State(viewer): State<Arc<Viewer>>,
    axum::Extension(tenant): axum::Extension<Tenant>,
    Path(name): Path<String>,
    Query(q): Query<BranchQuery>,
    headers: HeaderMap,
) -> Response {
    if !valid_name(&name) {
        return text(StatusCode::NOT_FOUND, "not found\n");
    }
    let after = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0);
    let v = viewer.clone();
    stream(&viewer, move |out| {
        session_feed(v, tenant, name, q.head, after, out)
    })
}

#[derive(Serialize)]
struct PathEvent<'a> {
    session: &'a str,
    language: crate::worker::Language,
    state: &'a str,
    path: &'a [u64],
    current: bool,
}

async fn session_feed(
    viewer: Arc<Viewer>,
    tenant: Tenant,
    name: String,
    head: Option<u64>,
    mut after: u64,
    out: Out,
) {
    let mut known: Option<Vec<u64>> = None;
    let mut state = String::new();
    // The last of other clients' cells sent (their record's numbering).
    let mut foreign_seq = 0u64;
    // The running cell as last sent (without its output's end).
    let mut running: Option<RunningView> = None;
    loop {
        let Some(app) = viewer.app(&tenant) else {
            let _ = out.send("gone", None, &name).await;
            return;
        };
        let manager = &app.manager;
        // Subscribed before looking: a change after the look wakes us.
        let Some((worker_rx, mut session_rx)) = manager.view_watch(&name) else {
            let _ = out.send("gone", None, &name).await;
            return;
        };
        let Some(now) = manager.view_branch(&name, head, u64::MAX, 0) else {
            let _ = out.send("gone", None, &name).await;
            return;
        };
        if known.as_deref() != Some(&now.path[..]) {
            if let Some(old) = &known {
                // The cells both paths share are with the viewer already.
                after = old
                    .iter()
                    .zip(&now.path)
                    .take_while(|(a, b)| a == b)
                    .last()
                    .map_or(0, |(a, _)| *a);
            }
            let event = PathEvent {
                session: &now.session,
                language: now.language,
                state: now.state,
                path: &now.path,
                current: now.current,
            };
            if !out.send("path", None, &event).await {
                return;
            }
            while let Some(page) = manager.view_branch(&name, head, after, PAGE) {
                for cell in &page.cells {
                    after = cell.cell;
                    if !out.send("cell", Some(cell.cell), cell).await {
                        return;
                    }
                }
                if page.cells.len() < PAGE {
                    break;
                }
            }
            known = Some(now.path.clone());
            state = now.state.to_string();
        } else if now.state != state {
            state = now.state.to_string();
            if !out.send("state", None, &state).await {
                return;
            }
        }
        if now.current {
            // They ran on the interpreter's state: the current branch's.
            for cell in manager.view_foreign(&name, foreign_seq).unwrap_or_default() {
                foreign_seq = cell.seq;
                if !out.send("foreign", None, &cell).await {
                    return;
                }
            }
            let known = running.as_ref().map(|r| (r.cell, r.output_bytes));
            match manager.view_running(&name, known) {
                Some(look) => {
                    if let Some(code) = &look.code
                        && !out.send("running_cell", None, code).await
                    {
                        return;
                    }
                    let live = look.view;
                    let changed = running.as_ref().is_none_or(|b| {
                        live.cell != b.cell
                            || live.output_bytes != b.output_bytes
                            || live.prompt != b.prompt
                            || live.elapsed_s.floor() != b.elapsed_s.floor()
                    });
                    if changed {
                        if !out.send("running", None, &live).await {
                            return;
                        }
                        running = Some(RunningView {
                            output_tail: None,
                            ..live
                        });
                    }
                }
                None if running.is_some() => {
                    if !out.send("running", None, &()).await {
                        return;
                    }
                    running = None;
                }
                None => {}
            }
        }
        drop(app);
        tokio::select! {
            () = async {
                match worker_rx {
                    Some(mut rx) => {
                        if rx.changed().await.is_err() {
                            std::future::pending::<()>().await;
                        }
                    }
                    None => std::future::pending::<()>().await,
                }
            } => {}
            _ = session_rx.changed() => {}
            () = tokio::time::sleep(TICK) => {}
            () = out.tx.closed() => return,
        }
        tokio::time::sleep(COALESCE).await;
    }
}

/// `/events/j/<id>`: a shell job's state, and its output as it comes (its
/// end first when there is more than [`LIVE_TAIL_BYTES`]). An output
/// event's id is the byte offset it ends at: a reconnect (Last-Event-ID)
/// gets what came after.
pub(super) async fn job(
    State(viewer): State<Arc<Viewer>>,
    axum::Extension(tenant): axum::Extension<Tenant>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    if !valid_name(&id) {
        return text(StatusCode::NOT_FOUND, "not found\n");
    }
    let at = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let v = viewer.clone();
    stream(&viewer, move |out| job_feed(v, tenant, id, at, out))
}

#[derive(Serialize)]
struct JobOutput {
    /// The offset of the text's first byte.
    from: u64,
    /// Output between the last event's end and `from` is not sent (see the
    /// full text).
    cut: bool,
    text: String,
}

async fn job_feed(viewer: Arc<Viewer>, tenant: Tenant, id: String, at: Option<u64>, out: Out) {
    let mut at = at;
    let mut last = serde_json::Value::Null;
    loop {
        let Some(app) = viewer.app(&tenant) else {
            let _ = out.send("gone", None, &id).await;
            return;
        };
        let Some(job) = app.jobs.view(&id) else {
            let _ = out.send("gone", None, &id).await;
            return;
        };
        drop(app);
        // Subscribed before looking: a change after the look wakes us.
        let mut rx = job.subscribe();
        let info = super::routes::job_row(job.view_info(), CODE_SHOWN_BYTES);
        let exited = info["status"] == "exited";
        if info != last {
            if !out.send("job", None, &info).await {
                return;
            }
            last = info;
        }
        let total = job.output_len();
        if at.is_some_and(|a| a > total) {
            // Not an offset of this job's output: from the start.
            at = None;
        }
        let from = at.unwrap_or(0);
        if total > from || at.is_none() {
            let cut = total - from.min(total) > LIVE_TAIL_BYTES as u64;
            let start = if cut {
                total - LIVE_TAIL_BYTES as u64
            } else {
                from.min(total)
            };
            let (_, bytes) = job.output_range(start, LIVE_TAIL_BYTES as u64);
            let skip = if cut { utf8_start(&bytes) } else { 0 };
            // A character cut at the end comes whole with the next bytes.
            let end = if exited {
                bytes.len()
            } else {
                utf8_end(&bytes)
            };
            let end = end.max(skip);
            let event = JobOutput {
                from: start + skip as u64,
                cut,
                text: String::from_utf8_lossy(&bytes[skip..end]).into_owned(),
            };
            let next = start + end as u64;
            if (!event.text.is_empty() || cut || at.is_none())
                && !out.send("output", Some(next), &event).await
            {
                return;
            }
            at = Some(next);
        }
        drop(job);
        tokio::select! {
            _ = rx.changed() => {}
            () = tokio::time::sleep(TICK) => {}
            () = out.tx.closed() => return,
        }
        tokio::time::sleep(COALESCE).await;
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_page_and_the_readme_keep_as_many_foreign_cells_as_the_session() {
        let js = include_str!("pages/viewer.js");
        let line = format!(
            "const FOREIGN_SHOWN = {};",
            crate::session::view::FOREIGN_SHOWN
        );
        assert!(js.contains(&line), "viewer.js has no `{line}`");
        let readme = include_str!("../../README.md").replace('\n', " ");
        let said = format!(
            "the last {} such cells",
            crate::session::view::FOREIGN_SHOWN
        );
        assert!(readme.contains(&said), "README.md has no `{said}`");
    }
}
