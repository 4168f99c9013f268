//! How a run is told to stop. `main` owns the signal handlers and turns the first
//! SIGINT/SIGTERM into a graceful stop (finish stopping pods, restore, save) and a second
//! one into a forced stop (skip every graceful wait, kill children at once). Every wait in
//! the program selects on [`Shutdown::cancelled`], so nothing blocks past a signal.

use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::error::{BenchError, Result};

/// The stop signals of one run; cheap to clone, every clone sees the same state.
#[derive(Debug, Clone, Default)]
pub struct Shutdown {
    graceful: CancellationToken,
    forced: CancellationToken,
    signal: Arc<AtomicI32>,
}

impl Shutdown {
    /// A run that has not been asked to stop.
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks for a graceful stop, recording the signal that asked (0: none, e.g. a test).
    pub fn request(&self, signal: i32) {
        if !self.graceful.is_cancelled() {
            self.signal.store(signal, Ordering::SeqCst);
        }
        self.graceful.cancel();
    }

    /// Asks for a forced stop: graceful waits end at once; children are killed.
    pub fn force(&self) {
        self.graceful.cancel();
        self.forced.cancel();
    }

    /// Whether a stop was asked for.
    pub fn is_requested(&self) -> bool {
        self.graceful.is_cancelled()
    }

    /// Whether a forced stop was asked for.
    pub fn is_forced(&self) -> bool {
        self.forced.is_cancelled()
    }

    /// Completes when a stop is asked for.
    pub async fn cancelled(&self) {
        self.graceful.cancelled().await
    }

    /// Completes when a forced stop is asked for.
    pub async fn forced(&self) {
        self.forced.cancelled().await
    }

    /// The error a wait returns when it was cut short.
    pub fn interrupted(&self) -> BenchError {
        BenchError::Interrupted {
            signal: self.signal.load(Ordering::SeqCst),
        }
    }

    /// Sleeps `d`, or fails with [`BenchError::Interrupted`] as soon as a stop is asked for.
    pub async fn sleep(&self, d: Duration) -> Result<()> {
        tokio::select! {
            _ = self.graceful.cancelled() => Err(self.interrupted()),
            _ = tokio::time::sleep(d) => Ok(()),
        }
    }

    /// Runs `fut` unless a stop is asked for first.
    pub async fn guard<T>(&self, fut: impl std::future::Future<Output = Result<T>>) -> Result<T> {
        tokio::select! {
            _ = self.graceful.cancelled() => Err(self.interrupted()),
            r = fut => r,
        }
    }

    /// Sleeps `d` while stopping things (a grace period): cut short only by a forced stop.
    pub async fn grace(&self, d: Duration) {
        tokio::select! {
            _ = self.forced.cancelled() => {}
            _ = tokio::time::sleep(d) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn waits_end_on_request_and_record_the_signal() {
        let s = Shutdown::new();
        let s2 = s.clone();
        let waiter = tokio::spawn(async move { s2.sleep(Duration::from_secs(3600)).await });
        tokio::time::sleep(Duration::from_secs(1)).await;
        s.request(libc::SIGTERM);
        s.request(libc::SIGINT); // the first signal is the one recorded
        let e = waiter.await.expect("join").expect_err("interrupted");
        assert_eq!(e.exit_code(), 143);
        assert!(!s.is_forced());
        let t = tokio::time::Instant::now();
        let s3 = s.clone();
        let grace = tokio::spawn(async move { s3.grace(Duration::from_secs(5)).await });
        tokio::time::sleep(Duration::from_millis(10)).await;
        s.force();
        grace.await.expect("join");
        assert!(t.elapsed() < Duration::from_secs(1), "force cuts the grace period");
    }
}
