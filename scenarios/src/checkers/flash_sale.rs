//! The flash sale's damage: `oversell` (more orders than stock, or stock below zero) and `lost-update`
//! (the stock left differs from what the orders imply: initial − orders).
//!
//! Both read only the resource's events: each accepted `Write` sets the stock, and an `Order` comes with
//! the write that sold the item.

use super::{FindingKind, Raw};
use locksim_sim::history::{EventKind, History, NodeIx};

pub(super) fn check(h: &History, stock: Option<i64>) -> Vec<Raw> {
    let Some(initial) = stock else { return vec![] };
    let mut found = Vec::new();
    let mut orders: Vec<(u64, NodeIx)> = Vec::new();
    let mut left = initial;
    let mut below_zero = false;
    for e in &h.events {
        match e.kind {
            EventKind::Order => orders.push((e.t, e.node)),
            EventKind::Write { value, accepted: true, .. } => {
                left = value;
                if value < 0 && !below_zero {
                    below_zero = true;
                    found.push(Raw {
                        kind: FindingKind::Oversell,
                        clients: vec![e.node],
                        from: e.t,
                        to: e.t,
                        detail: format!("the stock went below zero, to {value}"),
                    });
                }
            }
            _ => {}
        }
    }
    if orders.len() as i64 > initial {
        let excess = &orders[initial as usize..];
        let mut clients: Vec<NodeIx> = excess.iter().map(|(_, c)| *c).collect();
        clients.sort();
        clients.dedup();
        found.push(Raw {
            kind: FindingKind::Oversell,
            clients,
            from: excess[0].0,
            to: excess[excess.len() - 1].0,
            detail: format!("{} orders for a stock of {initial}", orders.len()),
        });
    }
    let implied = initial - orders.len() as i64;
    if left != implied {
        found.push(Raw {
            kind: FindingKind::LostUpdate,
            clients: vec![],
            from: h.end,
            to: h.end,
            detail: format!("{left} left in stock, but {} orders from {initial} leave {implied}", orders.len()),
        });
    }
    found
}

#[cfg(test)]
mod tests {
    use super::super::test_history::history;
    use super::*;
    use locksim_sim::history::EventKind::*;

    fn write(value: i64) -> EventKind {
        Write { value, token: None, accepted: true }
    }

    #[test]
    fn orders_that_match_the_stock_are_clean() {
        let h = history(10.0, vec![(1.0, 0, write(1)), (1.0, 0, Order), (2.0, 1, write(0)), (2.0, 1, Order)]);
        assert!(check(&h, Some(2)).is_empty());
        assert!(check(&h, None).is_empty(), "only a flash sale is checked");
    }

    #[test]
    fn two_buyers_selling_the_same_item_lose_an_update() {
        // Both read 2 and wrote 1: two orders, one item gone from the stock.
        let h = history(10.0, vec![(1.0, 0, write(1)), (1.0, 0, Order), (2.0, 1, write(1)), (2.0, 1, Order)]);
        let found = check(&h, Some(2));
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].kind, FindingKind::LostUpdate);
        assert_eq!(found[0].detail, "1 left in stock, but 2 orders from 2 leave 0");
    }

    #[test]
    fn more_orders_than_stock_or_a_negative_stock_is_an_oversell() {
        let h = history(10.0, vec![(1.0, 0, write(0)), (1.0, 0, Order), (2.0, 1, write(0)), (2.0, 1, Order)]);
        let kinds: Vec<FindingKind> = check(&h, Some(1)).into_iter().map(|f| f.kind).collect();
        assert_eq!(kinds, vec![FindingKind::Oversell, FindingKind::LostUpdate]);
        let h = history(10.0, vec![(1.0, 0, write(-1)), (1.0, 0, Order)]);
        let found = check(&h, Some(0));
        assert!(found.iter().any(|f| f.detail == "the stock went below zero, to -1"));
    }
}
