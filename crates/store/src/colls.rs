//! The index at run time: one lock per collection, so that commits of different collections
//! (an OSD's PGs, spread over its shards) never wait for each other.
//!
//! The table of collections is an `RwLock` that everyone who looks at the index holds
//! shared (commits, readers, the flusher and the cleaner), and inside it each collection sits
//! behind its own mutex. The table is taken exclusively only to add a collection's slot (a
//! transaction that creates one) and for a checkpoint's snapshot: holding it exclusively, no
//! commit is half-applied and no slot is locked, so the snapshot is one consistent cut. A
//! slot whose collection is gone holds `None` until the next snapshot prunes it.
//!
//! Lock order: the table, then slots in collection order, then the state lock (`st`), then
//! the WAL queue's lock (`wq`). No thread takes the table twice (a waiting writer would
//! block its second read) or waits for an event while holding it.
//!
//! A transaction's collections are taken out of their slots into a small [`Index`] of its
//! own (moving `Arc`s), resolved and applied there exactly as against the whole index, and
//! put back before their locks are released.

use crate::index::{Collection, Index};
use crate::lockwaits::LockWaits;
use crate::txn::{CollId, Transaction};
use cairn_failstop::RwLockOrDie;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// One collection's place in the table.
pub(crate) type Slot = Mutex<Option<Arc<Collection>>>;
/// The table of collections.
pub(crate) type Table = BTreeMap<CollId, Slot>;
/// A locked slot.
pub(crate) type SlotGuard<'a> = MutexGuard<'a, Option<Arc<Collection>>>;

pub(crate) struct Colls {
    table: RwLock<Table>,
    /// Waits for a collection's lock by commits and reads, and by the threads that move
    /// blocks in the background (the flusher, the cleaner, a batch finishing direct writes).
    pub waits: LockWaits,
    pub background_waits: LockWaits,
}

impl Colls {
    pub fn new(idx: Index) -> Colls {
        let mut table = Table::new();
        put_index(&mut table, idx);
        Colls {
            table: RwLock::new(table),
            waits: LockWaits::default(),
            background_waits: LockWaits::default(),
        }
    }

    /// The table, shared.
    pub fn read(&self) -> RwLockReadGuard<'_, Table> {
        self.table.read_or_die()
    }

    /// The table, exclusively: no slot is locked and no commit is under way meanwhile.
    pub fn write(&self) -> RwLockWriteGuard<'_, Table> {
        self.table.write_or_die()
    }

    /// Locks one collection's slot for a commit or a read (counting the wait if it is
    /// taken).
    pub fn lock<'a>(&self, slot: &'a Slot) -> SlotGuard<'a> {
        self.waits.lock(slot)
    }

    /// [`Colls::lock`] for background work (its waits are counted apart).
    pub fn lock_background<'a>(&self, slot: &'a Slot) -> SlotGuard<'a> {
        self.background_waits.lock(slot)
    }

    /// Runs `f` on a collection (`None` if it does not exist) under its lock.
    pub fn with<R>(&self, c: CollId, f: impl FnOnce(Option<&Collection>) -> R) -> R {
        let table = self.read();
        match table.get(&c) {
            Some(slot) => f(self.lock(slot).as_deref()),
            None => f(None),
        }
    }

    /// The collections that exist, in id order.
    pub fn ids(&self) -> Vec<CollId> {
        let table = self.read();
        table
            .iter()
            .filter(|(_, s)| self.lock(s).is_some())
            .map(|(c, _)| *c)
            .collect()
    }

    /// Objects in all collections.
    pub fn object_count(&self) -> u64 {
        let table = self.read();
        table
            .values()
            .map(|s| self.lock(s).as_ref().map_or(0, |c| c.objects.len() as u64))
            .sum()
    }

    /// A copy of the whole index (collections are shared, not copied). Consistent across
    /// collections only when taken from the table held exclusively ([`snapshot`]).
    pub fn copy(&self) -> Index {
        let table = self.read();
        let colls = table
            .iter()
            .filter_map(|(c, s)| Some((*c, self.lock(s).clone()?)))
            .collect();
        Index { colls }
    }

    /// Locks the slots of the collections `txn` names, in collection order, and moves them
    /// into an index of the transaction's own. `Err` names collections the transaction
    /// creates that have no slot yet: the caller releases the table and adds them
    /// ([`Colls::add_slots`]; a slot is only added with the table held exclusively).
    fn take_for<'a>(&self, table: &'a Table, txn: &Transaction) -> Result<Taken<'a>, Vec<CollId>> {
        let mut ids: Vec<CollId> = txn.ops.iter().map(|op| op.coll()).collect();
        ids.sort_unstable();
        ids.dedup();
        let missing: Vec<CollId> = txn
            .ops
            .iter()
            .filter_map(|op| match op {
                crate::Op::CreateCollection(c) if !table.contains_key(c) => Some(*c),
                _ => None,
            })
            .collect();
        if !missing.is_empty() {
            return Err(missing);
        }
        let mut taken = Taken {
            guards: Vec::with_capacity(ids.len()),
            index: Index::default(),
        };
        for c in ids {
            // A collection with no slot does not exist: the transaction's validation says so.
            let Some(slot) = table.get(&c) else { continue };
            let mut g = self.lock(slot);
            if let Some(coll) = g.take() {
                taken.index.colls.insert(c, coll);
            }
            taken.guards.push((c, g));
        }
        Ok(taken)
    }

    /// Runs `f` on the transaction's collections, locked and taken out of their slots
    /// ([`Colls::take_for`]), adding slots for those it creates first.
    pub fn with_txn<R>(&self, txn: &Transaction, f: impl FnOnce(&mut Index) -> R) -> R {
        loop {
            let table = self.read();
            let missing = match self.take_for(&table, txn) {
                Ok(mut taken) => return f(&mut taken.index),
                Err(m) => m,
            };
            drop(table);
            self.add_slots(&missing);
        }
    }

    /// Adds empty slots for collections about to be created. Takes the table exclusively:
    /// the caller must not hold it.
    fn add_slots(&self, ids: &[CollId]) {
        let mut table = self.write();
        for &c in ids {
            table.entry(c).or_insert_with(|| Mutex::new(None));
        }
    }
}

