//! How a run is told to stop. `main` owns the signal handlers and turns the first
//! SIGINT/SIGTERM into a graceful stop (finish stopping pods, restore, save) and a second
//! one into a forced stop (skip every graceful wait, kill children at once). Every wait in
//! the program selects on [`Shutdown::cancelled`], so nothing blocks past a signal; every
//! poll for a condition ("until this holds, or this deadline") is a [`Poll`].

use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use tokio::time::Instant;
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

/// Which stop ends a [`Poll`] early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndsOn {
    /// A graceful stop: the run is being stopped, stop looking (the pause is cut short).
    Request,
    /// Only a forced stop: the poll is itself part of stopping (pods going, a claim
    /// deleted), so a graceful stop lets it finish; a forced one cuts the pause and ends
    /// it after one more look.
    Force,
}

/// Why a [`Poll`] ended without its condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unmet {
    /// The limit passed.
    TimedOut,
    /// The stop it ends on came.
    Stopped,
}

/// One wait for a condition: look, and while the condition does not hold, `next()`,
/// which pauses `every` and says when to give up. The deadline counts from the poll's
/// start, in tokio's clock (paused in tests).
///
/// ```ignore
/// let mut wait = shutdown.poll(EndsOn::Request, every, limit);
/// loop {
///     if condition().await? { return Ok(()) }
///     if let Err(unmet) = wait.next().await { return Err(why(unmet)) }
/// }
/// ```
#[derive(Debug)]
pub struct Poll {
    stop: Option<(Shutdown, EndsOn)>,
    every: Duration,
    limit: Duration,
    deadline: Instant,
}

impl Shutdown {
    /// A poll every `every` for at most `limit`, ended early by the stop `ends_on` names.
    pub fn poll(&self, ends_on: EndsOn, every: Duration, limit: Duration) -> Poll {
        Poll {
            stop: Some((self.clone(), ends_on)),
            every,
            limit,
            deadline: Instant::now() + limit,
        }
    }
}

impl Poll {
    /// A poll no stop ends, for the last step of stopping itself (a killed process group
    /// going away): only its limit bounds it.
    pub fn unstoppable(every: Duration, limit: Duration) -> Self {
        Self {
            stop: None,
            every,
            limit,
            deadline: Instant::now() + limit,
        }
    }

    /// [`Poll::next`] for a wait whose stop is the run's interruption: `Ok(true)` after
    /// the pause (look again), `Ok(false)` once the limit has passed,
    /// `Err(BenchError::Interrupted)` when its stop has come.
    pub async fn keep_waiting(&mut self) -> Result<bool> {
        match self.next().await {
            Ok(()) => Ok(true),
            Err(Unmet::TimedOut) => Ok(false),
            Err(Unmet::Stopped) => Err(match &self.stop {
                Some((s, _)) => s.interrupted(),
                None => BenchError::Interrupted { signal: 0 },
            }),
        }
    }

    /// How long the poll may last in all.
    pub fn limit(&self) -> Duration {
        self.limit
    }

    /// After a look that did not find the condition: `Err(TimedOut)` once the limit has
    /// passed, `Err(Stopped)` once its stop has come, else `Ok(())` after the pause (for
    /// [`EndsOn::Request`], a stop during the pause ends it at once with `Stopped`).
    pub async fn next(&mut self) -> std::result::Result<(), Unmet> {
        if Instant::now() > self.deadline {
            return Err(Unmet::TimedOut);
        }
        match &self.stop {
            None => tokio::time::sleep(self.every).await,
            Some((s, EndsOn::Request)) => {
                if s.is_requested() {
                    return Err(Unmet::Stopped);
                }
                tokio::select! {
                    _ = s.cancelled() => return Err(Unmet::Stopped),
                    _ = tokio::time::sleep(self.every) => {}
                }
            }
            Some((s, EndsOn::Force)) => {
                if s.is_forced() {
                    return Err(Unmet::Stopped);
                }
                s.grace(self.every).await;
            }
        }
        Ok(())
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

    #[tokio::test(start_paused = true)]
    async fn a_poll_ends_at_its_limit_or_on_its_stop() {
        let s = Shutdown::new();
        // Looks at 0, 1, 2 and 3 s; the limit of 2.5 s has passed at the fourth look.
        let mut poll = s.poll(EndsOn::Request, Duration::from_secs(1), Duration::from_millis(2500));
        let mut looks = 1;
        while poll.next().await.is_ok() {
            looks += 1;
        }
        assert_eq!(looks, 4);
        assert_eq!(poll.next().await, Err(Unmet::TimedOut));
        // A graceful stop ends a Request poll during its pause...
        let mut poll = s.poll(EndsOn::Request, Duration::from_secs(60), Duration::from_secs(600));
        let s2 = s.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            s2.request(0);
        });
        let t = Instant::now();
        assert_eq!(poll.next().await, Err(Unmet::Stopped));
        assert!(t.elapsed() < Duration::from_secs(2));
        // ...but not a Force poll, which a forced stop ends after one more look.
        let mut poll = s.poll(EndsOn::Force, Duration::from_secs(1), Duration::from_secs(600));
        assert_eq!(poll.next().await, Ok(()));
        s.force();
        assert_eq!(poll.next().await, Err(Unmet::Stopped));
        // keep_waiting turns the stop into the run's interruption.
        let mut poll = s.poll(EndsOn::Request, Duration::from_secs(1), Duration::from_secs(600));
        let e = poll.keep_waiting().await.expect_err("stopped");
        assert!(matches!(e, BenchError::Interrupted { .. }), "{e}");
        let mut forever = Poll::unstoppable(Duration::from_secs(1), Duration::from_secs(1));
        assert_eq!(forever.next().await, Ok(()));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(forever.next().await, Err(Unmet::TimedOut));
    }
}
