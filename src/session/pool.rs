//! The warm pool: Python workers started ahead of need (--warm-pool N), each
//! launched exactly like a session's (its own sandbox, namespaces, temp dir
//! and limits), so that creating or resetting a session takes a ready
//! interpreter instead of waiting for one to start. Refilled in the
//! background, one launch at a time so refills do not crowd the cells that
//! run meanwhile.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::gate::{Gate, Slot};
use crate::worker::{self, LaunchSpec, Worker};

pub(super) struct WarmPool {
    /// This tenant's share (--tenant-warm-pool; --warm-pool alone).
    target: usize,
    /// The instance's places over every tenant's pool (--warm-pool).
    instance: Arc<Gate>,
    /// --start-timeout: how long a pooled worker may take to become ready.
    start_timeout: Duration,
    ready: Mutex<VecDeque<(Arc<Worker>, Slot)>>,
    /// A refill task is running (at most one).
    refilling: AtomicBool,
}

impl WarmPool {
    pub(super) fn new(target: usize, start_timeout: Duration, instance: Arc<Gate>) -> Self {
        Self {
            target,
            instance,
            start_timeout,
            ready: Mutex::new(VecDeque::new()),
            refilling: AtomicBool::new(false),
        }
    }

    fn ready(&self) -> MutexGuard<'_, VecDeque<(Arc<Worker>, Slot)>> {
        self.ready.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The oldest pooled worker still alive; dead ones are dropped. Its
    /// place in the instance's pool is given back.
    pub(super) fn take(&self) -> Option<Arc<Worker>> {
        let mut ready = self.ready();
        while let Some((w, _place)) = ready.pop_front() {
            if w.exit_info().is_none() {
                return Some(w);
            }
        }
        None
    }

    /// How many ready workers are pooled now (dead ones not counted).
    pub(super) fn len(&self) -> usize {
        self.ready()
            .iter()
            .filter(|(w, _)| w.exit_info().is_none())
            .count()
    }

    pub(super) fn target(&self) -> usize {
        self.target
    }

    /// Starts workers in the background until the pool is full; `stop`
    /// is checked before each launch (the server shutting down).
    pub(super) fn refill(
        self: &Arc<Self>,
        spec: LaunchSpec,
        stop: impl Fn() -> bool + Send + 'static,
    ) {
        if self.target == 0 || self.refilling.swap(true, Ordering::SeqCst) {
            return;
        }
        let pool = self.clone();
        tokio::spawn(async move {
            let mut failed = false;
            // Every place of the instance's pool is taken: the next freed
            // place refills (Gate::pool_place_freed), not a retry here.
            let mut no_place = false;
            // Workers that die while pooled are replaced, but not forever:
            // a run launches at most twice the pool's size.
            let mut launches = pool.target * 2;
            loop {
                let missing = {
                    let mut ready = pool.ready();
                    ready.retain(|(w, _)| w.exit_info().is_none());
                    pool.target.saturating_sub(ready.len())
                };
                if missing == 0 || stop() {
                    break;
                }
                if launches == 0 {
                    tracing::warn!(
                        "warm pool: its workers keep dying; not refilled until the next session starts"
                    );
                    failed = true;
                    break;
                }
                // A place in the instance's pool first: when other tenants'
                // pools hold them all, this one waits for a freed place.
                let Some(place) = pool.instance.pool_slot() else {
                    no_place = true;
                    break;
                };
                launches -= 1;
                // One start at a time, and only ready workers in the pool:
                // a take never waits on a start the pool began.
                let started = worker::launch_ready(&spec, pool.start_timeout).await;
                match started {
                    Ok(w) => {
                        // Checked under the lock shutdown drains with, so a
                        // worker is never added after the drain.
                        let mut ready = pool.ready();
                        if stop() {
                            drop(ready);
                            w.kill_in_background();
                            break;
                        }
                        ready.push_back((w, place));
                    }
                    Err(e) => {
                        // Whatever stops a launch here (the interpreter is
                        // gone, a limit) would stop the next one too; the
                        // next take falls back to a fresh launch, which
                        // reports the error to the agent.
                        tracing::debug!("warm pool: worker not started: {e}");
                        failed = true;
                        break;
                    }
                }
            }
            pool.refilling.store(false, Ordering::SeqCst);
            // A take that came while this task was finishing saw `refilling`
            // set and started nothing: look once more.
            let short = pool.len() < pool.target;
            if short && !failed && !no_place && !stop() {
                pool.refill(spec, stop);
            }
        });
    }

    /// Empties the pool (shutdown); the caller ends the workers.
    pub(super) fn drain(&self) -> Vec<Arc<Worker>> {
        self.ready().drain(..).map(|(w, _)| w).collect()
    }
}