/// A transaction's collections, locked and moved into an index of their own: they go back
/// into their slots when this is dropped (their locks released after).
pub(crate) struct Taken<'a> {
    guards: Vec<(CollId, SlotGuard<'a>)>,
    pub index: Index,
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        for (c, g) in &mut self.guards {
            **g = self.index.colls.remove(c);
        }
        // Effects only touch the collections their ops name (validation refuses others).
        debug_assert!(
            self.index.colls.is_empty(),
            "a transaction changed a collection it did not lock"
        );
    }
}

/// The whole index, out of a table held exclusively (a checkpoint's snapshot: consistent,
/// since no commit is under way). Slots of removed collections are dropped meanwhile.
pub(crate) fn snapshot(table: &mut Table) -> Index {
    table.retain(|_, s| slot_mut(s).is_some());
    let colls = table
        .iter_mut()
        .filter_map(|(c, s)| Some((*c, slot_mut(s).clone()?)))
        .collect();
    Index { colls }
}

/// Moves the whole index out of the table (replay at open applies to it, then puts it back).
pub(crate) fn take_index(table: &mut Table) -> Index {
    let colls = std::mem::take(table)
        .into_iter()
        .filter_map(|(c, s)| Some((c, into_slot(s)?)))
        .collect();
    Index { colls }
}

/// Puts a whole index into the table.
pub(crate) fn put_index(table: &mut Table, idx: Index) {
    for (c, coll) in idx.colls {
        table.insert(c, Mutex::new(Some(coll)));
    }
}

/// A slot's collection, from a table held exclusively. A poisoned slot (a thread panicked
/// holding it, so the process is aborting) is never used.
fn slot_mut(s: &mut Slot) -> &mut Option<Arc<Collection>> {
    match s.get_mut() {
        Ok(c) => c,
        Err(_) => poisoned(),
    }
}

fn into_slot(s: Slot) -> Option<Arc<Collection>> {
    match s.into_inner() {
        Ok(c) => c,
        Err(_) => poisoned(),
    }
}

#[cold]
fn poisoned() -> ! {
    panic!("a collection's lock was poisoned by an earlier panic: its index may be half-changed")
}
