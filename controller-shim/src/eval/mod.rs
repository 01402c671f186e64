//! The evaluation: what it takes in and hands on (`input.rs`), the task
//! that owns the index and the engine state (`task.rs`; what it publishes
//! of each pod, `task/publishing.rs`, told as the core's
//! `verdict::present` says) and its metric families (`metrics.rs`).

pub mod input;
pub mod metrics;
mod task;

pub use input::{AdmissionQuery, EvaluationSnapshot, Input};
pub use task::{COALESCE, EvalTask, TICK, run};
