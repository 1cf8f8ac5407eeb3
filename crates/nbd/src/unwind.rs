//! A command's future with its panic caught: a panicking export becomes an error reply for
//! that one request, not a request the client waits for forever. Polled in the command's own
//! task, so serving a request costs one task, not a second one spawned only to catch a panic
//! (each spawn moves the whole command future several times: measured at ~4 % of the machine
//! under 4 KiB random reads).
//!
//! This holds for a program that unwinds. The cairn daemons fail stop instead: their panic hook
//! (`cairn_failstop::install`) aborts the process before any unwinding reaches this, so a
//! panicking export there ends the server, and clients reconnect to its restart.

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::task::{Context, Poll};

/// A command that panicked instead of returning.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Panicked {
    /// It panicked, with this message (when the payload was text).
    #[error("the command panicked{}", .0.as_deref().map(|m| format!(": {m}")).unwrap_or_default())]
    Panic(Option<String>),
    /// It was polled again after it ended (a bug in the caller).
    #[error("polled after it ended")]
    PolledAfterEnd,
}

/// Runs `fut`; `Err` says how it panicked.
pub(crate) struct CatchPanic<F> {
    /// Boxed, so the task that owns this stays small and moving it is cheap.
    fut: Option<Pin<Box<F>>>,
}

impl<F: Future> CatchPanic<F> {
    pub(crate) fn new(fut: F) -> CatchPanic<F> {
        CatchPanic {
            fut: Some(Box::pin(fut)),
        }
    }
}

impl<F: Future> Future for CatchPanic<F> {
    type Output = Result<F::Output, Panicked>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // The export's state after a panic is its own business (as with a task's panic);
        // the future itself is dropped and never polled again.
        let Some(fut) = self.fut.as_mut() else {
            return Poll::Ready(Err(Panicked::PolledAfterEnd));
        };
        match catch_unwind(AssertUnwindSafe(|| fut.as_mut().poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(v)) => {
                self.fut = None;
                Poll::Ready(Ok(v))
            }
            Err(panic) => {
                // Its drop may panic too, half-way through as it is: caught as well.
                let broken = self.fut.take();
                let _ = catch_unwind(AssertUnwindSafe(move || drop(broken)));
                Poll::Ready(Err(message(&*panic)))
            }
        }
    }
}

fn message(panic: &(dyn std::any::Any + Send)) -> Panicked {
    let text = panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str));
    Panicked::Panic(text.map(str::to_string))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_result_passes_through_and_a_panic_after_a_wait_becomes_its_message() {
        let ok = CatchPanic::new(async {
            tokio::task::yield_now().await;
            7
        });
        assert_eq!(ok.await, Ok(7));
        let fails = |after_wait: bool| async move {
            if after_wait {
                tokio::task::yield_now().await;
            }
            panic!("export {} broke", 3);
        };
        for after_wait in [false, true] {
            let r: Result<(), Panicked> = CatchPanic::new(fails(after_wait)).await;
            let e = r.expect_err("panicked");
            assert_eq!(e, Panicked::Panic(Some("export 3 broke".into())));
            assert_eq!(e.to_string(), "the command panicked: export 3 broke");
        }
    }
}
