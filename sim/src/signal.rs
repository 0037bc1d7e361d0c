//! A value the tasks of one node watch for changes (a connection's state, a lease's end): tokio's
//! `sync::watch`, on one thread, with its waiters woken in the order they began to wait.
//!
//! tokio's own spreads its waiters over eight `Notify`s drawn with a thread-local random number
//! (`BigNotify`), so two tasks waiting on one change wake in an order that differs from run to run —
//! the two holders of one shared session learning of its loss, a request and the ping of one
//! connection failing with it — and a history would then depend on the process, not the seed.

use std::cell::{Cell, Ref, RefCell};
use std::rc::Rc;
use std::task::{Poll, Waker};

struct Shared<T> {
    value: RefCell<T>,
    /// Counts the values sent: a receiver has seen a change when it has seen a lower count.
    version: Cell<u64>,
    /// Whether the sender has been dropped: no change will come.
    closed: Cell<bool>,
    /// Tasks waiting for the next change, in the order they began to wait.
    waiters: RefCell<Vec<Waker>>,
}

impl<T> Shared<T> {
    fn wake_all(&self) {
        for waker in self.waiters.take() {
            waker.wake();
        }
    }
}

/// The sending side: one per value. Dropping it ends every wait with [`Closed`].
pub struct Sender<T>(Rc<Shared<T>>);

/// A watcher of the value, with what it has seen.
pub struct Receiver<T> {
    shared: Rc<Shared<T>>,
    seen: u64,
}

impl<T> Clone for Receiver<T> {
    fn clone(&self) -> Self {
        Receiver { shared: self.shared.clone(), seen: self.seen }
    }
}

/// The sender is gone: the value will not change again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Closed;

/// A value starting at `initial`, and a receiver that has seen it.
pub fn channel<T>(initial: T) -> (Sender<T>, Receiver<T>) {
    let shared = Rc::new(Shared {
        value: RefCell::new(initial),
        version: Cell::new(0),
        closed: Cell::new(false),
        waiters: RefCell::new(Vec::new()),
    });
    (Sender(shared.clone()), Receiver { shared, seen: 0 })
}

impl<T> Sender<T> {
    /// A receiver that has seen the value now.
    pub fn subscribe(&self) -> Receiver<T> {
        Receiver { shared: self.0.clone(), seen: self.0.version.get() }
    }

    /// The value now.
    pub fn borrow(&self) -> Ref<'_, T> {
        self.0.value.borrow()
    }

    /// Set the value, and return the old one; every waiter wakes.
    pub fn send_replace(&self, value: T) -> T {
        let old = self.0.value.replace(value);
        self.changed();
        old
    }

    /// Change the value in place; every waiter wakes.
    pub fn send_modify(&self, modify: impl FnOnce(&mut T)) {
        modify(&mut self.0.value.borrow_mut());
        self.changed();
    }

    fn changed(&self) {
        self.0.version.set(self.0.version.get() + 1);
        self.0.wake_all();
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        self.0.closed.set(true);
        self.0.wake_all();
    }
}

impl<T> Receiver<T> {
    /// The value now, without marking it seen.
    pub fn borrow(&self) -> Ref<'_, T> {
        self.shared.value.borrow()
    }

    /// The value now, marked seen.
    pub fn borrow_and_update(&mut self) -> Ref<'_, T> {
        self.seen = self.shared.version.get();
        self.shared.value.borrow()
    }

    /// Wait until the value changes from what this receiver has seen (and mark it seen), or the sender
    /// is gone.
    pub async fn changed(&mut self) -> Result<(), Closed> {
        std::future::poll_fn(|cx| {
            let version = self.shared.version.get();
            if version != self.seen {
                self.seen = version;
                return Poll::Ready(Ok(()));
            }
            if self.shared.closed.get() {
                return Poll::Ready(Err(Closed));
            }
            let mut waiters = self.shared.waiters.borrow_mut();
            if !waiters.iter().any(|w| w.will_wake(cx.waker())) {
                waiters.push(cx.waker().clone());
            }
            Poll::Pending
        })
        .await
    }

    /// Wait until the value satisfies `ready` (now, or after a change), and return it marked seen.
    pub async fn wait_for(&mut self, ready: impl Fn(&T) -> bool) -> Result<Ref<'_, T>, Closed> {
        loop {
            if ready(&self.borrow_and_update()) {
                return Ok(self.shared.value.borrow());
            }
            self.changed().await?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::sync::{Arc, Mutex};
    use std::task::{Context, Wake};

    /// A waker that writes its name down when woken.
    struct Named(&'static str, Arc<Mutex<Vec<&'static str>>>);

    impl Wake for Named {
        fn wake(self: Arc<Self>) {
            self.1.lock().unwrap().push(self.0);
        }
    }

    #[test]
    fn waiters_wake_in_the_order_they_began_to_wait_and_see_each_change_once() {
        let (tx, rx) = channel(0);
        let woken = Arc::new(Mutex::new(Vec::new()));
        let mut receivers: Vec<_> = (0..4).map(|_| rx.clone()).collect();
        let names = ["a", "b", "c", "d"];
        let mut waits: Vec<_> = receivers.iter_mut().map(|r| Box::pin(r.changed())).collect();
        for (wait, name) in waits.iter_mut().zip(names) {
            let waker = Waker::from(Arc::new(Named(name, woken.clone())));
            assert!(wait.as_mut().poll(&mut Context::from_waker(&waker)).is_pending());
        }
        tx.send_replace(1);
        assert_eq!(*woken.lock().unwrap(), names, "woken in order");
        let waker = Waker::from(Arc::new(Named("again", woken.clone())));
        for wait in &mut waits {
            assert_eq!(wait.as_mut().poll(&mut Context::from_waker(&waker)), Poll::Ready(Ok(())));
        }
        drop(waits);
        let mut seen = receivers.pop().unwrap();
        assert_eq!(*seen.borrow_and_update(), 1);
        drop(tx);
        let mut closed = Box::pin(seen.changed());
        assert_eq!(closed.as_mut().poll(&mut Context::from_waker(&waker)), Poll::Ready(Err(Closed)));
    }
}
