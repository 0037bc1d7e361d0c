//! The flash sale's ceiling, `sql.conditional-update`: no lock. One
//! `UPDATE stock SET n = n - 1 WHERE n > 0` is the whole purchase, and the database's row lock does the
//! rest (the workload's [`Guard::ConditionalUpdate`] runs it).

use crate::{Guard, RecipeSpec};

pub const RECIPE: RecipeSpec = RecipeSpec {
    id: "sql.conditional-update",
    family: &super::FAMILY,
    summary: "no lock: one conditional UPDATE (n = n - 1 WHERE n > 0) is the whole critical section",
    source: "the flash-sale fix: let the database decide (a conditional UPDATE)",
    params: &[],
    offers_token: false,
    offers_shared: false,
    guard: Guard::ConditionalUpdate,
    promises_fifo: false,
    points: &[],
    validate: super::pooler_settings,
    build: crate::baseline::no_lock,
};
