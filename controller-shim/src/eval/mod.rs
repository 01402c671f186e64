//! The evaluation: what it takes in and hands on (`input.rs`), the task
//! that owns the index and the engine state (`task.rs`), and what it
//! publishes of each pod (`publish.rs`).

pub mod input;
pub mod publish;
mod task;

pub use input::{AdmissionQuery, EvaluationSnapshot, Input};
pub use publish::{counts_of, event_message, has_series, mount_labels};
pub use task::{COALESCE, EvalTask, TICK, run};
