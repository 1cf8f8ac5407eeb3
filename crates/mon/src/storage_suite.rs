//! openraft's own storage test suite run against the redb log store and state machine.
//!
//! `Suite::test_all` runs its cases one after another and several of them sleep a second;
//! the cases are independent (each gets a fresh store), so they run here concurrently.

use crate::log_store::LogStore;
use crate::state_machine::StateMachine;
use crate::store;
use crate::types::{MonRaft, StorageError};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{AnyError, StorageIOError};
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};

/// Removes a case's data dir when the case is done with the store.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Builder;

impl StoreBuilder<MonRaft, LogStore, StateMachine, TempDir> for Builder {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachine), StorageError> {
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "cairn-mon-suite-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let fail = |e: String| StorageError::from(StorageIOError::write(AnyError::error(e)));
        let db = store::open(&dir, 1, [9; 16]).map_err(|e| fail(e.to_string()))?;
        let sm = StateMachine::open(db.clone(), [9; 16]).map_err(|e| fail(e.to_string()))?;
        Ok((TempDir(dir), LogStore::new(db), sm))
    }
}

type S = Suite<MonRaft, LogStore, StateMachine, Builder, TempDir>;
type Case = Pin<Box<dyn Future<Output = Result<(), StorageError>> + Send>>;

macro_rules! cases {
    ($($name:ident),* $(,)?) => {
        vec![$((
            stringify!($name),
            Box::pin(async {
                let (dir, log, sm) = Builder.build().await?;
                let r = S::$name(log, sm).await;
                drop(dir);
                r
            }) as Case,
        )),*]
    };
}

#[test]
fn openraft_storage_suite() {
    let mut cases = cases!(
        last_membership_in_log_initial,
        last_membership_in_log,
        last_membership_in_log_multi_step,
        get_membership_initial,
        get_membership_from_log_and_empty_sm,
        get_membership_from_empty_log_and_sm,
        get_membership_from_log_le_sm_last_applied,
        get_membership_from_log_gt_sm_last_applied_1,
        get_membership_from_log_gt_sm_last_applied_2,
        get_initial_state_without_init,
        get_initial_state_membership_from_log_and_sm,
        get_initial_state_with_state,
        get_initial_state_last_log_gt_sm,
        get_initial_state_last_log_lt_sm,
        get_initial_state_log_ids,
        get_initial_state_re_apply_committed,
        save_vote,
        get_log_entries,
        limited_get_log_entries,
        try_get_log_entry,
        initial_logs,
        get_log_state,
        get_log_id,
        last_id_in_log,
        last_applied_state,
        purge_logs_upto_0,
        purge_logs_upto_5,
        purge_logs_upto_20,
        delete_logs_since_11,
        delete_logs_since_0,
        append_to_log,
        snapshot_meta,
        apply_single,
        apply_multiple,
    );
    cases.push((
        "transfer_snapshot",
        Box::pin(S::transfer_snapshot(&Builder)),
    ));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("test runtime");
    rt.block_on(async {
        let mut set = tokio::task::JoinSet::new();
        for (name, case) in cases {
            set.spawn(async move { (name, case.await) });
        }
        let mut failed = Vec::new();
        while let Some(r) = set.join_next().await {
            match r {
                Ok((_, Ok(()))) => {}
                Ok((name, Err(e))) => failed.push(format!("{name}: {e}")),
                Err(e) => failed.push(format!("a case panicked: {e}")),
            }
        }
        assert!(failed.is_empty(), "storage suite failures: {failed:#?}");
    });
}
