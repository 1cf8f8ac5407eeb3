//! Locks that are never used after a panic poisoned them.

use std::sync::{Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::sync::{PoisonError, WaitTimeoutResult};
use std::time::Duration;

/// A poisoned lock guards state that a panicking thread may have left half-changed.
#[cold]
#[track_caller]
fn poisoned<G>(_: PoisonError<G>) -> ! {
    panic!(
        "a lock was poisoned by an earlier panic: the state it guards may be half-changed, so \
         this thread stops instead of using it"
    )
}

/// [`Mutex::lock`] that panics on a poisoned lock.
pub trait LockOrDie<T: ?Sized> {
    fn lock_or_die(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> LockOrDie<T> for Mutex<T> {
    #[inline]
    #[track_caller]
    fn lock_or_die(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(|p| poisoned(p))
    }
}

/// [`RwLock::read`] and [`RwLock::write`] that panic on a poisoned lock.
pub trait RwLockOrDie<T: ?Sized> {
    fn read_or_die(&self) -> RwLockReadGuard<'_, T>;
    fn write_or_die(&self) -> RwLockWriteGuard<'_, T>;
}

impl<T: ?Sized> RwLockOrDie<T> for RwLock<T> {
    #[inline]
    #[track_caller]
    fn read_or_die(&self) -> RwLockReadGuard<'_, T> {
        self.read().unwrap_or_else(|p| poisoned(p))
    }

    #[inline]
    #[track_caller]
    fn write_or_die(&self) -> RwLockWriteGuard<'_, T> {
        self.write().unwrap_or_else(|p| poisoned(p))
    }
}

/// [`Condvar::wait`] and [`Condvar::wait_timeout`] that panic when the mutex was poisoned
/// while this thread waited.
pub trait CondvarOrDie {
    fn wait_or_die<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T>;
    fn wait_timeout_or_die<'a, T>(
        &self,
        guard: MutexGuard<'a, T>,
        timeout: Duration,
    ) -> (MutexGuard<'a, T>, WaitTimeoutResult);
}

impl CondvarOrDie for Condvar {
    #[inline]
    #[track_caller]
    fn wait_or_die<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
        self.wait(guard).unwrap_or_else(|p| poisoned(p))
    }

    #[inline]
    #[track_caller]
    fn wait_timeout_or_die<'a, T>(
        &self,
        guard: MutexGuard<'a, T>,
        timeout: Duration,
    ) -> (MutexGuard<'a, T>, WaitTimeoutResult) {
        self.wait_timeout(guard, timeout)
            .unwrap_or_else(|p| poisoned(p))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn poison<T: Send + 'static>(m: &Arc<Mutex<T>>) {
        let m = Arc::clone(m);
        let r = std::thread::spawn(move || {
            let _g = m.lock_or_die();
            panic!("torn");
        })
        .join();
        assert!(r.is_err());
    }

    #[test]
    fn a_live_lock_is_taken_and_a_poisoned_one_is_never_used() {
        let m = Arc::new(Mutex::new(1));
        *m.lock_or_die() += 1;
        assert_eq!(*m.lock_or_die(), 2);
        poison(&m);
        let used = std::panic::catch_unwind(|| *m.lock_or_die());
        assert!(used.is_err(), "a poisoned mutex must not be used");
    }

    #[test]
    fn a_poisoned_rwlock_is_neither_read_nor_written() {
        let l = Arc::new(RwLock::new(5));
        assert_eq!(*l.read_or_die(), 5);
        *l.write_or_die() = 6;
        let l2 = Arc::clone(&l);
        let _ = std::thread::spawn(move || {
            let _g = l2.write_or_die();
            panic!("torn");
        })
        .join();
        assert!(std::panic::catch_unwind(|| *l.read_or_die()).is_err());
        assert!(std::panic::catch_unwind(|| *l.write_or_die()).is_err());
    }

    #[test]
    fn a_wait_returns_its_guard_and_times_out() {
        let m = Mutex::new(0);
        let cv = Condvar::new();
        let (g, to) = cv.wait_timeout_or_die(m.lock_or_die(), Duration::from_millis(1));
        assert!(to.timed_out());
        assert_eq!(*g, 0);
    }
}
