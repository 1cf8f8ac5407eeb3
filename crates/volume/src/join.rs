//! Runs a handful of futures concurrently on the current task (no spawning, no 'static bound),
//! for a request that spans several data objects.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::task::Poll;

/// Awaits all futures, polling them together; outputs in input order.
pub async fn join_all<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    poll_fn(|cx| {
        let mut pending = false;
        for (f, out) in futures.iter_mut().zip(outputs.iter_mut()) {
            if out.is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => *out = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn runs_concurrently_and_keeps_order() {
        let start = tokio::time::Instant::now();
        let futs = (0..4u64)
            .map(|i| async move {
                tokio::time::sleep(Duration::from_millis(100 - 20 * i)).await;
                i
            })
            .collect();
        assert_eq!(join_all(futs).await, vec![0, 1, 2, 3]);
        // Sequential would take 340 ms.
        assert!(start.elapsed() < Duration::from_millis(300));
    }
}
